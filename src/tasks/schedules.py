"""Learning-rate schedules built from torch's schedulers, sized by the run's total steps.

The task calls the configured factory as ``factory(optimizer, total_steps=...)`` once the trainer
knows how many optimiser steps the run takes, so configs never hard-code the run length.
"""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, LRScheduler, SequentialLR


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


class CyclicWarmRestarts:
    """Learning-rate multiplier of ESPNetv2's cyclic schedule with warm restarts (thesis Eq. 2.1).

    At epoch t: ``eta_t = eta_max - (t mod T) * eta_min``, and the whole schedule is halved at each
    epoch listed in ``halve_at`` (Sec. 2.4.1: {50, 100, 130, 160, 190, 220, 250, 280}). A plain
    object (not a closure) so its state goes into checkpoints as numbers.
    """

    def __init__(
        self, steps_per_epoch: int, eta_max: float, eta_min: float, cycle: int, halve_at: list[int], warmup_steps: int
    ) -> None:
        self.steps_per_epoch = steps_per_epoch
        self.warmup_steps = warmup_steps
        self.eta_max = eta_max
        self.eta_min = eta_min
        self.cycle = cycle
        self.halve_at = sorted(halve_at)

    def __call__(self, step: int) -> float:
        epoch = step // self.steps_per_epoch
        halvings = sum(epoch >= boundary for boundary in self.halve_at)
        warmup = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        return warmup * (self.eta_max - (epoch % self.cycle) * self.eta_min) / self.eta_max * 0.5**halvings


def cyclic_warm_restarts(
    optimizer: Optimizer,
    total_steps: int,
    *,
    epochs: int,
    eta_max: float = 0.5,
    eta_min: float = 0.1,
    cycle: int = 5,
    halve_at: list[int] | tuple[int, ...] = (),
    warmup_steps: int = 0,
) -> LRScheduler:
    """ESPNetv2's Eq. 2.1 schedule, stepped every optimiser step but constant within an epoch.

    The optimiser's learning rate must be ``eta_max``; ``epochs`` is the run length
    (``trainer.max_epochs``), so one epoch is ``total_steps // epochs`` steps. ``warmup_steps``
    optionally ramps the first steps linearly (not in the thesis; 0 by default).
    """
    if epochs < 1 or cycle < 1 or not 0 < eta_min * (cycle - 1) < eta_max:
        raise ValueError(
            f"need epochs >= 1, cycle >= 1 and 0 < eta_min * (cycle - 1) < eta_max, got epochs={epochs}, "
            f"cycle={cycle}, eta_min={eta_min}, eta_max={eta_max}"
        )
    for group in optimizer.param_groups:
        if abs(group["lr"] - eta_max) > 1e-12:
            raise ValueError(f"set the optimiser's lr to eta_max ({eta_max}), got {group['lr']}")
    steps_per_epoch = max(total_steps // epochs, 1)
    schedule = CyclicWarmRestarts(steps_per_epoch, eta_max, eta_min, cycle, list(halve_at), warmup_steps)
    return LambdaLR(optimizer, schedule)
