"""PReLU at DiCENet s = 1.0 shapes (batch 8, channels-last as the networks train), against
``F.prelu``, whose backward is ATen's kernel.

The forward is ATen's in both (the row measures the call overhead); the forward+backward row is
the one-pass backward of ``src/kernels/prelu/prelu.cpp`` on the CPU. On CUDA both run ATen.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.op_cases import OpCase, dicenet_activations
from src.kernels.prelu import prelu


def cases(device: torch.device) -> list[OpCase]:
    out = []
    for channels, shape, x in dicenet_activations(device):
        weight = torch.full((channels,), 0.25, device=device, requires_grad=True)
        out.append(
            OpCase(
                op="PReLU",
                shape=shape,
                ours=lambda x=x, w=weight: prelu(x, w),
                baseline=lambda x=x, w=weight: F.prelu(x, w),
            )
        )
    return out
