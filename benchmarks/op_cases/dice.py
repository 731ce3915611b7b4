"""DimConv and the DiCE unit at DiCENet s = 1.0 shapes, against a step-by-step PyTorch DimConv.

Shapes: the stem's 24 channels at 56 x 56 (the strided unit of level 3 runs its DiCE at 28 x 28, the
widths below are the three stages' 116 / 232 / 464 channels at 28 / 14 / 7). Batch 8, build size =
input size, so no resizing happens (as in the classification network at 224 x 224).

The baseline is DimConv as the official code writes it: three depth-wise convolutions on
permuted copies of the input, permuted back, concatenated, then interleaved by a 3-group channel
shuffle. The DiCE baseline is that DimConv followed by the same DimFuse module as ours.

The "DimConv channels-last" rows take the layout the networks train in, where the CPU runs
DimConv's C++ kernels (:mod:`src.kernels.dim_conv`), against the eager path they replace
(:func:`src.kernels.dim_conv.dim_conv_reference`, the same weights and layout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.op_cases import OpCase
from src.kernels.dim_conv import dim_conv_reference
from src.ops.dice import DiCE
from src.ops.dim_conv import DimConv

BATCH = 8
SHAPES = ((24, 56), (116, 28), (232, 14), (464, 7))  # (channels, height = width)


def baseline_dim_conv(
    x: Tensor, weight_channel: Tensor, weight_height: Tensor, weight_width: Tensor
) -> Tensor:
    """Step by step: three depth-wise convs on permuted inputs, concatenation, interleave."""
    batch, channels, height, width = x.shape
    y_channel = F.conv2d(x, weight_channel, padding=1, groups=channels)
    # (B, C, H, W) -> (B, H, C, W) -> conv -> (B, C, H, W)
    y_height = F.conv2d(x.permute(0, 2, 1, 3), weight_height, padding=1, groups=height).permute(
        0, 2, 1, 3
    )
    # (B, C, H, W) -> (B, W, H, C) -> conv -> (B, C, H, W)
    y_width = F.conv2d(x.permute(0, 3, 2, 1), weight_width, padding=1, groups=width).permute(
        0, 3, 2, 1
    )
    y = torch.cat([y_channel, y_height, y_width], dim=1)  # (B, 3C, H, W), [channel, height, width]
    # channel shuffle, 3 groups: (B, 3, C, H, W) -> (B, C, 3, H, W) -> (B, 3C, H, W)
    return (
        y.view(batch, 3, channels, height, width)
        .transpose(1, 2)
        .reshape(batch, 3 * channels, height, width)
    )


def cases(device: torch.device) -> list[OpCase]:
    out = []
    for channels, size in SHAPES:
        shape = f"B={BATCH} C={channels} H=W={size}"
        x = torch.randn(BATCH, channels, size, size, device=device, requires_grad=True)

        dim_conv = DimConv(channels, size, size).to(device)
        weights = (dim_conv.weight_channel, dim_conv.weight_height, dim_conv.weight_width)
        out.append(
            OpCase(
                op="DimConv",
                shape=shape,
                ours=lambda m=dim_conv, x=x: m(x),
                baseline=lambda w=weights, x=x: baseline_dim_conv(x, *w),
            )
        )

        x_last = x.detach().to(memory_format=torch.channels_last).requires_grad_()
        out.append(
            OpCase(
                op="DimConv channels-last",
                shape=shape,
                ours=lambda m=dim_conv, x=x_last: m(x),
                baseline=lambda w=weights, x=x_last: dim_conv_reference(x, w),
            )
        )

        dice = DiCE(channels, channels, size, size).to(device)
        dice_weights = (
            dice.dim_conv.weight_channel,
            dice.dim_conv.weight_height,
            dice.dim_conv.weight_width,
        )
        out.append(
            OpCase(
                op="DiCE",
                shape=shape,
                ours=lambda m=dice, x=x: m(x),
                baseline=lambda m=dice, w=dice_weights, x=x: m.dim_fuse(baseline_dim_conv(x, *w)),
            )
        )
    return out
