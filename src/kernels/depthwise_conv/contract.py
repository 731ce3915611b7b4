"""The contract of the depth-wise convolution's CPU backward (:mod:`src.kernels.depthwise_conv`)."""

from __future__ import annotations

import torch
from torch import Tensor

BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight, int stride, int padding, int dilation, "
    "bool input_grad, bool weight_grad, bool bias_grad) -> (Tensor, Tensor, Tensor)"
)


def backward_fake(
    grad_y: Tensor, x: Tensor, weight: Tensor, stride: int, padding: int, dilation: int,
    input_grad: bool, weight_grad: bool, bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The kernel's outputs' metadata: grad_x like x's (B, H, W, C) view, float32 weight and bias
    gradients; each empty where not wanted."""
    channels = weight.shape[0]
    return (
        torch.empty_like(x) if input_grad else x.new_empty(0),
        weight.new_empty(channels if weight_grad else 0, *weight.shape[1:], dtype=torch.float32),
        weight.new_empty(channels if bias_grad else 0, dtype=torch.float32),
    )
