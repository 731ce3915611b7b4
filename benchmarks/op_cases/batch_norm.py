"""Training-mode BatchNorm at DiCENet s = 1.0 shapes (batch 8, channels-last as the networks
train), against ``nn.BatchNorm2d``, whose backward is ATen's kernel.

The forward is ATen's in both (the row measures the call overhead); the forward+backward row is
the two-pass channels-last backward of ``src/kernels/batch_norm/batch_norm.cpp`` on the CPU. On CUDA
both run ATen (cuDNN).
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.op_cases import OpCase, dicenet_activations
from src.kernels.batch_norm import BatchNorm2d


def cases(device: torch.device) -> list[OpCase]:
    out = []
    for channels, shape, x in dicenet_activations(device):
        ours = BatchNorm2d(channels).to(device)
        theirs = nn.BatchNorm2d(channels).to(device)
        out.append(
            OpCase(
                op="BatchNorm2d (training)",
                shape=shape,
                ours=lambda m=ours, x=x: m(x),
                baseline=lambda m=theirs, x=x: m(x),
            )
        )
    return out
