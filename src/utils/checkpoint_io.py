"""Checkpoint writing that never leaves a half-written file behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from src.utils.files import atomic_path


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint whole or not at all (:func:`src.utils.files.atomic_path`), fsynced
    before the rename, so a crash (or a full disk) while saving leaves the previous checkpoint of
    that name intact. Loading uses ``weights_only=True``.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__} takes no storage_options, got {storage_options}"
            )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as temporary, open(temporary, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())

    def load_checkpoint(
        self, path: str | Path, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if weights_only is False:
            raise ValueError("checkpoints are loaded with weights_only=True only")
        if map_location is None:
            return super().load_checkpoint(path, weights_only=True)
        return super().load_checkpoint(path, map_location=map_location, weights_only=True)
