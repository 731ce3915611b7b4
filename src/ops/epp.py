"""Efficient pyramid pooling (EPP): project, a depth-wise 3x3 conv at several scales, fuse.

ESPNetv2 Sec. 4.2 / thesis Sec. 2.4.2 and 3.6.1; the official EdgeNets ``EfficientPyrPool``
(``nn_layers/efficient_pyramid_pool.py``). Both EdgeNets heads use it: the segmentation decoder
with the scales (2, 1.5, 1, 0.5, 0.1) and the SSD's top-down fusion with two to four of
(2, 1, 0.5, 0.25). It is a block of its own (as EESP and DiCE are), apart from either network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.batch_norm import BatchNorm2d
from src.kernels.inference_folding import ConvBNPReLU
from src.kernels.pooling import adaptive_avg_pool2d
from src.kernels.prelu import PReLU
from src.ops.shuffle import channel_shuffle

EPP_MIN_SIZE = 5  # the official branches never work below 5 x 5


def upsample(x: Tensor, size: Sequence[int]) -> Tensor:
    """Bilinear resize with ``align_corners=True``, as EPP and the EdgeNets heads around it.

    Shape:
        (B, C, h, w) -> (B, C, *size)
    """
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=True)


class EfficientPyramidPooling(nn.Module):
    """EPP with a chosen set of scales.

    1. 1x1 CBR to ``proj_channels`` (p);
    2. for each scale s, from the largest: resize to max(ceil(s h), 5) x max(ceil(s w), 5)
       (adaptive average pool when s < 1, bilinear ``align_corners`` when s > 1), depth-wise 3x3
       conv, resize back (bilinear when s < 1, adaptive average pool when s > 1);
    3. concatenate (B, S p, h, w) for S scales, BN + PReLU, channel shuffle (S groups), 3x3 CBR
       S p -> p with p groups, 1x1 conv p -> C_out; then BN + PReLU, or, in a network's last EPP,
       a conv bias instead.

    Args:
        in_channels: C_in.
        proj_channels: p.
        out_channels: C_out.
        scales: the pyramid's scales (sorted from the largest, as the official code does).
        last: the network's final EPP (bias, no BN + PReLU after the 1x1 conv).

    Shape:
        (B, C_in, h, w) -> (B, C_out, h, w)
    """

    def __init__(
        self,
        in_channels: int,
        proj_channels: int,
        out_channels: int,
        *,
        scales: Sequence[float],
        last: bool = False,
    ) -> None:
        super().__init__()
        if proj_channels < 1 or not scales:
            raise ValueError(f"need proj_channels >= 1 and scales, got {proj_channels}, {scales}")
        p = proj_channels
        self.scales = tuple(sorted(scales, reverse=True))
        self.last = last
        self.project = ConvBNPReLU(in_channels, p, 1)
        self.stages = nn.ModuleList(
            nn.Conv2d(p, p, 3, padding=1, groups=p, bias=False) for _ in self.scales
        )
        k = len(self.scales)
        self.merge_norm = nn.Sequential(BatchNorm2d(k * p), PReLU(k * p))
        self.merge = ConvBNPReLU(k * p, p, 3, groups=p)
        self.expand = nn.Conv2d(p, out_channels, 1, bias=last)
        self.out_norm: nn.Module = (
            nn.Identity() if last else nn.Sequential(BatchNorm2d(out_channels), PReLU(out_channels))
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.project(x)  # (B, p, h, w)
        height, width = x.shape[-2:]
        branches = []
        for scale, conv in zip(self.scales, self.stages):
            size = (
                max(math.ceil(height * scale), EPP_MIN_SIZE),
                max(math.ceil(width * scale), EPP_MIN_SIZE),
            )
            if scale < 1.0:
                branch = upsample(conv(adaptive_avg_pool2d(x, size)), (height, width))
            elif scale > 1.0:
                branch = adaptive_avg_pool2d(conv(upsample(x, size)), (height, width))
            else:
                branch = conv(x)
            branches.append(branch)
        # S x (B, p, h, w) -> (B, S p, h, w), normalised, then shuffled across the S scales
        out = channel_shuffle(self.merge_norm(torch.cat(branches, dim=1)), len(self.scales))
        return self.out_norm(self.expand(self.merge(out)))

    def extra_repr(self) -> str:
        return f"scales={self.scales}, last={self.last}"
