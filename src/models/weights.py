"""Loading a state dict from a file into a network, safely and with a readable error."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def load_state_dict_file(model: nn.Module, path: str | Path) -> None:
    """Load ``path`` (a plain state dict, or a dict holding one under ``state_dict``) into ``model``.

    Tensors only (``weights_only=True``); a ``module.`` prefix from DataParallel is stripped.
    Raises ``KeyError`` listing missing and unexpected keys, and ``FileNotFoundError`` naming the
    path when it does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    state = {k.removeprefix("module."): v for k, v in state.items()}
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise KeyError(
            f"{path} does not fit {type(model).__name__}: "
            f"missing keys {result.missing_keys}, unexpected keys {result.unexpected_keys}"
        )
