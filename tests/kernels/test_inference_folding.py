from __future__ import annotations

import pytest
import torch
from torch import nn

import src.kernels.dice
from src.kernels.inference_folding import ConvBNPReLU, batch_norm_affine, folded_inference
from src.ops.dice import DiCE, DiCEShuffleUnit, StridedDiCE
from src.ops.eesp import EESP, EESPDownsampler
from tests.helpers import (
    KIND_FAULTS,
    SHAPE_FAULTS,
    assert_rejected,
    require_cpu_kernels,
    use_inference_path,
)


@pytest.fixture(params=["kernel", "eager"])
def dice_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Folded inference through the fused C++ kernels, or through eager PyTorch calls."""
    use_inference_path(request.param, monkeypatch)
    return request.param


def randomise_norms(module: nn.Module) -> nn.Module:
    """Non-trivial BN statistics and affine parameters, and PReLU slopes of both signs."""
    generator = torch.Generator().manual_seed(0)
    for child in module.modules():
        if isinstance(child, nn.BatchNorm2d):
            n = child.num_features
            child.running_mean.copy_(torch.rand(n, generator=generator) - 0.5)
            child.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
            child.weight.data.copy_(torch.rand(n, generator=generator) + 0.5)
            child.bias.data.copy_(torch.rand(n, generator=generator) - 0.5)
        elif isinstance(child, nn.PReLU):
            child.weight.data.copy_(torch.rand(child.weight.shape, generator=generator) - 0.5)
    return module.eval()


def reference_and_folded(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain eval forward (autograd on) and the folded one (autograd off)."""
    with torch.enable_grad():
        reference = module(x).detach()
    with torch.no_grad():
        folded = module(x)
    return reference, folded


def test_batch_norm_affine_equals_eval_batch_norm() -> None:
    bn = randomise_norms(nn.BatchNorm2d(5))
    x = torch.randn(2, 5, 3, 3)
    scale, shift = batch_norm_affine(bn)
    torch.testing.assert_close(x * scale[:, None, None] + shift[:, None, None], bn(x))


@pytest.mark.parametrize(
    ("c_in", "c_out", "kernel_size", "stride", "groups"),
    [(6, 10, 1, 1, 1), (8, 8, 3, 2, 8), (6, 4, 3, 1, 2), (4, 6, 1, 2, 1), (8, 12, 1, 1, 4)],
)
def test_conv_bn_prelu_folded_equals_reference(
    c_in: int, c_out: int, kernel_size: int, stride: int, groups: int
) -> None:
    block = randomise_norms(ConvBNPReLU(c_in, c_out, kernel_size, stride=stride, groups=groups))
    for batch in (1, 3):
        reference, folded = reference_and_folded(block, torch.randn(batch, c_in, 7, 9))
        assert folded.shape == reference.shape
        torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)


def test_folded_tensors_follow_parameter_updates() -> None:
    block = randomise_norms(ConvBNPReLU(4, 4, 1))
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        before = block(x)
        block[0].weight.mul_(2.0)  # an in-place update, as an optimizer step makes
        block[1].running_mean.add_(1.0)
        after = block(x)
    reference, _ = reference_and_folded(block, x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, reference, rtol=1e-5, atol=1e-5)


def test_folding_only_in_cpu_inference() -> None:
    block = ConvBNPReLU(4, 4, 1)
    x = torch.randn(1, 4, 2, 2)
    assert not folded_inference(block, x)  # training mode
    block.eval()
    assert not folded_inference(block, x)  # autograd on
    with torch.no_grad():
        assert folded_inference(block, x)
    with torch.inference_mode():
        assert folded_inference(block, x)


