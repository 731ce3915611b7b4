"""The contract of the local-fusion convolution's CPU kernels
(:mod:`src.kernels.local_fusion_conv`),
on rows of channels."""

from __future__ import annotations

import torch
from torch import Tensor

FORWARD_SCHEMA = "(Tensor x, Tensor weight) -> Tensor"
BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight, bool input_grad, bool weight_grad) "
    "-> (Tensor, Tensor)"
)


def forward_fake(x: Tensor, weight: Tensor) -> Tensor:
    """The kernel's output metadata: (R, C) rows of x's dtype."""
    return x.new_empty(x.shape[0], weight.shape[0])


def backward_fake(
    grad_y: Tensor, x: Tensor, weight: Tensor, input_grad: bool, weight_grad: bool
) -> tuple[Tensor, Tensor]:
    """The kernel's outputs' metadata: grad_x like x, the float32 weight gradient; each empty
    where not wanted."""
    grad_x = torch.empty_like(x) if input_grad else x.new_empty(0)
    rows = weight.shape[0] if weight_grad else 0
    return grad_x, x.new_empty(rows, weight.shape[1], dtype=torch.float32)
