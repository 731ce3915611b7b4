"""The contracts of DimConv's kernels (:mod:`src.ops.dim_conv`).

The C++ kernels (:mod:`src.kernels.dim_conv`) read a channels-last input as its (B, H, W, C) view
and write the output the same way; the Triton kernels (:mod:`src.kernels.dim_conv.triton_kernel`)
take (B, C, H, W) tensors of any strides and give the output in x's memory format. Their forward ops
share a schema; each has its own fake, and its own backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from src.kernels.layout import memory_format_of

Weights = tuple[Tensor, Tensor, Tensor]
"""DimConv's three kernels as one argument: channel-wise (C, 1, k, k), height-wise (H_b, 1, k, k)
and width-wise (W_b, 1, k, k), H_b x W_b the layer's build size."""

FORWARD_SCHEMA = (
    "(Tensor x, Tensor weight_channel, Tensor weight_height, Tensor weight_width, int[] dilation, "
    "bool interleave) -> Tensor"
)
BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight_channel, Tensor weight_height, Tensor weight_width, "
    "int[] dilation, bool interleave, bool input_grad, bool weight_grads) -> Tensor[]"
)
CHANNELS_LAST_BACKWARD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor weight_channel, Tensor weight_height, Tensor weight_width, "
    "int[] dilation, bool interleave, bool input_grad, bool weight_grad) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)


def output_like(x: Tensor) -> Tensor:
    """The (B, 3C, H, W) output in x's memory format: channels-last in, channels-last out."""
    batch, channels, height, width = x.shape
    shape = (batch, 3 * channels, height, width)
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=memory_format_of(x))


def forward_fake(x: Tensor, *_weights_and_options: object) -> Tensor:
    """The Triton forward's output metadata (arguments as :data:`FORWARD_SCHEMA` lists them):
    :func:`output_like` x."""
    return output_like(x)


def backward_fake(grad_y: Tensor, x: Tensor, *weights_and_options: object) -> list[Tensor]:
    """The Triton backward's outputs' metadata (arguments as :data:`BACKWARD_SCHEMA` lists them):
    the wanted gradients, like x and the three weights."""
    *weights, _dilation, _interleave, input_grad, weight_grads = weights_and_options
    grads = [torch.empty_like(x)] if input_grad else []
    if weight_grads:
        grads += [torch.empty_like(w) for w in weights]
    return grads


def channels_last_forward_fake(
    x: Tensor, weight_channel: Tensor, weight_height: Tensor, weight_width: Tensor,
    dilation: list[int], interleave: bool,
) -> Tensor:  # fmt: skip
    """The C++ forward's output metadata: (B, H, W, 3C) like x's (B, H, W, C) view."""
    return x.new_empty(*x.shape[:3], 3 * x.shape[3])


def channels_last_backward_fake(
    grad_y: Tensor, x: Tensor, weight_channel: Tensor, weight_height: Tensor,
    weight_width: Tensor, dilation: list[int], interleave: bool, input_grad: bool,
    weight_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The C++ backward's outputs' metadata: grad_x like x's (B, H, W, C) view and the three
    float32 weight gradients, each empty where not wanted."""
    grad_x = torch.empty_like(x) if input_grad else x.new_empty(0)
    grads = [
        w.new_empty(w.shape if weight_grad else (0, *w.shape[1:]), dtype=torch.float32)
        for w in (weight_channel, weight_height, weight_width)
    ]
    return grad_x, *grads