@pytest.mark.parametrize(
    ("channels", "out_channels", "height", "width", "kernel_size", "dilation"),
    [
        (8, 8, 6, 6, 3, (1, 1, 1)),
        (5, 5, 4, 9, 3, (1, 1, 1)),  # non-square build size, C // 4 = 1
        (6, 6, 7, 5, 5, (2, 1, 3)),  # larger kernel, per-branch dilation
        (7, 7, 3, 3, 3, (1, 3, 2)),  # dilated reach beyond the map and the channels
    ],
)
def test_dice_folded_equals_reference(
    dice_path: str,
    channels: int,
    out_channels: int,
    height: int,
    width: int,
    kernel_size: int,
    dilation: tuple[int, int, int],
) -> None:
    dice = randomise_norms(
        DiCE(channels, out_channels, height, width, kernel_size=kernel_size, dilation=dilation)
    )
    for batch in (1, 3):
        x = torch.randn(batch, channels, height, width)
        reference, folded = reference_and_folded(dice, x)
        torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)


def test_dice_folded_with_out_channels_is_the_eager_path(dice_path: str) -> None:
    # C_out != C: the global fusion is a grouped, not a depth-wise, convolution
    dice = randomise_norms(DiCE(8, 12, 5, 7))
    if dice_path == "kernel":
        assert not src.kernels.dice._kernel_applies(dice, torch.randn(1, 8, 5, 7))
        return
    for batch in (1, 3):
        reference, folded = reference_and_folded(dice, torch.randn(batch, 8, 5, 7))
        torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)


def test_dice_folded_path_is_taken_and_off_the_build_size(dice_path: str) -> None:
    dice = randomise_norms(DiCE(8, 8, 6, 6))
    calls = []
    dice.dim_fuse.register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        dice(torch.randn(2, 8, 6, 6))
        assert not calls  # folded: DimFuse's own forward is not run
        out = dice(torch.randn(2, 8, 9, 4))  # off the build size: resized branches
    assert out.shape == (2, 8, 9, 4)
    # the kernel covers any size; the eager folded path only the build size
    assert bool(calls) == (dice_path == "eager")


@pytest.mark.parametrize(
    ("height", "width", "size", "dilation"),
    [
        (6, 6, (9, 4), (1, 1, 1)),  # taller (interpolated), narrower (pooled)
        (5, 7, (3, 11), (1, 1, 1)),  # shorter, wider
        (4, 4, (4, 9), (1, 2, 1)),  # only the width-wise branch resized
        (6, 5, (1, 1), (2, 1, 3)),  # a single pixel, dilated
    ],
)
def test_dice_kernel_off_the_build_size_equals_reference(
    height: int, width: int, size: tuple[int, int], dilation: tuple[int, int, int]
) -> None:
    require_cpu_kernels()
    dice = randomise_norms(DiCE(8, 8, height, width, dilation=dilation))
    for batch in (1, 3):
        x = torch.randn(batch, 8, *size)
        reference, folded = reference_and_folded(dice, x)
        torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)


def test_dice_with_reference_impl_is_never_folded() -> None:
    dice = randomise_norms(DiCE(8, 8, 6, 6, impl="reference"))
    calls = []
    dice.dim_fuse.register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        dice(torch.randn(1, 8, 6, 6))
    assert calls


@pytest.mark.parametrize("unit", ["shuffle", "shuffle_widening", "strided"])
def test_units_folded_equal_reference(dice_path: str, unit: str) -> None:
    if unit == "strided":
        module, x = StridedDiCE(8, 5, 5), torch.randn(2, 8, 10, 10)
    elif unit == "shuffle":
        module, x = DiCEShuffleUnit(16, 16, 6, 6), torch.randn(2, 16, 6, 6)
    else:
        module, x = DiCEShuffleUnit(8, 16, 6, 6), torch.randn(2, 8, 6, 6)
    reference, folded = reference_and_folded(randomise_norms(module), x)
    torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)


