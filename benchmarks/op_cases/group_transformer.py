"""Group-Transformer's group attention and group FFN at the paper's enwik8 shapes (Table 2).

D = 256, H = 8, d_inner = 4D, 512 target and 512 memory positions, G in {2, 4}; batch 1 (the
paper trains at batch 22) so one forward+backward stays under about a second on a CPU. The
baselines follow the paper and the official code step by step: one matmul per group after a
split, per-chunk norms, separate key and value maps, an explicit shuffle copy, concatenations.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from benchmarks.op_cases import OpCase
from src.ops.group_attention import GroupAttention
from src.ops.group_feedforward import GroupFeedForward
from src.ops.per_group_layer_norm import PerGroupLayerNorm
from src.ops.relative_position import relative_sinusoid

D_MODEL, N_HEAD, TGT_LEN, MEM_LEN, BATCH = 256, 8, 512, 512, 1


def norm_step_by_step(x: Tensor, norm: PerGroupLayerNorm) -> Tensor:
    """Normalise each chunk separately, concatenate, then the full-width affine."""
    chunks = []
    for chunk in x.chunk(norm.groups, dim=-1):
        mean, std = chunk.mean(-1, keepdim=True), chunk.std(-1, keepdim=True)
        chunks.append((chunk - mean) / (std + norm.eps))
    return torch.cat(chunks, -1) * norm.weight + norm.bias


def group_linear_step_by_step(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """One matmul per group on the split input, concatenated; weight (G, in/G, out/G)."""
    outs = []
    for g, chunk in enumerate(x.chunk(weight.shape[0], dim=-1)):
        out = chunk @ weight[g]
        outs.append(out if bias is None else out + bias[g])
    return torch.cat(outs, -1)


def rel_shift_step_by_step(x: Tensor) -> Tensor:
    """Transformer-XL's shift of time-major scores [T, K, B, H] by zero-padding and reshaping."""
    qlen, klen = x.shape[:2]
    padded = torch.cat([x.new_zeros(qlen, 1, *x.shape[2:]), x], 1)  # [T, K+1, B, H]
    return padded.view(klen + 1, qlen, *x.shape[2:])[1:].view_as(x)


def attention_step_by_step(
    attn: GroupAttention, h: Tensor, memory: Tensor, r: Tensor, r_w_bias: Tensor, r_r_bias: Tensor
) -> Tensor:
    """The official layer's recipe in its time-major layout, one group at a time."""
    groups, n_head, d_head = attn.groups, attn.n_head, attn.d_head
    h_t, m_t = h.transpose(0, 1), memory.transpose(0, 1)  # [T, B, D], [M, B, D]
    qlen, batch, _ = h_t.shape
    a = norm_step_by_step(h_t, attn.q_norm)
    inter_q = a @ attn.inter_q_net.weight.t()
    q_groups = [
        chunk @ attn.q_net.weight[g] + inter_q for g, chunk in enumerate(a.chunk(groups, -1))
    ]
    q = torch.cat(q_groups, -1).view(qlen, batch, n_head, d_head)
    c = norm_step_by_step(torch.cat([m_t, h_t], 0), attn.kv_norm)
    klen = c.shape[0]
    w_k, w_v = attn.kv_net.weight.chunk(2, 0)
    k = (c @ w_k.t()).view(klen, batch, n_head, d_head)
    v = (c @ w_v.t()).view(klen, batch, n_head, d_head)
    rk = group_linear_step_by_step(r, attn.r_net.weight, None).view(klen, n_head, d_head)
    ac = torch.einsum("ibnd,jbnd->ijbn", q + r_w_bias, k)
    bd = rel_shift_step_by_step(torch.einsum("ibnd,jnd->ijbn", q + r_r_bias, rk))
    scores = (ac + bd) / math.sqrt(d_head)
    mask = torch.triu(torch.ones(qlen, klen, dtype=torch.bool, device=h.device), klen - qlen + 1)
    scores = scores.masked_fill(mask[:, :, None, None], float("-inf"))
    prob = torch.softmax(scores, dim=1)
    ov = torch.einsum("ijbn,jbnd->ibnd", prob, v).reshape(qlen, batch, -1)
    inter_o = ov @ attn.inter_o_net.weight.t()
    o_groups = [
        chunk @ attn.o_net.weight[g] + inter_o for g, chunk in enumerate(ov.chunk(groups, -1))
    ]
    return (h_t + torch.cat(o_groups, -1)).transpose(0, 1)


