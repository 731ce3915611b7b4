"""One tensor fed to several layers, its gradients summed in one launch.

DExTra's x0 feeds every GLT of its unit and its output layer (N + 1 layers, the input mixer of
Eq. 5.2). Autograd sums the N + 1 gradients of x0 one ``add`` at a time, N launches each
backward; DeLighT MT's 24 units spend 108 launches there, the largest count of ATen launches of
its step on the kernels (docs/gpu.md). :func:`fan_out` hands the layers one alias of x0 each and
sums their gradients with one kernel (:mod:`src.kernels.fan_out.triton_kernel`) where the Triton
paths run; elsewhere, and while ``torch.compile`` traces (a traced graph has no launch cost per op
to save: it is replayed, or fused by the compiler), the layers read x0 itself and autograd sums. The
sum is the same up to float rounding: the kernel adds in float32 and rounds once.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from src.kernels.dispatch import use_triton


def fan_out(x: Tensor, count: int, *, impl: str = "auto") -> tuple[Tensor, ...]:
    """``count`` tensors equal to ``x`` for ``count`` consumers, whose gradients reach ``x`` as one
    sum.

    Shape:
        x any -> ``count`` of the same shape
    """
    if count < 2 or not x.requires_grad or torch.compiler.is_compiling() or not use_triton(impl, x):
        return (x,) * count
    return _FanOut.apply(x, count)


def gradient_sum_reference(terms: list[Tensor]) -> Tensor:
    """The terms summed as autograd sums them, one ``add`` at a time."""
    return functools.reduce(torch.add, terms)


class _FanOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, count: int) -> tuple[Tensor, ...]:  # type: ignore[override]
        ctx.set_materialize_grads(False)
        return tuple(x.view_as(x) for _ in range(count))

    @staticmethod
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, None]:  # type: ignore[override]
        from src.kernels.fan_out.triton_kernel import gradient_sum_triton

        present = [g for g in grads if g is not None]
        if not present:
            return None, None
        if len(present) == 1:
            return present[0], None
        return gradient_sum_triton(present), None
