"""The contract of Group-Transformer's per-group layer norm
(:mod:`src.kernels.per_group_layer_norm`): the forward and backward ops over (R, D) rows, which the
C++ kernels (``src/kernels/per_group_layer_norm/per_group_layer_norm.cpp``) and the Triton ones
(:mod:`src.kernels.per_group_layer_norm.triton_kernel`) both compute. The forward is
differentiable, its backward rule (:func:`keep_for_backward`, then the back-end's backward op)
keeps x in its dtype and the (row, group) statistics; :func:`forward_op` registers a back-end's
pair under it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

from src.kernels.custom_ops import autograd_op
from src.kernels.dispatch import autocast_off

F = TypeVar("F", bound=Callable[..., Any])

FORWARD_SCHEMA = (
    "(Tensor x, Tensor weight, Tensor bias, int groups, float eps) -> (Tensor, Tensor, Tensor)"
)
BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight, Tensor mean, Tensor std, float eps) "
    "-> (Tensor, Tensor, Tensor)"
)


def out_dtype(x: Tensor) -> torch.dtype:
    """The output's dtype: float32 for a 16-bit x, as the PyTorch path's (which normalises
    ``x.float()``), x's otherwise."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def forward_fake(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward op's outputs' metadata: y (:func:`out_dtype`), float32 (R, G) mean and std."""
    stats = (x.shape[0], groups)
    return (
        x.new_empty(x.shape, dtype=out_dtype(x)),
        x.new_empty(stats, dtype=torch.float32),
        x.new_empty(stats, dtype=torch.float32),
    )


def backward_fake(
    grad_y: Tensor, x: Tensor, weight: Tensor, mean: Tensor, std: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward op's outputs' metadata: grad_x like x, the weight and bias gradients like
    the weight."""
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)


def keep_for_backward(ctx, inputs: tuple, output: tuple) -> None:
    """The forward op's ``setup_context``: the backward op reads x, the weight, the statistics
    (outputs the caller does not differentiate) and eps."""
    x, weight, _, _, eps = inputs
    _, mean, std = output
    ctx.mark_non_differentiable(mean, std)
    ctx.save_for_backward(x, weight, mean, std)
    ctx.eps = eps


def forward_op(
    name: str, backward: Callable[..., tuple[Tensor, Tensor, Tensor]]
) -> Callable[[F], F]:
    """Register a back-end's forward (``FORWARD_SCHEMA``) as the differentiable custom op ``name``
    (:func:`~src.kernels.custom_ops.autograd_op`), its autograd rule the back-end's ``backward``
    op (``BACKWARD_SCHEMA``, an :func:`~src.kernels.dispatch.opaque_op`) on what
    :func:`keep_for_backward` kept, with autocast off."""

    def grads(ctx, grad_y: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, mean, std = ctx.saved_tensors
        with autocast_off(x.device.type):
            grad_x, grad_w, grad_b = backward(grad_y.contiguous(), x, weight, mean, std, ctx.eps)
        return grad_x, grad_w, grad_b, None, None

    return autograd_op(
        name, FORWARD_SCHEMA, forward_fake, setup_context=keep_for_backward, backward=grads
    )
