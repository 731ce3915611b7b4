"""DimConv and DimFuse's local fusion in one Triton pass (``src/kernels/dim_fuse/triton_kernel.py``)
against the PyTorch reference (``local_fusion_reference``): output, BN running statistics, and the
gradients of the input and of every parameter, in training (batch statistics) and inference
(running statistics, second BN and PReLU folded in). Without CUDA the kernels run in Triton's
interpreter on CPU tensors.

float32 tolerance: kernel and reference differ in summation order and in how BN's variance is
formed (E[h^2] - E[h]^2 from float64 partials here, Welford in PyTorch), 1e-5 relative on values of
order 1-30.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from src.kernels.dice import conv_weights, local_fusion_args, local_fusion_path
from src.kernels.dim_fuse import local_fusion_reference
from src.ops.dice import DiCE

pytest.importorskip("triton")

from src.kernels.dim_fuse.triton_kernel import local_fusion_triton
from tests.helpers import own_running_statistics, randomise_norms, saved_bytes

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _args(unit: DiCE, *, training: bool) -> dict:
    unit.train(training)
    return own_running_statistics(local_fusion_args(unit, advance=False))


def _leaves(unit: DiCE) -> list[Tensor]:
    fuse = unit.dim_fuse
    return [
        *conv_weights(unit), fuse.norm.weight, fuse.norm.bias, fuse.act.weight,
        fuse.local[0].weight,
    ]  # fmt: skip


def _run(fn: Callable[..., Tensor], unit: DiCE, x: Tensor, args: dict) -> list[Tensor]:
    """Output, running statistics after the call, and the gradients of x and the parameters under
    the loss sum(output * probe)."""
    x = x.detach().requires_grad_()
    out = fn(x, conv_weights(unit), **args)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    grads = torch.autograd.grad(out, [x, *_leaves(unit)], probe)
    return [out, args["running_mean"], args["running_var"], *grads]


CASES = [
    # (B, C, H, W), kernel size, dilation, channels-last input
    ((2, 8, 6, 7), 3, (1, 1, 1), False),
    ((3, 5, 4, 9), 5, (1, 2, 1), False),
    ((2, 6, 5, 5), 3, (2, 1, 2), True),
]


@pytest.mark.parametrize(("shape", "k", "dilation", "channels_last"), CASES, ids=str)
def test_training_pass_matches_reference(
    kernel_device: torch.device,
    shape: tuple[int, ...],
    k: int,
    dilation: tuple[int, int, int],
    channels_last: bool,
) -> None:
    torch.manual_seed(0)
    b, c, h, w = shape
    unit = randomise_norms(DiCE(c, c, h, w, kernel_size=k, dilation=dilation)).to(kernel_device)
    x = torch.randn(shape, device=kernel_device)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    got = _run(local_fusion_triton, unit, x, _args(unit, training=True))
    want = _run(local_fusion_reference, unit, x, _args(unit, training=True))
    assert got[0].shape == (b, c, h, w)
    assert got[0].is_contiguous(memory_format=torch.channels_last) == channels_last
    assert got[3].is_contiguous(memory_format=torch.channels_last) == channels_last  # grad of x
    names = ["out", "running_mean", "running_var", "x", "w_c", "w_h", "w_w"]
    names += ["gamma", "beta", "alpha", "w_local"]
    for name, a, e in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, msg=name)


def test_training_pass_over_many_small_tiles(
    kernel_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiles of 32 pixels (16 columns x 2 rows x 1 channel), so that the per-program partial sums
    and the edge masks of several row and channel blocks are exercised (in the interpreter one tile
    covers a test image otherwise)."""
    monkeypatch.setattr("src.kernels.triton.stencil.TILE_INTERPRETER", 32)
    monkeypatch.setattr("src.kernels.triton.stencil.TILE_GPU", 32)
    torch.manual_seed(0)
    unit = randomise_norms(DiCE(4, 4, 5, 9)).to(kernel_device)
    x = torch.randn(1, 4, 5, 9, device=kernel_device)
    got = _run(local_fusion_triton, unit, x, _args(unit, training=True))
    want = _run(local_fusion_reference, unit, x, _args(unit, training=True))
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5)


