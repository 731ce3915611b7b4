"""DiCENet s = 1.0's point-wise convolutions (batch 8, channels-last as the networks train): a
unit's reduction of its split half (a channel slice) at each stage, and a strided unit's C -> C
at stage 2: :func:`src.kernels.pointwise_conv.pointwise_conv`, products on the rows
on the CPU, against ``F.conv2d`` (oneDNN). The forward row runs without autograd, where both are
``F.conv2d``; on CUDA both are cuDNN's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.op_cases import DICENET_BATCH, OpCase
from src.kernels.pointwise_conv import pointwise_conv

# (channels, height = width, the input is a split half) of those convolutions
SHAPES = ((58, 28, True), (116, 14, True), (232, 7, True), (116, 28, False))


def cases(device: torch.device) -> list[OpCase]:
    out = []
    for channels, size, split in SHAPES:
        # a unit's reduction reads the second half of its input's channels, a strided view
        width = 2 * channels if split else channels
        x = torch.randn(DICENET_BATCH, width, size, size, device=device)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        weight = torch.randn(channels, channels, 1, 1, device=device, requires_grad=True)
        half = f" (half of {width})" if split else ""
        out.append(
            OpCase(
                op="Point-wise conv (training)",
                shape=f"B={DICENET_BATCH} C={channels}{half} H=W={size} channels-last",
                ours=lambda x=x, w=weight, c=channels: pointwise_conv(x[:, -c:], w, None),
                baseline=lambda x=x, w=weight, c=channels: F.conv2d(x[:, -c:], w),
                flops=2 * DICENET_BATCH * size * size * channels * channels,
            )
        )
    return out