def test_cpu_kernel_follows_parameter_updates_and_non_contiguous_input() -> None:
    require_cpu_kernels()
    dice = randomise_norms(DiCE(8, 8, 6, 6))
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        before = dice(x)
        dice.dim_conv.weight_height.mul_(-1.5)
        dice.dim_fuse.spatial[1].running_var.mul_(2.0)
        after = dice(x)
        # a channels-last input: the kernel reads a contiguous copy
        strided = dice(x.contiguous(memory_format=torch.channels_last))
    reference, _ = reference_and_folded(dice, x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(strided, reference, rtol=1e-5, atol=1e-5)


# the tensor arguments of the kernels, by position, in the order of their schemas
DICE_OPERANDS = {
    name: position
    for position, name in enumerate(
        ("x", "x_height", "x_width", "resize_height", "resize_width", "weight_channel",
         "weight_height", "weight_width", "per_channel", "weight_spatial", "gate_in", "gate_out")
    )
}  # fmt: skip
EESP_OPERANDS = {"x": 0, "weight": 1, "affine": 4}


def kernel_arguments(name: str, module: nn.Module, x: torch.Tensor) -> list:
    """The arguments ``module(x)`` passes to ``torch.ops.lightnets_cpu.<name>`` in CPU inference."""
    kernel = getattr(torch.ops.lightnets_cpu, name)
    calls = []

    def record(*args: object) -> torch.Tensor:
        calls.append(list(args))
        return kernel(*args)

    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(torch.ops.lightnets_cpu, name, record)
        module(x)
    (args,) = calls
    return args


@pytest.fixture(scope="module", params=["build_size", "off_build_size"])
def dice_arguments(request: pytest.FixtureRequest) -> list:
    """dice_forward's arguments for a DiCE unit at its build size (x_height and x_width are x) and
    off it (three distinct inputs, resize matrices in use)."""
    require_cpu_kernels()
    size = (6, 6) if request.param == "build_size" else (5, 7)
    dice = randomise_norms(DiCE(8, 8, 6, 6, dilation=(1, 2, 1)))
    return kernel_arguments("dice_forward", dice, torch.randn(2, 8, *size))


@pytest.fixture(scope="module", params=[1, 2], ids=["stride1", "stride2"])
def eesp_arguments(request: pytest.FixtureRequest) -> list:
    require_cpu_kernels()
    eesp = randomise_norms(EESP(8, 16, stride=request.param, branches=4, r_lim=9))
    return kernel_arguments("eesp_pyramid", eesp, torch.randn(2, 8, 7, 9))


@pytest.mark.parametrize("fault", [*SHAPE_FAULTS, *KIND_FAULTS])
@pytest.mark.parametrize("name", list(DICE_OPERANDS))
def test_dice_kernel_rejects_a_faulty_operand(dice_arguments: list, name: str, fault: str) -> None:
    position = DICE_OPERANDS[name]
    # every size of every operand is fixed by another operand's
    fixed = tuple(range(dice_arguments[position].dim()))
    assert_rejected("dice_forward", dice_arguments, name, position, fault, fixed)


@pytest.mark.parametrize("fault", [*SHAPE_FAULTS, *KIND_FAULTS])
@pytest.mark.parametrize("name", list(EESP_OPERANDS))
def test_eesp_kernel_rejects_a_faulty_operand(eesp_arguments: list, name: str, fault: str) -> None:
    position = EESP_OPERANDS[name]
    # any batch and map size: x's channels alone are fixed (by the weights)
    fixed = (1,) if name == "x" else tuple(range(eesp_arguments[position].dim()))
    assert_rejected("eesp_pyramid", eesp_arguments, name, position, fault, fixed)


@pytest.mark.parametrize(
    ("position", "value", "match"),
    [
        (12, 4, "kernel_size must be odd"),
        (12, 5, "weight_channel has shape"),  # odd, but not the kernel the weights were folded for
        (13, 0, "dilations must be positive"),
        (15, -1, "dilations must be positive"),
        (14, 1 << 20, "reaches past 65536 pixels"),
        (14, 3, "weight_height has shape"),  # another padded width
    ],
)
def test_dice_kernel_rejects_bad_sizes(
    dice_arguments: list, position: int, value: int, match: str
) -> None:
    call = list(dice_arguments)
    call[position] = value
    with torch.no_grad(), pytest.raises(RuntimeError, match=match):
        torch.ops.lightnets_cpu.dice_forward(*call)


@pytest.mark.parametrize(
    ("position", "value", "match"),
    [
        (2, [], "at least one branch"),
        (2, [1, 0, 2, 3], r"must be in \[1, 65536\]"),
        (2, [1, 1 << 20, 2, 3], r"must be in \[1, 65536\]"),
        (2, [1, 2, 3], "weight has shape"),  # three branches for four branches' weights
        (3, 3, "stride must be 1 or 2"),
    ],
)
def test_eesp_kernel_rejects_bad_sizes(
    eesp_arguments: list, position: int, value: object, match: str
) -> None:
    call = list(eesp_arguments)
    call[position] = value
    with torch.no_grad(), pytest.raises(RuntimeError, match=match):
        torch.ops.lightnets_cpu.eesp_pyramid(*call)


def test_cpu_kernel_attribute_opts_a_unit_out(monkeypatch: pytest.MonkeyPatch) -> None:
    dice = randomise_norms(DiCE(8, 8, 6, 6))
    x = torch.randn(1, 8, 6, 6)
    dice.cpu_kernel = False
    monkeypatch.setattr(src.kernels.dice, "kernel_forward", _never)
    with torch.no_grad():
        folded = dice(x)
    reference, _ = reference_and_folded(dice, x)
    torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)


