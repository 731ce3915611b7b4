"""The relative-attention softmax at the Group-Transformer / Transformer-XL enwik8 sizes (8 heads,
512 queries, a 512 memory: 1,024 keys), against the eager ops it replaces (pad-and-reshape shift,
add, scale, causal mask, softmax).

On the CPU ours is ``src/kernels/relative_softmax/relative_softmax.cpp``, one pass each way; on CUDA
both run the eager ops (there the fused attention path takes the softmax).
"""

from __future__ import annotations

import torch

from benchmarks.op_cases import OpCase
from src.kernels.relative_softmax import relative_softmax, relative_softmax_reference
from src.ops.relative_position import causal_memory_mask

HEADS, QUERIES, MEMORY = 8, 512, 512
SCALE = 32**-0.5  # d_head = 256 / 8


def cases(device: torch.device) -> list[OpCase]:
    out = []
    mask = causal_memory_mask(QUERIES, MEMORY, device=device)
    for batch, dtype in ((1, torch.float32), (2, torch.float32), (2, torch.bfloat16)):
        shape = (batch, HEADS, QUERIES, QUERIES + MEMORY)
        content = torch.randn(shape, device=device).to(dtype).requires_grad_()
        position = torch.randn(shape, device=device).to(dtype).requires_grad_()
        out.append(
            OpCase(
                op="relative softmax",
                shape=f"B={batch} H={HEADS} T={QUERIES} K={QUERIES + MEMORY} {str(dtype)[6:]}",
                ours=lambda c=content, p=position: relative_softmax(c, p, mask, SCALE),
                baseline=lambda c=content, p=position: relative_softmax_reference(
                    c, p, mask, SCALE
                ),
            )
        )
    return out
