"""Benchmark cases, one module per op family; each defines ``cases(device) -> list[OpCase]``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class OpCase:
    """One op at one shape: our implementation against the step-by-step baseline.

    ``ours``, ``baseline`` and ``dense`` are zero-argument callables returning the output; the
    tensors they close over require grad where the forward+backward pass should reach them.
    ``flops`` is the forward FLOP count (2 per multiply-add), for GFLOP/s; ``dense`` is a plain
    GEMM with the same FLOPs, the rate to compare against.
    """

    op: str
    shape: str
    ours: Callable[[], Tensor]
    baseline: Callable[[], Tensor]
    flops: int | None = None
    dense: Callable[[], Tensor] | None = None


# DiCENet s = 1.0 activations, batch 8: (channels, height = width) of the stem's output and of a
# unit's input at each stage
DICENET_BATCH = 8
DICENET_ACTIVATIONS = ((24, 112), (116, 28), (232, 14), (464, 7))


def dicenet_activations(device: torch.device) -> list[tuple[int, str, Tensor]]:
    """(channels, shape label, input) per :data:`DICENET_ACTIVATIONS`: random, channels-last as
    the networks train, requiring grad."""
    out = []
    for channels, size in DICENET_ACTIVATIONS:
        x = torch.randn(DICENET_BATCH, channels, size, size, device=device)
        x = x.to(memory_format=torch.channels_last).requires_grad_()
        out.append((channels, f"B={DICENET_BATCH} C={channels} H=W={size} channels-last", x))
    return out