def _never(self: DiCE, x: torch.Tensor) -> torch.Tensor:
    raise AssertionError("the fused kernel ran for a unit with cpu_kernel = False")


@pytest.mark.parametrize(
    ("c_in", "c_out", "stride", "branches", "r_lim", "down_method", "hff", "size"),
    [
        (8, 16, 1, 4, 7, "esp", True, (9, 9)),  # dilations (1, 1, 2, 3): r_lim clips one
        (16, 16, 1, 4, 11, "esp", True, (6, 10)),  # residual; dilation 4 reaches past the map
        (8, 16, 2, 4, 9, "avg", True, (9, 7)),  # strided, odd sizes, returns after the merge
        (8, 16, 2, 4, 5, "esp", False, (8, 8)),  # strided with PReLU, no HFF
        (6, 12, 1, 2, 7, "esp", False, (5, 5)),  # two branches, no HFF
    ],
)
def test_eesp_folded_equals_reference(
    dice_path: str,
    c_in: int,
    c_out: int,
    stride: int,
    branches: int,
    r_lim: int,
    down_method: str,
    hff: bool,
    size: tuple[int, int],
) -> None:
    eesp = randomise_norms(
        EESP(
            c_in,
            c_out,
            stride=stride,
            branches=branches,
            r_lim=r_lim,
            down_method=down_method,
            hff=hff,
        )
    )
    for batch in (1, 3):
        reference, folded = reference_and_folded(eesp, torch.randn(batch, c_in, *size))
        assert folded.shape == reference.shape
        torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)


def test_eesp_downsampler_folded_equals_reference(dice_path: str) -> None:
    block = randomise_norms(EESPDownsampler(8, 24, branches=4, r_lim=9, image_channels=3))

    class WithImage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(
                x, torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(1))
            )

    reference, folded = reference_and_folded(WithImage().eval(), torch.randn(2, 8, 20, 20))
    assert folded.shape == (2, 24, 10, 10)
    torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)


def test_eesp_kernel_attribute_opts_a_unit_out(monkeypatch: pytest.MonkeyPatch) -> None:
    eesp = randomise_norms(EESP(8, 16))
    eesp.cpu_kernel = False
    monkeypatch.setattr(torch.ops.lightnets_cpu, "eesp_pyramid", _never, raising=False)
    x = torch.randn(1, 8, 6, 6)
    reference, folded = reference_and_folded(eesp, x)
    torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)
