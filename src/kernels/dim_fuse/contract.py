"""The contract of DiCE's local fusion in one Triton pass
(:mod:`src.kernels.dim_fuse.triton_kernel`): the
statistics, forward, backward-sums and grad_h ops over DimConv's output, which none of them
writes (see :mod:`src.kernels.dim_fuse` for the reference).
"""

from __future__ import annotations

import torch
from torch import Tensor

from src.kernels.dim_conv.contract import output_like

STATISTICS_SCHEMA = (
    "(Tensor x, Tensor weight_channel, Tensor weight_height, Tensor weight_width, int[] dilation)"
    " -> Tensor"
)
FORWARD_SCHEMA = (
    "(Tensor x, Tensor weight_channel, Tensor weight_height, Tensor weight_width, Tensor scale, "
    "Tensor shift, Tensor alpha, Tensor w_local, Tensor[] post, int[] dilation) -> Tensor"
)
BACKWARD_SUMS_SCHEMA = (
    "(Tensor grad_local, Tensor x, Tensor weight_channel, Tensor weight_height, "
    "Tensor weight_width, Tensor scale, Tensor shift, Tensor alpha, Tensor w_local, "
    "Tensor mean, int[] dilation) -> Tensor"
)
GRAD_H_SCHEMA = (
    "(Tensor grad_local, Tensor x, Tensor weight_channel, Tensor weight_height, "
    "Tensor weight_width, Tensor scale, Tensor shift, Tensor alpha, Tensor w_local, "
    "Tensor mean, Tensor p, Tensor q, Tensor r, int[] dilation) -> Tensor"
)


def local_like(x: Tensor) -> Tensor:
    """A (B, C, H, W) tensor in x's memory format (dense strides even for a view)."""
    return torch.empty_like(x)


def statistics_fake(x: Tensor, wc: Tensor, wh: Tensor, ww: Tensor, dilation: list[int]) -> Tensor:
    """The statistics op's output metadata: (2, 3C) float64 sums."""
    return x.new_empty((2, 3 * x.shape[1]), dtype=torch.float64)


def forward_fake(
    x: Tensor, wc: Tensor, wh: Tensor, ww: Tensor, scale: Tensor, shift: Tensor, alpha: Tensor,
    w_local: Tensor, post: list[Tensor], dilation: list[int],
) -> Tensor:  # fmt: skip
    """The forward op's output metadata: :func:`local_like` x."""
    return local_like(x)


def backward_sums_fake(
    grad_local: Tensor, x: Tensor, wc: Tensor, wh: Tensor, ww: Tensor, scale: Tensor,
    shift: Tensor, alpha: Tensor, w_local: Tensor, mean: Tensor, dilation: list[int],
) -> Tensor:  # fmt: skip
    """The backward sums op's output metadata: (4, 3C) float32 sums."""
    return x.new_empty((4, 3 * x.shape[1]), dtype=torch.float32)


def grad_h_fake(
    grad_local: Tensor, x: Tensor, wc: Tensor, wh: Tensor, ww: Tensor, scale: Tensor,
    shift: Tensor, alpha: Tensor, w_local: Tensor, mean: Tensor, p: Tensor, q: Tensor, r: Tensor,
    dilation: list[int],
) -> Tensor:  # fmt: skip
    """The grad_h op's output metadata: DimConv's output like x
    (:func:`src.kernels.dim_conv.contract.output_like`)."""
    return output_like(x)
