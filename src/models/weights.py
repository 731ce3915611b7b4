"""Loading a state dict from a file into a network, safely and with a readable error."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def load_state_dict_file(model: nn.Module, path: str | Path) -> None:
    """Load ``path`` (a plain state dict, or a dict holding one under ``state_dict``) into ``model``.

    Tensors only (``weights_only=True``); a ``module.`` prefix from DataParallel is stripped.
    Raises ``KeyError`` listing missing keys, unexpected keys and shape mismatches, and
    ``FileNotFoundError`` naming the path when it does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    state = {k.removeprefix("module."): v for k, v in state.items()}
    expected = model.state_dict()
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    mismatched = [
        f"{key}: file {tuple(state[key].shape)} vs model {tuple(value.shape)}"
        for key, value in expected.items()
        if key in state and state[key].shape != value.shape
    ]
    if missing or unexpected or mismatched:
        raise KeyError(
            f"{path} does not fit {type(model).__name__}: missing keys {missing}, "
            f"unexpected keys {unexpected}, shape mismatches {mismatched}"
        )
    model.load_state_dict(state)
