"""Loading a state dict from a file into a network, safely and with a readable error."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import nn

from src.utils.state_dicts import mismatch_summary, project_network_state, torch_load


def load_state_dict_file(model: nn.Module, path: str | Path) -> None:
    """Load ``path`` into ``model``: a plain state dict, a dict holding one under ``state_dict``,
    or a Lightning checkpoint of this project (its network's entries).

    Tensors only (``weights_only=True``); a ``module.`` prefix from DataParallel is stripped.
    Raises ``KeyError`` summarising missing keys, unexpected keys and shape mismatches, and
    ``FileNotFoundError`` naming the path when it does not exist.
    """
    checkpoint = torch_load(path, "weights")
    state = project_network_state(checkpoint)
    if state is None:
        state = checkpoint
        if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
            state = state["state_dict"]
        if not isinstance(state, Mapping):
            raise KeyError(f"{path} holds a {type(state).__name__}, not a state dict")
        state = {k.removeprefix("module."): v for k, v in state.items()}
    problems = mismatch_summary(model.state_dict(), state)
    if problems:
        raise KeyError(f"{path} does not fit {type(model).__name__}: {problems}")
    model.load_state_dict(state)
