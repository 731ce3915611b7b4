"""Max and average pooling run in the layout PyTorch's CPU kernels vectorise, and exported in the
form every runtime's delegate takes.

PyTorch's CPU pooling kernels vectorise over channels only for channels-last input; on NCHW maps
they loop per plane. For the 3x3 stride-2 pools of the EdgeNets models the two layout copies cost
far less than they save: on 2 cores, max pooling a (8, 24, 112, 112) map takes 9.5 ms NCHW and
2.1 ms with the copies; average pooling a (8, 116, 28, 28) map 1.29 ms and 0.43 ms. These modules
are ``nn.MaxPool2d`` / ``nn.AvgPool2d`` (same arguments, no parameters) that pool CPU inputs
channels-last and return the input's layout (NCHW in these models).

In an exported graph (:func:`src.kernels.dispatch.exporting`) the layout copies are left out (the
runtime picks its own layout; ExecuTorch's XNNPACK partitioner does not take a change of dim
order, and each one split DiCENet's and ESPNetv2's programs between delegates), and an average
pool that counts its zero padding (the official models' ``nn.AvgPool2d(3, 2, 1)``) is the
explicit zero padding, then the pool without padding: the same map (each window divides by the
kernel's area either way), which XNNPACK runs while it refuses a padded pool that counts its
padding. An adaptive average pool (EPP's pyramid) is exported, where the graph's size is static,
as a plain average pool when the sizes divide and as its two pooling matrices, one per axis,
otherwise: XNNPACK takes neither ``adaptive_avg_pool2d`` nor a matmul that broadcasts a matrix over
a batch (``expand_copy``), and each node it refuses split ESPNetv2's segmentation program.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from src.kernels.dispatch import exporting, static_size


def _channels_last_on_cpu(pool: nn.Module, x: Tensor) -> Tensor:
    if (
        exporting()
        or not x.is_cpu
        or x.dim() != 4
        or x.is_contiguous(memory_format=torch.channels_last)
    ):
        return pool(x)
    # (B, C, H, W) NCHW -> channels-last copy -> pool -> NCHW copy
    return pool(x.contiguous(memory_format=torch.channels_last)).contiguous()


def adaptive_pool_matrix(
    n_in: int, n_out: int, *, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """Adaptive average pooling of one axis as a matrix: output i averages the inputs
    ``[floor(i n_in / n_out), ceil((i + 1) n_in / n_out))`` (``F.adaptive_avg_pool1d``'s windows,
    for a shorter or a longer output).

    Shape:
        (n_out, n_in)
    """
    out_idx = torch.arange(n_out, device=device, dtype=torch.float64)
    in_idx = torch.arange(n_in, device=device, dtype=torch.float64)
    start = torch.div(out_idx * n_in, n_out, rounding_mode="floor")
    end = -torch.div(-(out_idx + 1) * n_in, n_out, rounding_mode="floor")  # ceil
    inside = (in_idx >= start[:, None]) & (in_idx < end[:, None])
    return (inside / (end - start)[:, None]).to(dtype)


def adaptive_avg_pool2d(x: Tensor, size: tuple[int, int]) -> Tensor:
    """``F.adaptive_avg_pool2d``; exported at a static size as an average pool where ``size``
    divides the input's, else as one pooling matrix per axis (the module's docstring says why).

    Shape:
        (B, C, H, W) -> (B, C, *size)
    """
    shape = static_size(x) if exporting() else None
    if shape is None:
        return F.adaptive_avg_pool2d(x, size)
    (height, width), (out_h, out_w) = shape, size
    if height % out_h == 0 and width % out_w == 0:
        window = (height // out_h, width // out_w)
        return F.avg_pool2d(x, window, window)
    options = {"dtype": x.dtype, "device": x.device}
    pool_w = adaptive_pool_matrix(width, out_w, **options)  # (out_w, W)
    pool_h = adaptive_pool_matrix(height, out_h, **options)  # (out_h, H)
    # ``F.linear`` multiplies the last axis without broadcasting the matrix over the batch:
    # (B, C, H, W) -> (B, C, H, out_w) -> (B, C, out_w, H) -> (B, C, out_w, out_h) -> back
    x = F.linear(x, pool_w)
    return F.linear(x.transpose(2, 3), pool_h).transpose(2, 3)


def avg_pool2d(
    x: Tensor,
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int],
    padding: int | tuple[int, int],
) -> Tensor:
    """``F.avg_pool2d`` counting the zero padding (its default); exported as the explicit padding
    and an unpadded pool (the module's docstring says why).

    Shape:
        (B, C, H, W) -> (B, C, H', W') as ``F.avg_pool2d``
    """
    pad_h, pad_w = _pair(padding)
    if exporting() and (pad_h or pad_w):
        return F.avg_pool2d(F.pad(x, (pad_w, pad_w, pad_h, pad_h)), kernel_size, stride)
    return F.avg_pool2d(x, kernel_size, stride, padding)


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d``, pooling CPU inputs channels-last.

    Shape:
        (B, C, H, W) -> (B, C, H', W') as ``nn.MaxPool2d``
    """

    def forward(self, x: Tensor) -> Tensor:
        return _channels_last_on_cpu(super().forward, x)  # type: ignore[arg-type]


class AvgPool2d(nn.AvgPool2d):
    """``nn.AvgPool2d``, pooling CPU inputs channels-last; exported as the explicit padding and an
    unpadded pool where it counts its padding.

    Shape:
        (B, C, H, W) -> (B, C, H', W') as ``nn.AvgPool2d``
    """

    def _pool(self, x: Tensor) -> Tensor:
        if not self.ceil_mode and self.count_include_pad and self.divisor_override is None:
            return avg_pool2d(x, self.kernel_size, self.stride, self.padding)
        return super().forward(x)

    def forward(self, x: Tensor) -> Tensor:
        return _channels_last_on_cpu(self._pool, x)  # type: ignore[arg-type]
