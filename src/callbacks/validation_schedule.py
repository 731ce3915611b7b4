"""Say when a run's limits end it before it ever validates.

A run ranks its checkpoints by a validation metric, so a run that never validates has no best
checkpoint (``best_checkpoint: null`` in ``metrics.json``). That happens when
``trainer.max_steps`` (or ``max_epochs``, ``limit_train_batches``) stops training before the first
validation that ``val_check_interval`` and ``check_val_every_n_epoch`` schedule; Lightning says
nothing about it. :class:`ValidationSchedule` warns at the start when the schedule shows it, and at
the end when no validation ran.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)

# ++: trainer/default.yaml has no val_check_interval (Lightning's default, 1.0: once an epoch)
FIX = (
    "validate sooner (++trainer.val_check_interval=<batches>, trainer.check_val_every_n_epoch) or "
    "train longer (trainer.max_steps, trainer.max_epochs)"
)


def first_validation_batch(trainer: Any) -> int | None:
    """How many training batches a fresh run reads before its first validation, by Lightning's
    rule (``val_check_batch`` counts batches of the epoch, or of the run when
    ``check_val_every_n_epoch`` is None); None when it cannot be known (validation by time, or
    epochs of unknown length)."""
    every = trainer.val_check_batch  # batches; None: validation by wall time
    per_epoch = trainer.num_training_batches
    if every is None or math.isinf(every):
        return None
    if trainer.check_val_every_n_epoch is None:
        return int(every)
    if math.isinf(per_epoch):
        return None
    return (trainer.check_val_every_n_epoch - 1) * int(per_epoch) + int(every)


def training_batches(trainer: Any) -> tuple[int, str] | None:
    """The most training batches the run's limits allow and the limit that sets it
    (``trainer.max_steps=50``); None when nothing bounds it."""
    limits = []
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        # one optimiser step a accumulate_grad_batches batches
        batches = trainer.max_steps * trainer.accumulate_grad_batches
        limits.append((batches, f"trainer.max_steps={trainer.max_steps}"))
    per_epoch = trainer.num_training_batches
    if trainer.max_epochs is not None and trainer.max_epochs >= 0 and not math.isinf(per_epoch):
        limits.append(
            (
                trainer.max_epochs * int(per_epoch),
                f"trainer.max_epochs={trainer.max_epochs} of {int(per_epoch)} batches",
            )
        )
    return min(limits) if limits else None


class ValidationSchedule(Callback):
    """Warn when validation will not run (at the start) or did not run (at the end) in a run
    that has validation; its count of validations is kept in checkpoints, so a resumed run
    remembers those before it."""

    def __init__(self) -> None:
        self.validations = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.enable_validation or trainer.global_step > 0 or not trainer.is_global_zero:
            return
        first, limit = first_validation_batch(trainer), training_batches(trainer)
        if first is None or limit is None or first <= limit[0]:
            return
        log.warning(
            "validation will never run: %s ends training after %d batch(es), before the first "
            "validation after batch %d (val_check_interval=%s, check_val_every_n_epoch=%s, %s "
            "batches an epoch), so no checkpoint is ranked and best_checkpoint will be null; %s",
            limit[1], limit[0], first, trainer.val_check_interval,
            trainer.check_val_every_n_epoch, trainer.num_training_batches, FIX,
        )  # fmt: skip

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.validations += 1

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.enable_validation and self.validations == 0 and trainer.is_global_zero:
            log.warning(
                "validation never ran in %d step(s): no checkpoint was ranked, so best_checkpoint "
                "is null; %s",
                trainer.global_step, FIX,
            )  # fmt: skip

    def state_dict(self) -> dict[str, int]:
        return {"validations": self.validations}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.validations = state_dict["validations"]
