"""The contract of EESP's pyramid in one Triton pass (:mod:`src.kernels.eesp.triton_kernel`): the
statistics, forward, backward-sums and grad_branches ops over the K dilated branches of the reduced
map r, which none of them writes (the reference is :func:`src.kernels.eesp.eesp_pyramid`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from src.kernels.layout import memory_format_of

STATISTICS_SCHEMA = "(Tensor r, Tensor weight, Tensor dilations, int stride, bool hff) -> Tensor"
FORWARD_SCHEMA = (
    "(Tensor r, Tensor weight, Tensor dilations, Tensor scale, Tensor shift, Tensor alpha, "
    "int stride, bool hff) -> Tensor"
)
BACKWARD_SUMS_SCHEMA = (
    "(Tensor grad, Tensor r, Tensor weight, Tensor dilations, Tensor scale, Tensor shift, "
    "Tensor alpha, Tensor mean, int stride, bool hff) -> Tensor"
)
GRAD_BRANCHES_SCHEMA = (
    "(Tensor grad, Tensor r, Tensor weight, Tensor dilations, Tensor scale, Tensor shift, "
    "Tensor alpha, Tensor mean, Tensor p, Tensor q, Tensor rr, int stride, bool hff) -> Tensor"
)


def output_shape(r: Tensor, branches: int, stride: int) -> tuple[int, int, int, int]:
    """The pyramid's output shape for input r: (B, K n, H', W'), H' = ceil(H / stride)."""
    batch, channels, height, width = r.shape
    return batch, branches * channels, -(-height // stride), -(-width // stride)


def pyramid_like(r: Tensor, branches: int, stride: int) -> Tensor:
    """The (B, K n, H', W') output in r's memory format: channels-last in, channels-last out."""
    shape = output_shape(r, branches, stride)
    return torch.empty(shape, dtype=r.dtype, device=r.device, memory_format=memory_format_of(r))


def statistics_fake(r: Tensor, weight: Tensor, dilations: Tensor, stride: int, hff: bool) -> Tensor:
    """The statistics op's output metadata: (2, K n) float64 sums."""
    return r.new_empty((2, weight.shape[0] * r.shape[1]), dtype=torch.float64)


def forward_fake(
    r: Tensor, weight: Tensor, dilations: Tensor, scale: Tensor, shift: Tensor, alpha: Tensor,
    stride: int, hff: bool,
) -> Tensor:  # fmt: skip
    """The forward op's output metadata: :func:`pyramid_like` r."""
    return pyramid_like(r, weight.shape[0], stride)


def backward_sums_fake(
    grad: Tensor, r: Tensor, weight: Tensor, dilations: Tensor, scale: Tensor, shift: Tensor,
    alpha: Tensor, mean: Tensor, stride: int, hff: bool,
) -> Tensor:  # fmt: skip
    """The backward sums op's output metadata: (3, K n) float32 sums."""
    return r.new_empty((3, weight.shape[0] * r.shape[1]), dtype=torch.float32)


def grad_branches_fake(
    grad: Tensor, r: Tensor, weight: Tensor, dilations: Tensor, scale: Tensor, shift: Tensor,
    alpha: Tensor, mean: Tensor, p: Tensor, q: Tensor, rr: Tensor, stride: int, hff: bool,
) -> Tensor:  # fmt: skip
    """The grad_branches op's output metadata: :func:`pyramid_like` r."""
    return pyramid_like(r, weight.shape[0], stride)
