"""Training-mode BatchNorm at DiCENet s = 1.0 shapes (batch 8, channels-last as the networks
train), against ``nn.BatchNorm2d``, whose backward is ATen's kernel.

The forward is ATen's in both (the row measures the call overhead); the forward+backward row is
the two-pass channels-last backward of ``src/ops/cpu/batch_norm.cpp`` on the CPU. On CUDA both run
ATen (cuDNN).
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.op_cases import OpCase
from src.ops.batch_norm import BatchNorm2d

BATCH = 8
# (channels, height = width): the stem's output, a unit's width at each stage
SHAPES = ((24, 112), (116, 28), (232, 14), (464, 7))


def cases(device: torch.device) -> list[OpCase]:
    out = []
    for channels, size in SHAPES:
        x = torch.randn(BATCH, channels, size, size, device=device)
        x = x.to(memory_format=torch.channels_last).requires_grad_()
        ours = BatchNorm2d(channels).to(device)
        theirs = nn.BatchNorm2d(channels).to(device)
        out.append(
            OpCase(
                op="BatchNorm2d (training)",
                shape=f"B={BATCH} C={channels} H=W={size} channels-last",
                ours=lambda m=ours, x=x: m(x),
                baseline=lambda m=theirs, x=x: m(x),
            )
        )
    return out