def test_inference_pass_folds_the_second_norm(kernel_device: torch.device) -> None:
    torch.manual_seed(0)
    unit = randomise_norms(DiCE(8, 8, 6, 7)).to(kernel_device).eval()
    x = torch.randn(2, 8, 6, 7, device=kernel_device)
    with torch.no_grad():
        got = local_fusion_triton(x, conv_weights(unit), **_args(unit, training=False))
        want = local_fusion_reference(x, conv_weights(unit), **_args(unit, training=False))
        # the unit's own eager local fusion: BN, PReLU, grouped conv, BN, PReLU
        fuse = unit.dim_fuse
        eager = fuse.local(fuse.act(fuse.norm(unit.dim_conv(x))))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_dice_training_steps_match_the_unfused_unit(
    kernel_device: torch.device, momentum: float | None
) -> None:
    """Two training steps of a whole DiCE (fused: ``impl="triton"``) against the reference unit:
    output, every gradient, and BN's running statistics and batch count."""
    torch.manual_seed(0)
    fused = randomise_norms(DiCE(6, 8, 5, 7, impl="triton")).to(kernel_device)
    ref = randomise_norms(DiCE(6, 8, 5, 7, impl="reference")).to(kernel_device)
    for unit in (fused, ref):
        unit.dim_fuse.norm.momentum = momentum
    ref.load_state_dict(fused.state_dict())
    for _ in range(2):
        x = torch.randn(3, 6, 5, 7, device=kernel_device)
        outs = [unit(x) for unit in (fused, ref)]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
        grads = [torch.autograd.grad(o.square().sum(), list(u.parameters())) for o, u in
                 zip(outs, (fused, ref), strict=True)]  # fmt: skip
        for a, e in zip(*grads, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(fused.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert int(fused.dim_fuse.norm.num_batches_tracked) == 2


def test_dice_inference_matches_the_unfused_unit(kernel_device: torch.device) -> None:
    torch.manual_seed(0)
    fused = randomise_norms(DiCE(6, 6, 5, 7, impl="triton")).to(kernel_device).eval()
    ref = randomise_norms(DiCE(6, 6, 5, 7, impl="reference")).to(kernel_device).eval()
    ref.load_state_dict(fused.state_dict())
    x = torch.randn(2, 6, 5, 7, device=kernel_device)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)
    # eval with autograd on (frozen-BN fine-tuning): the unfused kernels, still differentiable
    x.requires_grad_()
    (grad,) = torch.autograd.grad(fused(x).sum(), x)
    (want,) = torch.autograd.grad(ref(x).sum(), x)
    torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-4)


def test_inference_pass_refuses_autograd(kernel_device: torch.device) -> None:
    unit = DiCE(4, 4, 4, 4).to(kernel_device).eval()
    x = torch.randn(1, 4, 4, 4, device=kernel_device)
    with pytest.raises(RuntimeError, match="no backward with running statistics"):
        local_fusion_triton(x, conv_weights(unit), **_args(unit, training=False))
    # any trainable operand counts, the local weights alone too
    unit.requires_grad_(False)
    unit.dim_fuse.local[0].weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match="no backward with running statistics"):
        local_fusion_triton(x, conv_weights(unit), **_args(unit, training=False))


def test_training_pass_needs_two_values_per_channel(kernel_device: torch.device) -> None:
    unit = DiCE(4, 4, 1, 1).to(kernel_device)
    x = torch.randn(1, 4, 1, 1, device=kernel_device)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        local_fusion_triton(x, conv_weights(unit), **_args(unit, training=True))