def feedforward_step_by_step(ffn: GroupFeedForward, x: Tensor) -> Tensor:
    """The official FFN recipe: per-group maps, an explicit shuffle copy, per-group concats."""
    groups, d_group = ffn.groups, ffn.d_group
    inter = ffn.inter_linear
    t = group_linear_step_by_step(norm_step_by_step(x, ffn.inter_norm), inter.weight, inter.bias)
    perm = [(j % groups) * d_group + j // groups for j in range(ffn.d_model)]
    t = t.index_select(-1, torch.tensor(perm, device=x.device))
    z = torch.cat(
        [torch.cat([xg, tg], -1) for xg, tg in zip(x.chunk(groups, -1), t.chunk(groups, -1))], -1
    )
    lin1, lin2 = ffn.intra_linear_1, ffn.intra_linear_2
    y = group_linear_step_by_step(norm_step_by_step(z, ffn.input_norm), lin1.weight, lin1.bias)
    y = torch.relu(y)
    y = group_linear_step_by_step(norm_step_by_step(y, ffn.hidden_norm), lin2.weight, lin2.bias)
    return x + y


def cases(device: torch.device) -> list[OpCase]:
    """Group attention and group FFN at G = 2 and 4."""
    gen = torch.Generator().manual_seed(0)
    d, b = D_MODEL, BATCH
    klen = MEM_LEN + TGT_LEN
    out = []
    for groups in (2, 4):
        attn = GroupAttention(d, N_HEAD, groups).to(device).eval()
        h = torch.randn(b, TGT_LEN, d, generator=gen).to(device).requires_grad_()
        memory = torch.randn(b, MEM_LEN, d, generator=gen).to(device)
        r = relative_sinusoid(klen, d, device=device)
        biases = (torch.randn(2, N_HEAD, d // N_HEAD, generator=gen) * 0.1).to(device)
        r_w_bias, r_r_bias = biases[0].requires_grad_(), biases[1].requires_grad_()
        # weight MACs (q, o: 4D^2/G per query; k, v: 2D^2 and r: D^2/G per key) + 3 T K D
        macs = TGT_LEN * 4 * d * d // groups + klen * (2 * d * d + d * d // groups)
        macs += 3 * TGT_LEN * klen * d
        out.append(
            OpCase(
                op=f"group_attention_G{groups}",
                shape=f"B{b} T{TGT_LEN} M{MEM_LEN} D{d} H{N_HEAD} (paper B22)",
                ours=lambda a=attn, h=h, m=memory, r=r, u=r_w_bias, v=r_r_bias: a(h, r, u, v, m),
                baseline=lambda a=attn, h=h, m=memory, r=r, u=r_w_bias, v=r_r_bias: (
                    attention_step_by_step(a, h, m, r, u, v)
                ),
                flops=2 * b * macs,
            )
        )
        ffn = GroupFeedForward(d, 4 * d, groups).to(device).eval()
        x = torch.randn(b, TGT_LEN, d, generator=gen).to(device).requires_grad_()
        out.append(
            OpCase(
                op=f"group_ffn_G{groups}",
                shape=f"B{b} T{TGT_LEN} D{d} d_inner{4 * d} (paper B22)",
                ours=lambda f=ffn, x=x: f(x),
                baseline=lambda f=ffn, x=x: feedforward_step_by_step(f, x),
                flops=2 * b * TGT_LEN * 13 * d * d // groups,
            )
        )
    return out
