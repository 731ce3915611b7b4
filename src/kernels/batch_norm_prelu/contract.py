"""The contract of BatchNorm + PReLU (:mod:`src.kernels.batch_norm_prelu`): the forward and backward
ops over the (B H W, C) rows of a channels-last activation, which the C++ kernels
(``src/kernels/batch_norm_prelu/batch_norm_prelu.cpp``) and the Triton ones
(:mod:`src.kernels.batch_norm_prelu.triton_kernel`) both compute.
"""

from __future__ import annotations

import torch
from torch import Tensor

FORWARD_SCHEMA = (
    "(Tensor x, Tensor weight, Tensor bias, Tensor slope, float eps, Tensor? residual) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)
BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight, Tensor bias, Tensor slope, Tensor save_mean, "
    "Tensor save_invstd, Tensor? residual) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


def forward_fake(
    x: Tensor, weight: Tensor, bias: Tensor, slope: Tensor, eps: float,
    residual: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The forward kernels' outputs' metadata (C++ and Triton): y like x's (R, C) view, three
    float32 (C,)."""
    return (torch.empty_like(x), *(torch.empty_like(weight) for _ in range(3)))


def backward_fake(
    grad_y: Tensor, x: Tensor, weight: Tensor, bias: Tensor, slope: Tensor, save_mean: Tensor,
    save_invstd: Tensor, residual: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The backward kernels' outputs' metadata (C++ and Triton): grad_x like x's (R, C) view,
    three float32 (C,), and the residual's gradient like x (empty without a residual)."""
    vectors = (torch.empty_like(weight) for _ in range(3))
    grad_residual = torch.empty_like(x) if residual is not None else x.new_empty(0)
    return (torch.empty_like(x), *vectors, grad_residual)
