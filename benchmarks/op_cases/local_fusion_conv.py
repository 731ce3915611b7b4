"""DimFuse's local-fusion convolution (grouped 1x1, 3C -> C) at DiCENet s = 1.0 shapes (batch 8,
channels-last as the networks train), against ``F.conv2d`` with C groups (oneDNN on the CPU).

On the CPU ours is the one-pass C++ kernels of :mod:`src.kernels.local_fusion_conv`; on CUDA both
rows run ``F.conv2d``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.op_cases import OpCase, dicenet_activations
from src.kernels.local_fusion_conv import local_fusion_conv


def cases(device: torch.device) -> list[OpCase]:
    out = []
    for channels, shape, x in dicenet_activations(device):
        # DimConv's output of these activations: 3 responses per channel, interleaved
        fused = x.detach().repeat(1, 3, 1, 1).contiguous(memory_format=torch.channels_last)
        fused.requires_grad_()
        weight = torch.randn(channels, 3, 1, 1, device=device, requires_grad=True)
        out.append(
            OpCase(
                op="local fusion conv",
                shape=shape.replace(f"C={channels}", f"3C={3 * channels}"),
                ours=lambda x=fused, w=weight: local_fusion_conv(x, w),
                baseline=lambda x=fused, w=weight, c=channels: F.conv2d(x, w, groups=c),
            )
        )
    return out
