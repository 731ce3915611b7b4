"""Learning-rate schedules built from torch's schedulers, sized by the run's total steps.

The task calls the configured factory as ``factory(optimizer, total_steps=...)`` once the trainer
knows how many optimiser steps the run takes, so configs never hard-code the run length.
"""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR


def warmup_cosine(
    optimizer: Optimizer,
    total_steps: int,
    *,
    warmup_steps: int = 0,
    eta_min: float = 0.0,
) -> LRScheduler:
    """Linear warm-up from ``lr / warmup_steps`` to ``lr`` over ``warmup_steps``, then cosine
    decay to ``eta_min`` over the remaining steps.

    A run shorter than the warm-up (a debug run) gets a warm-up of ``total_steps - 1`` steps.
    """
    if total_steps < 1 or warmup_steps < 0:
        raise ValueError(f"need total_steps >= 1 and warmup_steps >= 0, got {total_steps}, {warmup_steps}")
    warmup_steps = min(warmup_steps, total_steps - 1)
    cosine = CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps, eta_min=eta_min)
    if warmup_steps == 0:
        return cosine
    warmup = LinearLR(optimizer, start_factor=1.0 / warmup_steps, total_iters=warmup_steps)
    return SequentialLR(optimizer, [warmup, cosine], milestones=[warmup_steps])
