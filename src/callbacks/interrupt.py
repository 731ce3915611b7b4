"""Stop a run on Ctrl-C (SIGINT) or SIGTERM with a checkpoint, losing at most the current step.

SLURM pre-emption and ``scancel`` send SIGTERM; Lightning then raises ``SIGTERMException`` at the
next step boundary. Ctrl-C raises ``KeyboardInterrupt`` wherever the program is, possibly half way
through an optimiser step, so this callback turns the first Ctrl-C into a request that is served
at the next batch boundary (a second Ctrl-C stops at once, without a checkpoint). Either way the
checkpoint ``interrupted.ckpt`` is written next to the others; ``train.py`` then records the
interruption in ``metrics.json`` and prints the command that resumes the run.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)

FILENAME = "interrupted.ckpt"


class InterruptCheckpoint(Callback):
    """Save ``<dirpath>/interrupted.ckpt`` when training is stopped by SIGINT or SIGTERM.

    After the run, ``signum`` is the signal that stopped it (None if none) and ``path`` the
    checkpoint written (None if none).
    """

    def __init__(self, dirpath: str | Path) -> None:
        self.dirpath = Path(dirpath)
        self.signum: int | None = None
        self.path: Path | None = None
        self._requested = False
        self._forced = False
        self._previous: Any = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._requested:  # the second Ctrl-C: stop now, mid-step, so without a checkpoint
            self._forced = True
            raise KeyboardInterrupt
        self._requested = True
        log.warning(
            "Ctrl-C: stopping after this step with a checkpoint (Ctrl-C again stops at once)"
        )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # handlers can only be set from the main thread (not in a launcher's worker thread)
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _serve_request(self) -> None:
        if self._requested:
            raise KeyboardInterrupt

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self._serve_request()

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.state.fn == "fit":
            self._serve_request()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
        if isinstance(exception, SIGTERMException):
            self.signum = int(signal.SIGTERM)
        elif isinstance(exception, KeyboardInterrupt):
            self.signum = int(signal.SIGINT)
        else:
            return
        if trainer.state.fn != "fit" or self._forced:
            return
        self.path = self.dirpath / FILENAME
        # the whole state (optimisers, loops, callbacks) for the resume, which loads it with
        # torch.load(weights_only=True): tensors and plain data only
        trainer.save_checkpoint(self.path, weights_only=False)
        log.warning(
            "stopped by signal %d at global step %d: saved %s",
            self.signum,
            trainer.global_step,
            self.path,
        )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()
