"""Carry the global random-number state through checkpoints, so a resumed run is exact.

Lightning restores weights, optimiser, scheduler, loops and callbacks, but not the global RNGs
that drive data shuffling, augmentation and dropout. This callback stores them with every
checkpoint and puts them back right before training continues. A run resumed from an
end-of-epoch checkpoint then sees the same batches and random draws as an uninterrupted one.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class RNGStateCheckpoint(Callback):
    """Save torch (CPU and CUDA) and Python RNG states in checkpoints; restore them on resume."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    @staticmethod
    def _collect() -> dict[str, Any]:
        version, state, gauss = random.getstate()
        return {
            "torch": torch.get_rng_state(),
            "torch.cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            # plain ints and lists, so the checkpoint loads with weights_only=True
            "python": [version, list(state), gauss],
        }

    @staticmethod
    def _apply(states: dict[str, Any]) -> None:
        torch.set_rng_state(states["torch"])
        cuda_states = states["torch.cuda"]
        if (
            cuda_states
            and torch.cuda.is_available()
            and len(cuda_states) == torch.cuda.device_count()
        ):
            torch.cuda.set_rng_state_all(cuda_states)
        version, state, gauss = states["python"]
        random.setstate((version, tuple(state), gauss))

    def state_dict(self) -> dict[str, Any]:
        return self._collect()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict
        self._apply(state_dict)

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The sanity-check validation draws random numbers (data-loader seeds) that the
        # uninterrupted run did not draw at this point; undo that.
        if self._pending is not None:
            self._apply(self._pending)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pending = None
