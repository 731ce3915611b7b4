"""The contract of the GLT (:mod:`src.ops.group_linear`): its backward op, which the reference
(:func:`src.kernels.group_linear.glt_backward`) and the Triton kernels
(:mod:`src.kernels.group_linear.triton_kernel`) both compute, and the Triton forward op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from src.kernels.dispatch import autocast_off

FORWARD_SCHEMA = (
    "(Tensor[] parts, Tensor weight, Tensor? bias, bool shuffle, ScalarType dtype) -> Tensor"
)
BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor weight, Tensor[] parts, bool shuffle, bool weight_grad, "
    "bool bias_grad, bool[] part_grads) -> Tensor[]"
)


def forward_fake(
    parts: Sequence[Tensor], weight: Tensor, bias: Tensor | None, shuffle: bool, dtype: torch.dtype
) -> Tensor:
    """The forward op's output metadata: (N, g * n) in the products' dtype."""
    groups, _, n = weight.shape
    return parts[0].new_empty(parts[0].shape[0], groups * n, dtype=dtype)


def glt_grads_like(
    grad_y: Tensor, weight: Tensor, parts: Sequence[Tensor], shuffle: bool, weight_grad: bool,
    bias_grad: bool, part_grads: Sequence[bool],
) -> list[Tensor]:  # fmt: skip
    """Uninitialised gradients of a GLT backward op (its fake when traced): the wanted ones of
    (weight, bias, *parts), in that order.

    Shape:
        weight (g, k, n) -> (g, k, n); bias -> (g, n); parts (N, d_j) -> (N, d_j), contiguous
    """
    groups, _, n = weight.shape
    grads = [torch.empty_like(weight)] if weight_grad else []
    if bias_grad:
        grads.append(weight.new_empty(groups, n))
    grads += [p.new_empty(p.shape) for p, want in zip(parts, part_grads, strict=True) if want]
    return grads


def glt_function_backward(
    ctx: Any, grad_y: Tensor, backward: Callable[..., list[Tensor]], options: int
) -> tuple[Tensor | None, ...]:
    """The backward of a GLT autograd Function (the reference's, the Triton one's): its inputs are
    (weight, bias, ``options`` arguments without a gradient, *parts), its saved tensors
    (weight, *parts), with ``ctx.shuffle`` and ``ctx.has_bias``. ``backward`` is the path's
    backward op (:data:`BACKWARD_SCHEMA`), run with autocast off (the operands already share the
    products' dtype); its wanted gradients are returned in the Function's input order.
    """
    weight, *parts = ctx.saved_tensors
    wanted = ctx.needs_input_grad
    bias_grad = ctx.has_bias and wanted[1]
    part_grads = wanted[2 + options :]
    with autocast_off(weight.device.type):
        grads = backward(grad_y, weight, parts, ctx.shuffle, wanted[0], bias_grad, part_grads)
    given = iter(grads)
    grad_w = next(given) if wanted[0] else None
    grad_b = next(given) if bias_grad else None
    grad_parts = [next(given) if want else None for want in part_grads]
    return (grad_w, grad_b, *[None] * options, *grad_parts)
