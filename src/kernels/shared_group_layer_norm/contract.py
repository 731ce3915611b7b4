"""The contract of DeLighT's per-group LayerNorm with its swish
(:mod:`src.kernels.shared_group_layer_norm`): the forward and backward ops over (R, D) rows, which
the Triton kernels (:mod:`src.kernels.shared_group_layer_norm.triton_kernel`) compute. The dropout
mask's seed is a tensor (:mod:`src.kernels.dropout.contract`), None without dropout, and ``site``
the dropout site's index among those sharing it.
"""

from __future__ import annotations

import torch
from torch import Tensor

FORWARD_SCHEMA = (
    "(Tensor x, Tensor weight, Tensor bias, int groups, float eps, bool swish, Tensor? seed, "
    "int site, float p) -> (Tensor, Tensor, Tensor)"
)
BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight, Tensor bias, Tensor mean, Tensor rstd, "
    "bool swish, Tensor? seed, int site, float p) -> (Tensor, Tensor)"
)


def forward_fake(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float, swish: bool,
    seed: Tensor | None, site: int, p: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The forward op's outputs' metadata: y like x (its dtype too), float32 (R, G) mean and
    reciprocal standard deviation."""
    stats = (x.shape[0], groups)
    return (
        torch.empty_like(x),
        x.new_empty(stats, dtype=torch.float32),
        x.new_empty(stats, dtype=torch.float32),
    )


def backward_fake(
    grad_y: Tensor, x: Tensor, weight: Tensor, bias: Tensor, mean: Tensor, rstd: Tensor,
    swish: bool, seed: Tensor | None, site: int, p: float,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The backward op's outputs' metadata: grad_x like x, then the weight and bias gradients
    stacked, (2, d/g) in the weight's dtype (one tensor: a custom op's outputs may not alias)."""
    return torch.empty_like(x), weight.new_empty((2, *weight.shape))
