"""Relative attention at the Group-Transformer / Transformer-XL enwik8 sizes (8 heads of 32, 512
queries, a 512 memory: 1,024 keys), the score products to the value product, against the eager
path it replaces on the CPU (the same products and softmax kernel as separate ops, each
(B, H, T, K) tensor a fresh allocation).

On the CPU ours is ``src/kernels/relative_attention/one_node_cpu.py``, one autograd node with its
score buffers reused; on CUDA both run the eager path (the node is for the CPU).
"""

from __future__ import annotations

import torch

from benchmarks.op_cases import OpCase
from src.kernels.relative_attention import eager_relative_attention
from src.ops.relative_position import causal_memory_mask, relative_attention

HEADS, QUERIES, MEMORY, D_HEAD = 8, 512, 512, 32


def cases(device: torch.device) -> list[OpCase]:
    out = []
    mask = causal_memory_mask(QUERIES, MEMORY, device=device)
    keys = QUERIES + MEMORY
    for batch, dtype in ((1, torch.float32), (2, torch.float32), (2, torch.bfloat16)):
        shapes = [(batch, HEADS, QUERIES, D_HEAD), (batch, HEADS, keys, D_HEAD),
                  (batch, HEADS, keys, D_HEAD), (HEADS, keys, D_HEAD), (HEADS, D_HEAD),
                  (HEADS, D_HEAD)]  # fmt: skip
        q, k, v, rk, u, w = (
            torch.randn(s, device=device).to(dtype).requires_grad_() for s in shapes
        )

        def ours(q=q, k=k, v=v, rk=rk, u=u, w=w) -> torch.Tensor:
            return relative_attention(q, k, v, rk, u, w, mask=mask)

        def baseline(q=q, k=k, v=v, rk=rk, u=u, w=w) -> torch.Tensor:
            query_w, query_r = q + u.unsqueeze(-2), q + w.unsqueeze(-2)
            return eager_relative_attention(query_w, query_r, k, v, rk, mask, D_HEAD**-0.5)

        out.append(
            OpCase(
                op="relative attention",
                shape=f"B={batch} H={HEADS} T={QUERIES} K={keys} d={D_HEAD} {str(dtype)[6:]}",
                ours=ours,
                baseline=baseline,
            )
        )
    return out
