"""Best and last checkpoints: Lightning's ``ModelCheckpoint`` with ``last.ckpt`` always the latest.

Lightning 2.6 writes ``last.ckpt`` only when it also writes a top-k checkpoint in the same step
(or links it to the last top-k file with ``save_last="link"``). With ``save_top_k: 1`` a run whose
monitored metric stops improving then keeps ``last.ckpt`` at the best epoch, and resuming from it
replays the epochs after it. Here ``last.ckpt`` is rewritten wherever Lightning would save
(every evaluation, or every training epoch when it saves there), improvement or not, which is what
resume, the interrupt handler and the README promise.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint


class ModelCheckpoint(LightningModelCheckpoint):
    """``lightning.pytorch.callbacks.ModelCheckpoint`` (same arguments) whose ``save_last``
    checkpoint follows every save point, not only those where a top-k checkpoint was written."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)

    def _save_last_if_missed(self, trainer: L.Trainer) -> None:
        # skipped when anything was saved at this step already (then last.ckpt was too), in
        # sanity checks, fast_dev_run and outside fitting
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
