"""Learning-rate schedules built from torch's schedulers, sized by the run's total steps.

The task calls the configured factory as ``factory(optimizer, total_steps=...)`` once the trainer
knows how many optimiser steps the run takes, so configs never hard-code the run length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import (
    CosineAnnealingLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    SequentialLR,
)


def per_update(
    optimizer: Optimizer, scheduler_factory: Callable[..., LRScheduler] | None, task: Any
) -> dict:
    """``configure_optimizers``' answer for ``task`` (a LightningModule): ``optimizer`` and, unless
    ``scheduler_factory`` is None, its schedule sized by the run's optimiser steps
    (``task.trainer.estimated_stepping_batches``) and stepped after every update."""
    if scheduler_factory is None:
        return {"optimizer": optimizer}
    scheduler = scheduler_factory(
        optimizer, total_steps=int(task.trainer.estimated_stepping_batches)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


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
        raise ValueError(
            f"need total_steps >= 1 and warmup_steps >= 0, got {total_steps}, {warmup_steps}"
        )
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
        self,
        steps_per_epoch: int,
        eta_max: float,
        eta_min: float,
        cycle: int,
        halve_at: list[int],
        warmup_steps: int,
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
        return (
            warmup
            * (self.eta_max - (epoch % self.cycle) * self.eta_min)
            / self.eta_max
            * 0.5**halvings
        )


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
            "need epochs >= 1, cycle >= 1 and 0 < eta_min * (cycle - 1) < eta_max, got "
            f"epochs={epochs}, cycle={cycle}, eta_min={eta_min}, eta_max={eta_max}"
        )
    for group in optimizer.param_groups:
        if abs(group["lr"] - eta_max) > 1e-12:
            raise ValueError(f"set the optimiser's lr to eta_max ({eta_max}), got {group['lr']}")
    steps_per_epoch = max(total_steps // epochs, 1)
    schedule = CyclicWarmRestarts(
        steps_per_epoch, eta_max, eta_min, cycle, list(halve_at), warmup_steps
    )
    return LambdaLR(optimizer, schedule)


# fairseq's translation schedules (DeLighT's official scripts and the IWSLT'14 setup of Wu et al.,
# spec Secs. 6.2 and 6.4). Each is a LambdaLR whose multiplier of the optimiser's lr (the peak)
# gives fairseq's lr for an update count: fairseq sets the lr for update 0 at start and after
# update k that for k + 1, as LambdaLR does when stepped once per optimiser step. The multipliers
# are plain objects, so their state goes into checkpoints as numbers.


def _peaks(optimizer: Optimizer, warmup_init_lr: float, floor: float) -> list[float]:
    """Each parameter group's base lr (the schedule's peak; ``initial_lr`` where an earlier
    scheduler set it, as LambdaLR takes it), checked against the warm-up start and the floor."""
    peaks = [group.get("initial_lr", group["lr"]) for group in optimizer.param_groups]
    if warmup_init_lr < 0 or floor < 0 or min(peaks) <= max(floor, 0.0):
        raise ValueError(
            f"need warmup_init_lr >= 0 and every group's lr above the final lr >= 0, got "
            f"warmup_init_lr={warmup_init_lr}, final lr {floor}, lr {peaks}"
        )
    return peaks


class InverseSqrt:
    """fairseq's ``inverse_sqrt`` as a multiplier of ``peak``: linear from ``warmup_init_lr`` to
    ``peak`` over ``warmup_steps`` updates, then ``peak * sqrt(warmup_steps / step)``."""

    def __init__(self, peak: float, warmup_steps: int, warmup_init_lr: float) -> None:
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.warmup_init_lr = warmup_init_lr

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            lr = self.warmup_init_lr + step * (self.peak - self.warmup_init_lr) / self.warmup_steps
        else:
            lr = self.peak * math.sqrt(self.warmup_steps / step)
        return lr / self.peak


def inverse_sqrt(
    optimizer: Optimizer,
    total_steps: int,
    *,
    warmup_steps: int = 4000,
    warmup_init_lr: float = 1e-7,
) -> LRScheduler:
    """fairseq's ``inverse_sqrt`` (IWSLT'14 in Wu et al.: lr 5e-4, 4,000 warm-up updates from
    1e-7): ``warmup_init_lr + step * (lr - warmup_init_lr) / warmup_steps`` while
    ``step < warmup_steps``, then ``lr * sqrt(warmup_steps) / sqrt(step)``.

    The schedule does not depend on the run length; ``total_steps`` is checked only.
    """
    if total_steps < 1 or warmup_steps < 1:
        raise ValueError(
            f"need total_steps >= 1 and warmup_steps >= 1, got {total_steps}, {warmup_steps}"
        )
    peaks = _peaks(optimizer, warmup_init_lr, 0.0)
    return LambdaLR(optimizer, [InverseSqrt(p, warmup_steps, warmup_init_lr) for p in peaks])


class WarmupLinear:
    """DeLighT's ``linear`` schedule as a multiplier of ``peak``.

    The official code concatenates ``linspace(warmup_init_lr, peak, warmup_steps)`` and
    ``linspace(peak, end_lr, total_steps - warmup_steps + 1)`` and indexes it by the update
    count (``end_lr`` past the end); so the warm-up reaches the peak one update early and holds
    it for two updates.
    """

    def __init__(
        self, peak: float, total_steps: int, warmup_steps: int, warmup_init_lr: float, end_lr: float
    ) -> None:
        self.peak = peak
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.warmup_init_lr = warmup_init_lr
        self.end_lr = end_lr

    def __call__(self, step: int) -> float:
        warmup, peak = self.warmup_steps, self.peak
        if step < warmup:
            if warmup == 1:
                return self.warmup_init_lr / peak
            return (self.warmup_init_lr + step * (peak - self.warmup_init_lr) / (warmup - 1)) / peak
        if step >= self.total_steps:
            return self.end_lr / peak
        decay = (step - warmup) / (self.total_steps - warmup)
        return (peak + decay * (self.end_lr - peak)) / peak


def warmup_linear(
    optimizer: Optimizer,
    total_steps: int,
    *,
    warmup_steps: int,
    warmup_init_lr: float = 1e-7,
    end_lr: float = 1e-7,
) -> LRScheduler:
    """DeLighT's official ``linear`` schedule (WMT'16 En-Ro: 10,000 warm-up updates from 1e-7,
    then linear decay to 1e-7 at update 100,000): linear warm-up from ``warmup_init_lr`` to the
    optimiser's lr, then linear decay to ``end_lr`` at ``total_steps``, ``end_lr`` after.

    A run no longer than the warm-up (a debug run) gets a warm-up of ``total_steps - 1`` steps.
    """
    if total_steps < 1 or warmup_steps < 0:
        raise ValueError(
            f"need total_steps >= 1 and warmup_steps >= 0, got {total_steps}, {warmup_steps}"
        )
    peaks = _peaks(optimizer, warmup_init_lr, end_lr)
    warmup_steps = min(warmup_steps, total_steps - 1)
    return LambdaLR(
        optimizer,
        [WarmupLinear(p, total_steps, warmup_steps, warmup_init_lr, end_lr) for p in peaks],
    )


class WarmupCosinePeriod:
    """fairseq's ``cosine`` (t-mult 1, lr-shrink 1, as the official scripts run it) as a
    multiplier of ``peak``: ``warmup_init_lr + step * (peak - warmup_init_lr) / warmup_steps``
    during warm-up, then with ``t`` the updates since warm-up modulo ``period``,
    ``min_lr + 0.5 * (peak - min_lr) * (1 + cos(pi * t / period))`` (restarting each period)."""

    def __init__(
        self, peak: float, warmup_steps: int, warmup_init_lr: float, period: int, min_lr: float
    ) -> None:
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.warmup_init_lr = warmup_init_lr
        self.period = period
        self.min_lr = min_lr

    def __call__(self, step: int) -> float:
        peak = self.peak
        if step < self.warmup_steps:
            lr = self.warmup_init_lr + step * (peak - self.warmup_init_lr) / self.warmup_steps
        else:
            t = (step - self.warmup_steps) % self.period
            cosine = 1 + math.cos(math.pi * t / self.period)
            lr = self.min_lr + 0.5 * (peak - self.min_lr) * cosine
        return lr / peak


def warmup_cosine_period(
    optimizer: Optimizer,
    total_steps: int,
    *,
    warmup_steps: int,
    warmup_init_lr: float = 1e-7,
    period: int | None = None,
    min_lr: float = 1e-7,
) -> LRScheduler:
    """DeLighT's official cosine schedule: linear warm-up from ``warmup_init_lr`` to the
    optimiser's lr (the official ``--max-lr``), then cosine from it to ``min_lr`` (the official
    ``--lr`` floor) over ``period`` updates.

    ``period`` is ``total_steps - warmup_steps`` when None (WMT'14 En-De: 30,000 updates, 10,000
    warm-up, period 20,000, ending at ``min_lr``). WMT'14 En-Fr fixes it at 70,000 with 50,000
    updates, so training stops 40,000 updates in, at about 0.39 of the peak. A run no longer
    than the warm-up (a debug run) gets a warm-up of ``total_steps - 1`` steps.
    """
    if total_steps < 1 or warmup_steps < 0 or (period is not None and period < 1):
        raise ValueError(
            f"need total_steps >= 1, warmup_steps >= 0 and period >= 1, got {total_steps}, "
            f"{warmup_steps}, {period}"
        )
    peaks = _peaks(optimizer, warmup_init_lr, min_lr)
    warmup_steps = min(warmup_steps, total_steps - 1)
    period = total_steps - warmup_steps if period is None else period
    return LambdaLR(
        optimizer,
        [WarmupCosinePeriod(p, warmup_steps, warmup_init_lr, period, min_lr) for p in peaks],
    )


class HybridCyclicLinear:
    """Multiplier of EdgeNets' ``HybirdLR`` (``--lr-type hybrid``, detection) for the optimiser's
    lr ``base``, by epoch ``e``: 1 at epoch 0, then ``cycle - (e - 1) mod cycle`` (5, 4, 3, 2, 1
    times ``base`` for cycle 5) until epoch ``clr_max - 1``, then the linear decay
    ``1 - (e - clr_max + 1) / (epochs - clr_max + 1)`` (never below 0). A plain object (not a
    closure) so its state goes into checkpoints as numbers.
    """

    def __init__(self, steps_per_epoch: int, epochs: int, clr_max: int, cycle: int) -> None:
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.clr_max = clr_max
        self.cycle = cycle

    def __call__(self, step: int) -> float:
        epoch = step // self.steps_per_epoch
        if epoch == 0:
            return 1.0
        if epoch < self.clr_max:
            return float(self.cycle - (epoch - 1) % self.cycle)
        decay_epochs = max(self.epochs - self.clr_max + 1, 1)
        return max(0.0, 1.0 - (epoch - self.clr_max + 1) / decay_epochs)


def hybrid(
    optimizer: Optimizer,
    total_steps: int,
    *,
    epochs: int,
    clr_max: int = 61,
    cycle: int = 5,
) -> LRScheduler:
    """EdgeNets' hybrid detection schedule (``HybirdLR(lr, clr_max, epochs, cycle_len)``): the
    optimiser's lr for the first epoch, a cyclic schedule peaking at ``cycle`` times it up to epoch
    ``clr_max - 1``, then linear decay towards 0 at ``epochs``. With lr 0.01, ``clr_max`` 61 and
    100 epochs: 0.01; 0.05, 0.04, 0.03, 0.02, 0.01 (12 times); 0.00975 ... 0.00025.

    The thesis describes 50 cyclic and 50 decay epochs; this follows the code (61/39). The code
    rounds each lr to 6 decimals; this does not. ``epochs`` is the run length
    (``trainer.max_epochs``), so one epoch is ``total_steps // epochs`` steps; the lr is constant
    within an epoch.
    """
    if epochs < 1 or cycle < 1 or clr_max < 1:
        raise ValueError(
            f"need epochs, clr_max and cycle >= 1, got epochs={epochs}, clr_max={clr_max}, "
            f"cycle={cycle}"
        )
    steps_per_epoch = max(total_steps // epochs, 1)
    return LambdaLR(optimizer, HybridCyclicLinear(steps_per_epoch, epochs, clr_max, cycle))
