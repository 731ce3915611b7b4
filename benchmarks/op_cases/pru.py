"""PRU cases at the PTB model's first layer (thesis Table 4.1: N = 400, M = 1400, g = 4, K = 2).

The baselines follow the paper step by step: per level pool, a separate linear map, split into the
four gates, concatenate per gate. The pyramid baseline does that once over all T x B inputs, as
ours does (no time loop on either side); the layer baseline does it at every time step, with the
context GLT as one matrix product per group, concatenated per gate. Both sides share parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.op_cases import OpCase
from src.ops.pru import PRU, PRUCell
from src.ops.pyramidal import PyramidalTransform

STEPS, BATCH = 35, 20  # the PTB recipe's BPTT length and batch size
# the layer's step-by-step baseline takes seconds per call on 2 cores: fewer steps, same batch
LAYER_STEPS = 10
INPUT, HIDDEN, GROUPS, LEVELS = 400, 1400, 4, 2


def baseline_pyramid(pyramid: PyramidalTransform, x: Tensor) -> Tensor:
    """(..., N) -> (..., 4, M), level by level and gate by gate."""
    per_gate: list[list[Tensor]] = [[], [], [], []]
    level = x
    for k, transform in enumerate(pyramid.transforms):
        if k:
            kernel = 2 * (pyramid.levels - k) + 1
            # (..., n) -> (R, 1, n) -> (R, 1, n / 2) -> (..., n / 2)
            pooled = F.avg_pool1d(
                level.reshape(-1, 1, level.shape[-1]), kernel, stride=2, padding=kernel // 2
            )
            level = pooled.reshape(*level.shape[:-1], -1)
        out = F.linear(level, transform.weight, transform.bias)
        for chunks, chunk in zip(per_gate, out.chunk(4, dim=-1)):
            chunks.append(chunk)
    gates = [torch.cat(chunks, dim=-1) for chunks in per_gate]
    if pyramid.residual:
        gates = [gate + x for gate in gates]
    return torch.stack(gates, dim=-2)


def baseline_context(cell: PRUCell, h: Tensor) -> Tensor:
    """(B, M) -> (B, 4, M): one product per group, then each gate's blocks concatenated."""
    glt = cell.context.glt
    per_gate: list[list[Tensor]] = [[], [], [], []]
    for h_j, weight, bias in zip(h.chunk(glt.groups, dim=-1), glt.weight, glt.bias):
        for chunks, block in zip(per_gate, (h_j @ weight + bias).chunk(4, dim=-1)):
            chunks.append(block)
    return torch.stack([torch.cat(chunks, dim=-1) for chunks in per_gate], dim=-2)


def baseline_layer(cell: PRUCell, x: Tensor) -> Tensor:
    """(T, B, N) -> (T, B, M), everything (the pyramid included) recomputed at each step."""
    h = c = x.new_zeros(x.shape[1], cell.hidden_size)
    outputs = []
    for x_t in x:
        pre = baseline_pyramid(cell.pyramid, x_t) + baseline_context(cell, h)
        f, g, i, o = pre.unbind(-2)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs)


def pyramid_flops(pyramid: PyramidalTransform, rows: int) -> int:
    return 2 * rows * sum(t.in_features * t.out_features for t in pyramid.transforms)


def cases(device: torch.device) -> list[OpCase]:
    rows = STEPS * BATCH
    result = []
    for in_features in (INPUT, HIDDEN):  # layer 0 and the residual layer 1
        pyramid = PyramidalTransform(in_features, HIDDEN, levels=LEVELS).to(device)
        x = torch.randn(STEPS, BATCH, in_features, device=device, requires_grad=True)
        result.append(
            OpCase(
                op="pru.pyramidal_transform",
                shape=f"T{STEPS} B{BATCH} N{in_features} M{HIDDEN} K{LEVELS}",
                ours=lambda pyramid=pyramid, x=x: pyramid(x),
                baseline=lambda pyramid=pyramid, x=x: baseline_pyramid(pyramid, x),
                flops=pyramid_flops(pyramid, rows),
            )
        )
    layer = PRU(INPUT, HIDDEN, groups=GROUPS, levels=LEVELS).to(device)
    x = torch.randn(LAYER_STEPS, BATCH, INPUT, device=device, requires_grad=True)
    cell = layer.cells[0]
    rows = LAYER_STEPS * BATCH
    context_flops = 2 * rows * HIDDEN * 4 * HIDDEN // GROUPS
    result.append(
        OpCase(
            op="pru.layer",
            shape=f"T{LAYER_STEPS} B{BATCH} N{INPUT} M{HIDDEN} g{GROUPS} K{LEVELS}",
            ours=lambda: layer(x)[0],
            baseline=lambda: baseline_layer(cell, x),
            flops=pyramid_flops(cell.pyramid, rows) + context_flops,
        )
    )
    return result
