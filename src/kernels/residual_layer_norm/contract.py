"""The contract of the post-norm residual (:mod:`src.kernels.residual_layer_norm`): the forward and
backward ops over (R, D) rows, which the Triton kernels
(:mod:`src.kernels.residual_layer_norm.triton_kernel`) compute. The dropout mask's seed is a tensor
(:mod:`src.kernels.dropout.contract`), None without dropout, and ``site`` the dropout site's index
among those sharing it.

The branch's rows may lie in another order than the residual's: with the rows of both being the
(n0, n1) leading positions of (n0, n1, D) tensors, ``n0`` > 1 says that the branch lies as
(n1, n0, D), so that residual row i n1 + j is the branch's row j n0 + i (1: the same order). Its
gradient comes in the branch's order too. That reads an attention's (B, T, D) output seen as
(T, B, D) in place.
"""

from __future__ import annotations

import torch
from torch import Tensor

FORWARD_SCHEMA = (
    "(Tensor residual, Tensor branch, Tensor weight, Tensor bias, float eps, Tensor? seed, "
    "int site, float p, int n0) -> (Tensor, Tensor, Tensor, Tensor)"
)
BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor total, Tensor weight, Tensor mean, Tensor rstd, ScalarType "
    "branch_dtype, Tensor? seed, int site, float p, int n0) -> (Tensor, Tensor, Tensor)"
)


def forward_fake(
    residual: Tensor, branch: Tensor, weight: Tensor, bias: Tensor, eps: float,
    seed: Tensor | None, site: int, p: float, n0: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The forward op's outputs' metadata: y and the sum ``residual + dropout(branch)`` in the
    promoted dtype of the two, float32 (R,) mean and reciprocal standard deviation."""
    dtype = torch.result_type(residual, branch)
    rows = residual.shape[0]
    return (
        torch.empty_like(residual, dtype=dtype),
        torch.empty_like(residual, dtype=dtype),
        residual.new_empty((rows,), dtype=torch.float32),
        residual.new_empty((rows,), dtype=torch.float32),
    )


def backward_fake(
    grad_y: Tensor, total: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor,
    branch_dtype: torch.dtype, seed: Tensor | None, site: int, p: float, n0: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The backward op's outputs' metadata: the residual's gradient like the sum, the branch's in
    its dtype, then the weight and bias gradients stacked, (2, D) in the weight's dtype."""
    return (
        torch.empty_like(total),
        torch.empty_like(total, dtype=branch_dtype),
        weight.new_empty((2, *weight.shape)),
    )
