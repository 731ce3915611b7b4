"""DimFuse's local-fusion convolution on the CPU kernels
(``src/kernels/local_fusion_conv/__init__.py``,
``src/kernels/local_fusion_conv/local_fusion_convolution.cpp``) against ``F.conv2d`` and a float64
oracle.

Tolerances: the input gradient is one product per element, ``w * g`` rounded once, so it equals
the oracle rounded to the operands' dtype bit for bit. The output sums K products in float32
(within 4 float32 ulps of the oracle's magnitude-sum, 1e-6 relative) and rounds once to the
output dtype (one bfloat16/float16 rounding, 2^-8 / 2^-11 relative). The weight gradient is a
float32 sum over every row: within 1e-5 relative of the oracle for float32 operands, and within a
bfloat16 rounding of the result for 16-bit ones, whose gradient is rounded to their dtype.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import src.kernels.local_fusion_conv
from src.kernels.local_fusion_conv import LocalFusionConv, local_fusion_conv
from src.ops.dim_fuse import DimFuse
from src.utils.complexity import measure
from tests.helpers import (
    KIND_FAULTS,
    SHAPE_FAULTS,
    assert_rejected,
    recording_backend,
    require_cpu_kernels,
)

KERNEL = "LocalFusionConvFunctionBackward"
ATEN = "ConvolutionBackward0"
# relative bounds of one rounding to each dtype
ROUNDING = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


@pytest.fixture
def kernels() -> None:
    require_cpu_kernels()


# (batch, channels C, fan-in K, height, width)
SHAPES = [
    (2, 6, 3, 5, 7),  # DiCE's fan-in
    (3, 5, 1, 4, 4),  # one input per output: a per-channel scale
    (2, 4, 2, 3, 6),
    (20, 7, 3, 4, 4),  # 320 rows: more than the kernel's 64 row blocks
]


def _operands(shape: tuple[int, ...], dtype: torch.dtype, grad_channels_last: bool = True):
    batch, channels, fan_in, height, width = shape
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(batch, channels * fan_in, height, width, generator=gen)
    weight = torch.randn(channels, fan_in, 1, 1, generator=gen)
    probe = torch.randn(batch, channels, height, width, generator=gen)
    x = x.to(dtype, memory_format=torch.channels_last)
    probe = probe.to(dtype, memory_format=torch.channels_last if grad_channels_last else None)
    return x, weight.to(dtype), probe


def _grads(fn, x: Tensor, weight: Tensor, probe: Tensor) -> tuple:
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    y = fn(x, weight)
    return (y, *torch.autograd.grad(y, (x, weight), probe), type(y.grad_fn).__name__)


def _conv(x: Tensor, weight: Tensor) -> Tensor:
    return F.conv2d(x, weight, groups=weight.shape[0])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("grad_channels_last", [True, False], ids=["grad_cl", "grad_contig"])
def test_matches_float64_oracle(
    kernels: None, shape: tuple, dtype: torch.dtype, grad_channels_last: bool
) -> None:
    x, weight, probe = _operands(shape, dtype, grad_channels_last)
    y, grad_x, grad_w, node = _grads(local_fusion_conv, x, weight, probe)
    assert node == KERNEL
    assert y.dtype == grad_x.dtype == grad_w.dtype == dtype
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert grad_x.is_contiguous(memory_format=torch.channels_last)
    want_y, want_x, want_w, _ = _grads(_conv, x.double(), weight.double(), probe.double())
    # the output: K products summed in float32, then one rounding to dtype
    magnitude = _conv(x.double().abs(), weight.double().abs())
    bound = 4 * 2.0**-23 * magnitude + ROUNDING[dtype] * want_y.abs()
    assert ((y.double() - want_y).abs() <= bound).all()
    # the input gradient: one product per element, rounded once
    assert torch.equal(grad_x, want_x.to(dtype))
    if dtype == torch.float32:
        torch.testing.assert_close(grad_w.double(), want_w, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(grad_w.double(), want_w, rtol=2.0**-8, atol=1e-3)


def test_matches_f_conv2d(kernels: None) -> None:
    x, weight, probe = _operands(SHAPES[0], torch.float32)
    ours = _grads(local_fusion_conv, x, weight, probe)
    theirs = _grads(_conv, x, weight, probe)
    assert theirs[3] == ATEN
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(ours[1], theirs[1])
    torch.testing.assert_close(ours[2], theirs[2], rtol=1e-5, atol=1e-5)


def test_weight_gradient_does_not_depend_on_the_thread_count(kernels: None) -> None:
    x, weight, probe = _operands((20, 7, 3, 8, 8), torch.float32)
    threads = torch.get_num_threads()
    try:
        grads = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            grads.append(_grads(local_fusion_conv, x, weight, probe)[2])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(grads[0], g) for g in grads[1:])


@pytest.mark.parametrize("wanted", ["x", "weight"])
def test_gradient_of_one_operand_alone(kernels: None, wanted: str) -> None:
    x, weight, probe = _operands(SHAPES[0], torch.float32)
    both = _grads(local_fusion_conv, x, weight, probe)
    x.requires_grad_(wanted == "x")
    weight.requires_grad_(wanted == "weight")
    y = local_fusion_conv(x, weight)
    (grad,) = torch.autograd.grad(y, x if wanted == "x" else weight, probe)
    assert torch.equal(grad, both[1] if wanted == "x" else both[2])


def test_autocast_casts_like_f_conv2d_and_keeps_a_float32_weight_gradient(kernels: None) -> None:
    x, weight, probe = _operands(SHAPES[0], torch.float32)
    with torch.autocast("cpu", torch.bfloat16):
        ours = _grads(local_fusion_conv, x, weight, probe)
        theirs = _grads(_conv, x, weight, probe)
    assert ours[3] == KERNEL
    assert ours[0].dtype == theirs[0].dtype == torch.bfloat16
    assert ours[1].dtype == ours[2].dtype == torch.float32
    torch.testing.assert_close(ours[0], theirs[0], rtol=2.0**-7, atol=1e-2)
    torch.testing.assert_close(ours[1], theirs[1], rtol=2.0**-7, atol=1e-2)
    torch.testing.assert_close(ours[2], theirs[2], rtol=2.0**-7, atol=1e-1)


def test_without_autograd_the_forward_kernel_runs(kernels: None) -> None:
    x, weight, _ = _operands(SHAPES[0], torch.float32)
    with torch.no_grad():
        y = local_fusion_conv(x, weight.requires_grad_())
    assert y.grad_fn is None and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, _conv(x, weight).detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "case", ["contiguous", "float64", "no_kernels", "not_1x1", "fan_in_mismatch", "mixed_dtypes"]
)
def test_f_conv2d_runs_where_the_kernel_does_not_apply(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, weight, _ = _operands(SHAPES[0], torch.float32)
    if case == "contiguous":
        x = x.contiguous()
    elif case == "float64":
        x, weight = x.double(), weight.double()
    elif case == "no_kernels":
        monkeypatch.setattr(src.kernels.local_fusion_conv, "cpu_kernels_loaded", lambda: False)
    elif case == "not_1x1":  # F.conv2d's own map
        weight = torch.randn(6, 3, 3, 3)
    if case in ("fan_in_mismatch", "mixed_dtypes"):  # refused as F.conv2d refuses them
        bad = (x, weight[:, :2]) if case == "fan_in_mismatch" else (x.bfloat16(), weight)
        with pytest.raises(RuntimeError, match="channels|type"):
            local_fusion_conv(bad[0].requires_grad_(), bad[1])
        return
    x.requires_grad_()
    y = local_fusion_conv(x, weight)
    assert type(y.grad_fn).__name__ == ATEN
    assert torch.equal(y, _conv(x, weight))


FORWARD_OPERANDS = {"x": 0, "weight": 1}
BACKWARD_OPERANDS = {"grad_y": 0, "x": 1, "weight": 2}


def _faults(operands: dict, forward: bool) -> list[tuple[str, str]]:
    return [
        (n, f)
        for n in operands
        for f in (*SHAPE_FAULTS, *KIND_FAULTS)
        # x may be 16-bit (the others must then follow it); a (K, C) weight is another valid
        # grouping of x's channels, refused only where grad_y fixes C
        if (n, f) != ("x", "bfloat16") and not (forward and (n, f) == ("weight", "reshaped"))
    ]


@pytest.mark.parametrize(("name", "fault"), _faults(FORWARD_OPERANDS, True))
def test_forward_kernel_rejects_a_faulty_operand(kernels: None, name: str, fault: str) -> None:
    torch.manual_seed(0)
    args = [torch.randn(12, 15), torch.randn(5, 3)]
    # x's rows are free, its channels fixed by the weight; the weight's sizes by x's channels
    fixed = (1,) if name == "x" else (0, 1)
    assert_rejected("local_fusion_convolution", args, name, FORWARD_OPERANDS[name], fault, fixed)


@pytest.mark.parametrize(("name", "fault"), _faults(BACKWARD_OPERANDS, False))
def test_backward_kernel_rejects_a_faulty_operand(kernels: None, name: str, fault: str) -> None:
    torch.manual_seed(0)
    args = [torch.randn(12, 5), torch.randn(12, 15), torch.randn(5, 3), True, True]
    assert_rejected(
        "local_fusion_convolution_backward", args, name, BACKWARD_OPERANDS[name], fault, (0, 1)
    )


def test_module_is_a_drop_in_grouped_conv2d() -> None:
    torch.manual_seed(0)
    ours = LocalFusionConv(6)
    torch.manual_seed(0)
    theirs = nn.Conv2d(18, 6, 1, groups=6, bias=False)
    assert isinstance(ours, nn.Conv2d)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert torch.equal(ours.weight, theirs.weight)  # the same initialisation
    x = torch.randn(2, 18, 5, 5)
    assert torch.equal(ours(x), theirs(x))


def test_dim_fuse_trains_through_the_kernel(kernels: None) -> None:
    torch.manual_seed(0)
    fuse = DimFuse(8, 8).train()
    x = torch.randn(2, 24, 6, 6).to(memory_format=torch.channels_last)
    names = set()
    fuse.local[0].register_forward_hook(lambda m, i, y: names.add(type(y.grad_fn).__name__))
    fuse(x).sum().backward()
    assert names == {KERNEL}
    assert fuse.local[0].weight.grad is not None and fuse.local[0].weight.grad.abs().sum() > 0


def test_flop_counter_sees_the_convolution(kernels: None) -> None:
    torch.manual_seed(0)
    fuse = DimFuse(8, 8)
    x = torch.randn(2, 24, 6, 6)
    without_local = measure(fuse.spatial, torch.randn(2, 8, 6, 6)).macs
    without_local += measure(fuse.gate, torch.randn(2, 8, 6, 6)).macs
    for layout in (torch.contiguous_format, torch.channels_last):
        counted = measure(fuse, x.to(memory_format=layout))
        # the local fusion: 2 x 6 x 6 positions x 8 outputs x 3 inputs
        assert counted.macs == counted.macs_conv == without_local + 2 * 36 * 8 * 3


def test_compiled_step_traces_both_kernels_and_matches_eager_bitwise(kernels: None) -> None:
    backend, graphs = recording_backend()
    torch._dynamo.reset()
    x, weight, probe = _operands(SHAPES[0], torch.float32, grad_channels_last=False)
    eager = _grads(local_fusion_conv, x, weight, probe)
    compiled = _grads(
        torch.compile(local_fusion_conv, backend=backend, fullgraph=True), x, weight, probe
    )
    torch._dynamo.reset()
    assert len(graphs["forward"]) == len(graphs["backward"]) == 1
    assert "lightnets.local_fusion_convolution.default" in graphs["forward"][0]
    assert "lightnets.local_fusion_convolution_backward" in graphs["backward"][0]
    assert all(torch.equal(a, b) for a, b in zip(eager[:3], compiled[:3], strict=True))
