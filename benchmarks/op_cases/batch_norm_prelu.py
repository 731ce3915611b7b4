"""BatchNorm + PReLU in training at DiCENet s = 1.0 shapes (batch 8, channels-last as the networks
train): :func:`src.kernels.batch_norm_prelu.batch_norm_prelu`, one fused op (the C++ kernels on the
CPU, the Triton kernels on CUDA), against the two modules one after the other (on the CPU each with
its own backward kernel; cuDNN's BN and ATen's PReLU on CUDA). The forward row runs without
autograd, where both are the two modules (it measures the call overhead).
"""

from __future__ import annotations

import torch

from benchmarks.op_cases import OpCase, dicenet_activations
from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import batch_norm_prelu
from src.kernels.prelu import PReLU


def cases(device: torch.device) -> list[OpCase]:
    out = []
    impl = "triton" if device.type == "cuda" else "auto"
    for channels, shape, x in dicenet_activations(device):
        norm, act = BatchNorm2d(channels).to(device), PReLU(channels).to(device)
        out.append(
            OpCase(
                op="BatchNorm2d + PReLU (training)",
                shape=shape,
                ours=lambda x=x, n=norm, a=act, i=impl: batch_norm_prelu(x, n, a, impl=i),
                baseline=lambda x=x, n=norm, a=act: a(n(x)),
            )
        )
    return out
