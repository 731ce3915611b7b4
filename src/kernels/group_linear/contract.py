"""The contract of the GLT (:mod:`src.ops.group_linear`): its backward op, which the reference
(:func:`src.kernels.group_linear.glt_backward`) and the Triton kernels
(:mod:`src.kernels.group_linear.triton_kernel`) both compute, and the Triton forward op.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

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
    grad_y: Tensor,
    weight: Tensor,
    parts: Sequence[Tensor],
    shuffle: bool,
    weight_grad: bool,
    bias_grad: bool,
    part_grads: Sequence[bool],
) -> list[Tensor]:
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


def unpack_glt_grads(
    grads: Sequence[Tensor], wanted: Sequence[bool], has_bias: bool
) -> tuple[Tensor | None, ...]:
    """The gradients of a GLT backward op, in the order of the Function's inputs.

    ``grads`` holds only the wanted ones (weight, bias, parts); ``wanted`` is the Function's
    ``needs_input_grad`` over (weight, bias, shuffle, *parts).
    """
    given = iter(grads)
    grad_w = next(given) if wanted[0] else None
    grad_b = next(given) if has_bias and wanted[1] else None
    grad_parts = [next(given) if want else None for want in wanted[3:]]
    return (grad_w, grad_b, None, *grad_parts)
