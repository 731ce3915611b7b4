"""EESP's pyramid in one Triton pass (``src/kernels/eesp/triton_kernel.py``) against the PyTorch
reference (``eesp_pyramid(..., impl="reference")``): output, BN running statistics, and the
gradients of the reduced input and of every parameter, in training (batch statistics) and
inference (running statistics). Without CUDA the kernels run in Triton's interpreter on CPU
tensors.

float32 tolerance: kernel and reference differ in summation order and in how BN's variance is
formed (E[f^2] - E[f]^2 from float64 partial sums here, Welford in PyTorch): 1e-5 relative.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from src.kernels.eesp import eesp_pyramid, pyramid_args, pyramid_path, pyramid_weight
from src.ops.eesp import EESP, EESPDownsampler

pytest.importorskip("triton")

from tests.helpers import own_running_statistics, randomise_norms, saved_bytes, tf32

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _args(unit: EESP, *, training: bool) -> dict:
    unit.train(training)
    return own_running_statistics(pyramid_args(unit, advance=False))


def _run(impl: str, unit: EESP, r: Tensor, args: dict) -> list[Tensor]:
    """:func:`eesp_pyramid` with ``impl``: output, running statistics after the call, and the
    gradients of r, the K kernels, BN's weight and bias and the PReLU slopes under the loss
    sum(output * probe)."""
    r = r.detach().requires_grad_()
    out = eesp_pyramid(r, pyramid_weight(unit), **args, impl=impl)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    leaves = [r, *(conv.weight for conv in unit.transform), unit.fuse_norm.weight,
              unit.fuse_norm.bias, unit.fuse_act.weight]  # fmt: skip
    return [out, args["running_mean"], args["running_var"],
            *torch.autograd.grad(out, leaves, probe)]  # fmt: skip


CASES = [
    # (C_in, C_out, stride, hff, H, W, channels-last input)
    (16, 16, 1, True, 7, 9, False),
    (8, 16, 2, True, 9, 6, True),
    (16, 16, 1, False, 5, 5, False),
    (16, 32, 2, True, 6, 7, False),
]


@pytest.mark.parametrize(("c_in", "c_out", "stride", "hff", "h", "w", "channels_last"), CASES,
                         ids=str)  # fmt: skip
def test_training_pass_matches_reference(
    kernel_device: torch.device,
    c_in: int,
    c_out: int,
    stride: int,
    hff: bool,
    h: int,
    w: int,
    channels_last: bool,
) -> None:
    torch.manual_seed(0)
    unit = randomise_norms(EESP(c_in, c_out, stride=stride, hff=hff)).to(kernel_device)
    r = torch.randn(2, c_out // 4, h, w, device=kernel_device)
    if channels_last:
        r = r.to(memory_format=torch.channels_last)
    got = _run("triton", unit, r, _args(unit, training=True))
    want = _run("reference", unit, r, _args(unit, training=True))
    assert got[0].shape == (2, c_out, -(-h // stride), -(-w // stride))
    assert got[0].is_contiguous(memory_format=torch.channels_last) == channels_last
    names = ["out", "running_mean", "running_var", "r", "w_0", "w_1", "w_2", "w_3"]
    names += ["gamma", "beta", "alpha"]
    for name, a, e in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, msg=name)


def test_training_pass_over_many_small_tiles(
    kernel_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiles of 16 output pixels (4 columns x 4 rows x 1 channel), so that the per-program partial
    sums and the edge masks of several row and channel blocks are exercised (in the interpreter
    one tile covers a test image otherwise)."""
    monkeypatch.setattr("src.kernels.triton.stencil.TILE_INTERPRETER", 16)
    monkeypatch.setattr("src.kernels.triton.stencil.TILE_GPU", 16)
    torch.manual_seed(0)
    unit = randomise_norms(EESP(8, 16, stride=2)).to(kernel_device)
    r = torch.randn(1, 4, 13, 7, device=kernel_device)
    got = _run("triton", unit, r, _args(unit, training=True))
    want = _run("reference", unit, r, _args(unit, training=True))
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_eesp_training_steps_match_the_eager_unit(
    kernel_device: torch.device, momentum: float | None
) -> None:
    """Two training steps of a whole EESP (fused: ``impl="triton"``) against the eager unit:
    output, every gradient, and BN's running statistics and batch count."""
    torch.manual_seed(0)
    fused = randomise_norms(EESP(16, 16, impl="triton")).to(kernel_device)
    ref = randomise_norms(EESP(16, 16, impl="reference")).to(kernel_device)
    for unit in (fused, ref):
        unit.fuse_norm.momentum = momentum
    ref.load_state_dict(fused.state_dict())
    for _ in range(2):
        x = torch.randn(3, 16, 6, 7, device=kernel_device)
        outs = [unit(x) for unit in (fused, ref)]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
        grads = [torch.autograd.grad(o.square().sum(), list(u.parameters())) for o, u in
                 zip(outs, (fused, ref), strict=True)]  # fmt: skip
        for a, e in zip(*grads, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(fused.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert int(fused.fuse_norm.num_batches_tracked) == 2


def test_inference_pass_matches_reference(kernel_device: torch.device) -> None:
    torch.manual_seed(0)
    unit = randomise_norms(EESP(8, 16, stride=2)).to(kernel_device).eval()
    r = torch.randn(2, 4, 7, 6, device=kernel_device)
    with torch.no_grad():
        weight, args = pyramid_weight(unit), _args(unit, training=False)
        got, want = (eesp_pyramid(r, weight, **args, impl=impl) for impl in ("triton", "reference"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_downsampler_inference_matches_the_eager_block(kernel_device: torch.device) -> None:
    """``impl`` other than "auto" also bypasses the CPU's folded C++ path: the fused Triton pass
    against the eager ops."""
    torch.manual_seed(0)
    fused = randomise_norms(EESPDownsampler(16, 32)).to(kernel_device).eval()
    ref = randomise_norms(EESPDownsampler(16, 32)).to(kernel_device).eval()
    ref.load_state_dict(fused.state_dict())
    fused.eesp.impl, ref.eesp.impl = "triton", "reference"
    x = torch.randn(2, 16, 8, 10, device=kernel_device)
    image = torch.randn(2, 3, 16, 20, device=kernel_device)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, image), ref(x, image), rtol=1e-5, atol=1e-5)


def test_inference_pass_refuses_autograd(kernel_device: torch.device) -> None:
    unit = EESP(16, 16).to(kernel_device)
    r = torch.randn(1, 4, 5, 5, device=kernel_device)
    with pytest.raises(RuntimeError, match="no backward with running statistics"):
        eesp_pyramid(r, pyramid_weight(unit), **_args(unit, training=False), impl="triton")
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        eesp_pyramid(
            r[:, :, :1, :1], pyramid_weight(unit), **_args(unit, training=True), impl="triton"
        )


def test_bfloat16_autocast_within_tolerance(kernel_device: torch.device) -> None:
    """Under bfloat16 autocast r and the kernels are rounded to bfloat16 (u = 2^-8), products
    accumulate in float32, BN and PReLU stay float32, the output is rounded once more: within a few
    u of float32 (max-norm); 10u for the output, 20u for the gradients, which also take a bfloat16
    output gradient through BN's backward and the convolutions' (observed: up to 1.3u and 7.3u;
    the eager ops under the same autocast: 0.9u and 6.7u)."""
    torch.manual_seed(0)
    unit = randomise_norms(EESP(16, 16)).to(kernel_device)
    r = torch.randn(2, 4, 6, 7, device=kernel_device)
    want = _run("triton", unit, r, _args(unit, training=True))
    with torch.autocast(kernel_device.type, dtype=torch.bfloat16):
        got = _run("triton", unit, r, _args(unit, training=True))
    assert got[0].dtype == torch.bfloat16
    u = 2.0**-8
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        a, e = a.detach().double(), e.detach().double()
        error = float((a - e).abs().max() / e.abs().max())
        assert error < (10 * u if i < 3 else 20 * u), (i, error)


def test_auto_path_times_both_and_touches_no_state(
    kernel_device: torch.device, fresh_choices
) -> None:
    torch.manual_seed(0)
    unit = randomise_norms(EESP(16, 16)).to(kernel_device)
    before = {k: v.clone() for k, v in unit.state_dict().items()}
    r = torch.randn(2, 4, 5, 6, device=kernel_device)
    calls: list[str] = []

    def timer(fn: Callable[[], object]) -> float:
        fn()
        calls.append("run")
        return {1: 1.0, 2: 2.0}[len(calls)]  # the first candidate ("fused") is faster

    assert pyramid_path(unit, r, timer) == "fused"
    assert pyramid_path(unit, r, timer) == "fused"  # kept: not timed again
    assert len(calls) == 2
    for name, value in unit.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in unit.parameters())


def test_fused_training_keeps_two_fewer_pyramid_outputs(kernel_device: torch.device) -> None:
    """The eager pyramid keeps BN's input and PReLU's input (K n channels each) for the backward;
    the fused one recomputes them from the reduced input, which both keep."""
    fused = EESP(16, 16, impl="triton").to(kernel_device)
    eager = EESP(16, 16, impl="reference").to(kernel_device)
    x = torch.randn(2, 16, 6, 7, device=kernel_device, requires_grad=True)
    saved = saved_bytes(eager, x) - saved_bytes(fused, x)
    planes = x.numel() * x.element_size()  # K n = 16 channels of the batch
    vectors = 6 * 16 * 4  # each keeps a few per-channel vectors besides
    assert abs(saved - 2 * planes) <= vectors


def test_fused_eesp_compiles_in_one_graph() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    unit = randomise_norms(EESP(16, 16, impl="triton")).to(DEVICE)
    ref = randomise_norms(EESP(16, 16, impl="triton")).to(DEVICE)
    ref.load_state_dict(unit.state_dict())
    x = torch.randn(2, 16, 5, 6, device=DEVICE, requires_grad=True)
    compiled = torch.compile(unit, backend="aot_eager", fullgraph=True)
    # TF32 off on CUDA: compiled, the pyramid runs cuDNN's convolutions, eagerly the fused pass
    with tf32(False):
        outs = [compiled(x), ref(x)]
        grads = [torch.autograd.grad(o.sum(), [x, *m.parameters()]) for o, m in
                 zip(outs, (unit, ref), strict=True)]  # fmt: skip
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    # the gradients are sums over the batch's pixels, which cuDNN's backward and the fused one's
    # float32 atomics add in other orders: on an H200 1.4e-5 apart at 0.085
    tolerance = 1e-4 if x.is_cuda else 1e-5
    for a, e in zip(*grads, strict=True):
        torch.testing.assert_close(a, e, rtol=tolerance, atol=tolerance)
    torch._dynamo.reset()