def test_bfloat16_autocast_within_tolerance(kernel_device: torch.device) -> None:
    """Under bfloat16 autocast x and the DimConv kernels are rounded to bfloat16 (u = 2^-8), the
    products accumulate in float32 and BN, PReLU and the local weights stay float32; the output is
    rounded once more. BN divides by the batch std, which does not grow the relative error, so the
    output is within 3u + u of float32, the gradients (which also pass a bfloat16 output gradient
    through BN's backward and DimConv's) within 8u; 10u and 20u leave room for the max-norm
    (observed: up to 1.1u for the output, 2.1u for the gradients)."""
    torch.manual_seed(0)
    unit = randomise_norms(DiCE(8, 8, 6, 7)).to(kernel_device)
    x = torch.randn(2, 8, 6, 7, device=kernel_device)
    want = _run(local_fusion_triton, unit, x, _args(unit, training=True))
    with torch.autocast(kernel_device.type, dtype=torch.bfloat16):
        got = _run(local_fusion_triton, unit, x, _args(unit, training=True))
    assert got[0].dtype == torch.bfloat16
    assert all(g.dtype == torch.float32 for g in got[4:])
    u = 2.0**-8
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        a, e = a.detach().double(), e.detach().double()
        error = float((a - e).abs().max() / e.abs().max())
        assert error < (10 * u if i < 3 else 20 * u), (i, error)


def test_auto_path_times_both_and_touches_no_state(
    kernel_device: torch.device, fresh_choices
) -> None:
    """``local_fusion_path`` times "fused" and "unfused" once per key (here with a fake timer that
    runs each candidate) and leaves the running statistics, batch count and gradients alone."""
    torch.manual_seed(0)
    unit = randomise_norms(DiCE(6, 6, 5, 7)).to(kernel_device)
    before = {k: v.clone() for k, v in unit.state_dict().items()}
    x = torch.randn(2, 6, 5, 7, device=kernel_device)
    calls: list[str] = []

    def timer(fn: Callable[[], object]) -> float:
        fn()
        calls.append("run")
        return {1: 2.0, 2: 1.0}[len(calls)]  # the second candidate ("unfused") is faster

    assert local_fusion_path(unit, x, timer) == "unfused"
    assert local_fusion_path(unit, x, timer) == "unfused"  # kept: not timed again
    assert len(calls) == 2
    for name, value in unit.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in unit.parameters())


def test_fused_dice_compiles_in_one_graph() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    unit = randomise_norms(DiCE(4, 4, 5, 6, impl="triton")).to(DEVICE)
    ref = randomise_norms(DiCE(4, 4, 5, 6, impl="triton")).to(DEVICE)
    ref.load_state_dict(unit.state_dict())
    x = torch.randn(2, 4, 5, 6, device=DEVICE, requires_grad=True)
    compiled = torch.compile(unit, backend="aot_eager", fullgraph=True)
    outs = [compiled(x), ref(x)]
    grads = [torch.autograd.grad(o.sum(), [x, *m.parameters()]) for o, m in
             zip(outs, (unit, ref), strict=True)]  # fmt: skip
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    for a, e in zip(*grads, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(unit.dim_fuse.norm.running_var, ref.dim_fuse.norm.running_var)
    torch._dynamo.reset()


def test_fused_training_keeps_nine_fewer_channel_planes(kernel_device: torch.device) -> None:
    """The unfused unit keeps DimConv's output, BN's and PReLU's (3C channels each) for the
    backward; the fused one keeps none of them (it recomputes them from x, which both keep)."""
    fused = DiCE(8, 8, 6, 7, impl="triton").to(kernel_device)
    unfused = DiCE(8, 8, 6, 7, impl="triton").to(kernel_device)
    unfused.local_fusion = False
    x = torch.randn(2, 8, 6, 7, device=kernel_device, requires_grad=True)
    saved = saved_bytes(unfused, x) - saved_bytes(fused, x)
    planes = x.numel() * x.element_size()  # C channels of the batch
    # besides, each keeps a few per-channel vectors of 3C floats (BN's statistics, weights)
    vectors = 4 * (3 * 8) * 4
    assert abs(saved - 9 * planes) <= vectors
