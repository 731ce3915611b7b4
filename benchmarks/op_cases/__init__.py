"""Benchmark cases, one module per op family; each defines ``cases(device) -> list[OpCase]``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
