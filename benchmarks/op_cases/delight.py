"""DeLighT ops at the LM shape (d_m = 512, w_m = 2, N = 8, g_max = 16; 4,096 tokens).

Each case runs our op against a step-by-step PyTorch version of the same computation, written the
way the description reads: cut into groups with ``chunk``, one matmul per group, shuffle through a
separate view/transpose/contiguous, one LayerNorm per chunk, and the mixer as a list of chunks
concatenated. Both sides share the same parameters and compute the same result.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.op_cases import OpCase
from src.ops.dextra import DExTra, dextra_max_groups
from src.ops.group_linear import GroupLinear
from src.ops.shared_group_layer_norm import SharedGroupLayerNorm

D_M = 512
WIDTH_MULTIPLIER = 2.0
DEPTH = 8
BATCH, TOKENS = 8, 512  # 4,096 tokens


def step_by_step_glt(x: Tensor, weight: Tensor, bias: Tensor, shuffle: bool) -> Tensor:
    """GLT: chunk, per-group matmul, concatenate, then shuffle as its own copy.

    Shape:
        x (N, g*k), weight (g, k, n), bias (g, n) -> (N, g*n)
    """
    groups, _, n = weight.shape
    y = torch.cat(
        [chunk @ weight[i] + bias[i] for i, chunk in enumerate(x.chunk(groups, dim=-1))], dim=-1
    )
    if shuffle:
        # (N, g*n) -> (N, g, n) -> (N, n, g) -> (N, g*n)
        y = y.view(-1, groups, n).transpose(1, 2).contiguous().view(-1, groups * n)
    return y


def step_by_step_group_norm(
    y: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float
) -> Tensor:
    """Per-group LayerNorm: one ``F.layer_norm`` per chunk, concatenated."""
    n = y.shape[-1] // groups
    return torch.cat(
        [F.layer_norm(chunk, (n,), weight, bias, eps) for chunk in y.chunk(groups, dim=-1)], dim=-1
    )


def step_by_step_dextra(unit: DExTra, x: Tensor) -> Tensor:
    """DExTra layer by layer, in the official order, with the mixer as interleaved chunk lists.

    Shape:
        x (N, d_in) -> (N, o)
    """
    x0 = F.silu(unit.input_norm(unit.input_layer(x)))
    y = x0
    groups = unit.plan.groups
    for layer, (glt, norm) in enumerate(zip(unit.glts, unit.glt_norms, strict=True)):
        if layer > 0:
            pieces = zip(
                x0.chunk(groups[layer], dim=-1), y.chunk(groups[layer], dim=-1), strict=True
            )
            y = torch.cat([piece for pair in pieces for piece in pair], dim=-1)
        y = step_by_step_glt(y, glt.weight, glt.bias, shuffle=True)
        y = F.silu(step_by_step_group_norm(y, groups[layer], norm.weight, norm.bias, norm.eps))
    return F.silu(unit.output_norm(unit.output_layer(torch.cat([x0, y], dim=-1))))


def dextra_macs_per_token(unit: DExTra) -> int:
    """Multiply-adds of one token through the unit's linear maps (input, GLTs, output)."""
    plan = unit.plan
    glts = sum(
        d_in * d_out // g
        for g, d_in, d_out in zip(plan.groups, plan.in_widths, plan.out_widths, strict=True)
    )
    return (
        unit.in_features * unit.in_proj_features
        + glts
        + (unit.in_proj_features + unit.out_features) * unit.out_features
    )


def cases(device: torch.device) -> list[OpCase]:
    """GroupLinear at two layers of the unit, its per-group LayerNorm, and the whole DExTra."""
    torch.manual_seed(0)
    rows = BATCH * TOKENS
    unit = DExTra(
        D_M,
        D_M // 2,
        D_M // 2,
        width_multiplier=WIDTH_MULTIPLIER,
        depth=DEPTH,
        max_groups=dextra_max_groups(D_M),
        impl="reference",
    ).to(device)
    out: list[OpCase] = []
    plan = unit.plan
    for layer in (1, DEPTH // 2 - 1):
        g, d_in, d_out = plan.groups[layer], plan.in_widths[layer], plan.out_widths[layer]
        glt = GroupLinear(d_in, d_out, g, shuffle=True, impl="reference").to(device)
        x = torch.randn(rows, d_in, device=device, requires_grad=True)
        out.append(
            OpCase(
                op=f"GroupLinear(g={g}, shuffle)",
                shape=f"({rows}, {d_in}) -> ({rows}, {d_out})",
                ours=lambda glt=glt, x=x: glt(x),
                baseline=lambda glt=glt, x=x: step_by_step_glt(
                    x, glt.weight, glt.bias, shuffle=True
                ),
                flops=2 * rows * d_in * d_out // g,
            )
        )
    g, d_out = unit.plan.groups[3], unit.plan.out_widths[3]
    norm = SharedGroupLayerNorm(d_out, g).to(device)
    y = torch.randn(rows, d_out, device=device, requires_grad=True)
    out.append(
        OpCase(
            op=f"SharedGroupLayerNorm(g={g})",
            shape=f"({rows}, {d_out})",
            ours=lambda: norm(y),
            baseline=lambda: step_by_step_group_norm(y, g, norm.weight, norm.bias, norm.eps),
        )
    )
    x = torch.randn(BATCH, TOKENS, D_M, device=device, requires_grad=True)
    flops = 2 * rows * dextra_macs_per_token(unit)
    # a dense GEMM with the unit's forward FLOPs: (N, 1024) @ (1024, n)
    a = torch.randn(rows, 1024, device=device, requires_grad=True)
    b = torch.randn(1024, math.ceil(flops / (2 * rows * 1024)), device=device, requires_grad=True)
    out.append(
        OpCase(
            op=f"DExTra(d_m={D_M}, w_m={WIDTH_MULTIPLIER:g}, N={DEPTH})",
            shape=f"({BATCH}, {TOKENS}, {D_M}) -> ({BATCH}, {TOKENS}, {D_M // 2})",
            ours=lambda: unit(x),
            baseline=lambda: step_by_step_dextra(unit, x.view(rows, D_M)),
            flops=flops,
            dense=lambda: a @ b,
        )
    )
    return out
