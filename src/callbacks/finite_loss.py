"""Stop a run at the first non-finite loss, before it reaches the weights or a checkpoint."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import Tensor


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


class FiniteLossGuard(Callback):
    """Raise :class:`NonFiniteLossError` when the loss is not finite.

    The check runs before backward, so the optimiser never applies the bad step, and the run
    ends with an exception, so no checkpoint is written after it: ``last.ckpt`` keeps the last
    good state and the message says where it is.
    """

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor
    ) -> None:
        if torch.isfinite(loss).all():
            return
        message = (
            f"non-finite training loss ({loss.detach().float().item()}) at global step "
            f"{trainer.global_step} (epoch {trainer.current_epoch}); the run is stopped."
        )
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath is not None:
            last = (
                Path(checkpoint.dirpath)
                / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
            )
            if last.is_file():
                message += (
                    f" The last good checkpoint is kept at {last}; resume with ckpt_path={last}"
                )
            else:
                message += " No checkpoint had been written yet."
        message += " Lower the learning rate or check the data for NaNs before resuming."
        raise NonFiniteLossError(message)
