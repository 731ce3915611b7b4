"""The contract of Group-Transformer's per-group layer norm (:mod:`src.ops.per_group_layer_norm`):
the forward and backward ops over (R, D) rows, which the Triton kernels
(:mod:`src.ops.triton.per_group_layer_norm`) compute.
"""

from __future__ import annotations

import torch
from torch import Tensor

FORWARD_SCHEMA = "(Tensor x, Tensor weight, Tensor bias, int groups, float eps) -> Tensor[]"
BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight, Tensor mean, Tensor std, float eps) -> Tensor[]"
)


def out_dtype(x: Tensor) -> torch.dtype:
    """The output's dtype: float32 for a 16-bit x, as the PyTorch path's (which normalises
    ``x.float()``), x's otherwise."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def forward_fake(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float
) -> list[Tensor]:
    """The forward op's outputs' metadata: y (:func:`out_dtype`), float32 (R, G) mean and std."""
    stats = (x.shape[0], groups)
    return [
        x.new_empty(x.shape, dtype=out_dtype(x)),
        x.new_empty(stats, dtype=torch.float32),
        x.new_empty(stats, dtype=torch.float32),
    ]


def backward_fake(
    grad_y: Tensor, x: Tensor, weight: Tensor, mean: Tensor, std: Tensor, eps: float
) -> list[Tensor]:
    """The backward op's outputs' metadata: grad_x like x, the weight and bias gradients like
    the weight."""
    return [torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)]
