"""The post-norm residual ``LayerNorm(residual + dropout(branch))`` as one Triton kernel
(``src/kernels/residual_layer_norm/triton_kernel.py``) against the PyTorch ops, forward and
backward. Without CUDA the kernel runs in Triton's interpreter on CPU tensors.

float32 tolerance 1e-5 (of the largest value, for the parameter gradients, which sum over every
row): the two differ in summation order only.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from src.kernels.residual_layer_norm import auto_path, residual_layer_norm
from src.models.delight_block import DeLighTDecoderBlock
from tests.helpers import path_timer

pytest.importorskip("triton")

from src.kernels.residual_layer_norm.triton_kernel import residual_layer_norm_triton


def _reference(r: Tensor, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    total = r + x
    return F.layer_norm(total, (total.shape[-1],), w, b, eps)


def _run(fn: Callable[..., Tensor], r: Tensor, x: Tensor) -> list[Tensor]:
    """Output and the gradients of residual, branch, weight and bias under sum(output * probe)."""
    gen = torch.Generator().manual_seed(2)
    width = r.shape[-1]
    weight = (1 + 0.5 * torch.randn(width, generator=gen)).to(r.device).requires_grad_()
    bias = (0.5 * torch.randn(width, generator=gen)).to(r.device).requires_grad_()
    r, x = r.detach().requires_grad_(), x.detach().requires_grad_()
    y = fn(r, x, weight, bias, 1e-5)
    probe = torch.randn(y.shape, generator=gen).to(device=y.device, dtype=y.dtype)
    return [y, *torch.autograd.grad(y, [r, x, weight, bias], probe)]


def _assert_close(got: list[Tensor], want: list[Tensor], rtol: float = 1e-5) -> None:
    for name, (a, e) in enumerate(zip(got, want, strict=True)):
        assert a.shape == e.shape and a.dtype == e.dtype, name
        atol = rtol * max(1.0, float(e.detach().abs().max()))
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize(
    "shape",
    # DeLighT's d_m (rows not a multiple of any block), a (T, B, d) stream, an odd width
    [(35, 320), (3, 7, 96), (130, 512), (5, 21)],
    ids=str,
)
def test_kernel_matches_the_pytorch_ops(kernel_device: torch.device, shape: tuple) -> None:
    torch.manual_seed(0)
    r = torch.randn(shape, device=kernel_device) * 2 + 0.5
    x = torch.randn(shape, device=kernel_device)
    _assert_close(_run(residual_layer_norm_triton, r, x), _run(_reference, r, x))


class _Copies(TorchDispatchMode):
    """Counts the copies into new tensors (``clone``: ``contiguous``, ``reshape`` of a strided
    tensor); Triton's interpreter writes results back by ``copy_``, not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.count += func.overloadpacket is torch.ops.aten.clone
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_branch_of_transposed_layout_read_in_place(kernel_device: torch.device, p: float) -> None:
    """A (T, B, D) branch lying as (B, T, D) (an attention's output, transposed) is read in place
    and its gradient written in the same layout: no copy either way, and the same output,
    gradients and dropout mask as from a contiguous copy of it."""
    torch.manual_seed(0)
    r = torch.randn(7, 3, 96, device=kernel_device) * 2 + 0.5
    x = torch.randn(3, 7, 96, device=kernel_device).transpose(0, 1)  # (T, B, D) as (B, T, D)

    def fused(r: Tensor, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
        torch.manual_seed(1)
        return residual_layer_norm_triton(r, x, w, b, eps, p)

    with _Copies() as copies:
        got = _run(fused, r, x)
    assert copies.count == 0
    assert got[2].stride() == x.stride()  # the branch's gradient, in its layout
    _assert_close(got, _run(fused, r, x.contiguous()))
    if p == 0:
        _assert_close(got, _run(_reference, r, x))


def test_float32_residual_and_16_bit_branch(kernel_device: torch.device) -> None:
    """Under autocast the residual stream is float32 and the branch bf16: the sum and the output
    are float32 as PyTorch's path gives them (the same sum, normalised to float32 rounding), the
    branch's gradient bf16."""
    torch.manual_seed(0)
    r = torch.randn(37, 160, device=kernel_device)
    x = torch.randn(37, 160, device=kernel_device).bfloat16()
    got = _run(residual_layer_norm_triton, r, x)
    want = _run(_reference, r, x)
    assert got[0].dtype == torch.float32 and got[2].dtype == torch.bfloat16
    # the branch's gradient: float32 values rounded once to bf16 on both sides (2^-8, the
    # interpreter truncating: 2^-7)
    _assert_close(got[:2] + got[3:], want[:2] + want[3:])
    torch.testing.assert_close(got[2].float(), want[2].float(), rtol=2**-7, atol=1e-6)


def test_dropout_in_the_kernel(kernel_device: torch.device) -> None:
    """The kernel's dropout equals the PyTorch ops on the branch times its own mask, forward and
    backward (the backward draws the mask again from the seed), keeps about 1 - p, and follows
    ``torch.manual_seed``."""
    p = 0.3
    r = torch.randn(64, 384, device=kernel_device)
    x = torch.randn(64, 384, device=kernel_device)

    def fused(r: Tensor, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
        torch.manual_seed(7)
        return residual_layer_norm_triton(r, x, w, b, eps, p)

    got = _run(fused, r, x)
    # the branch's gradient is the residual's where kept, 0 where dropped
    kept = got[2] != 0
    assert abs(float(kept.float().mean()) - (1 - p)) < 0.02  # 24,576 draws: 6.8 sigma

    def masked(r: Tensor, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
        return _reference(r, x * kept / (1 - p), w, b, eps)

    _assert_close(got, _run(masked, r, x))
    again = _run(fused, r, x)[2]
    assert torch.equal(again != 0, kept)
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\), got 1.0"):
        residual_layer_norm_triton(r, x, torch.ones(384), torch.zeros(384), 1e-5, 1.0)


def test_impl_selection_and_bad_input(kernel_device: torch.device) -> None:
    r, x = torch.randn(4, 8), torch.randn(4, 8)
    w, b = torch.rand(8) + 0.5, torch.randn(8)
    # the CPU's auto: the PyTorch ops themselves
    assert torch.equal(residual_layer_norm(r, x, w, b), _reference(r, x, w, b, 1e-5))
    with pytest.raises(ValueError, match="must match"):
        residual_layer_norm_triton(r, x[:, :4], w, b, 1e-5)
    with pytest.raises(TypeError, match="takes residual, branch"):
        residual_layer_norm_triton(r.double(), x, w, b, 1e-5)


def test_auto_path_is_measured_once_per_shape(fresh_choices, kernel_device: torch.device) -> None:
    from src.kernels import chosen
    from src.kernels import residual_layer_norm as module

    times = {"triton": 1.0, "reference": 2.0}
    outputs: dict = {}
    timer = path_timer(times, outputs)
    r = torch.randn(40, 32, device=kernel_device)
    x = torch.randn(40, 32, device=kernel_device)
    w, b = torch.ones(32, device=kernel_device), torch.zeros(32, device=kernel_device)
    assert auto_path(r, x, w, b, 1e-5, timer) == "triton"
    torch.testing.assert_close(outputs["triton"], outputs["reference"], rtol=1e-5, atol=1e-5)
    times["triton"] = 3.0
    assert auto_path(r, x, w, b, 1e-5, timer) == "triton"  # kept
    assert auto_path(r[:20], x[:20], w, b, 1e-5, timer) == "reference"  # another row bucket
    assert len(chosen(module.CHOICE)) == 2


def test_delight_block_residuals_on_the_kernel(kernel_device: torch.device) -> None:
    """A post-norm DeLighT decoder block on the kernels equals the PyTorch paths (eval), and in
    training its three residuals take the fused kernel: no layer_norm of PyTorch's left."""
    torch.manual_seed(0)
    args = {"width_multiplier": 2.0, "depth": 3, "max_groups": 4, "dropout": 0.1}
    kernel = DeLighTDecoderBlock(32, impl="triton", **args).to(kernel_device).eval()
    reference = DeLighTDecoderBlock(32, impl="reference", **args).to(kernel_device).eval()
    reference.load_state_dict(kernel.state_dict())
    x = torch.randn(6, 2, 32, device=kernel_device)
    memory = torch.randn(5, 2, 32, device=kernel_device)
    got, _ = kernel(x, memory)
    want, _ = reference(x, memory)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    calls = []
    real = F.layer_norm
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "layer_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
        kernel.train()(x, memory)[0].sum().backward()
    assert calls == []
