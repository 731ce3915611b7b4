"""A model that cannot be built at the sizes asked for, explained in the ``model.*`` keys.

A network's constructor checks its sizes in its own terms (a DExTra schedule's group widths, an
attention's heads); the user set ``model.d_model`` and ``model.width_multiplier``. So when the
constructor refuses, the nearest ``model.d_model`` values that build, the other keys as they
are, are found by building candidates on the ``meta`` device (no memory, about 0.05 s each)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from src.utils.errors import UserError

# the width a user sets, searched for values that build
SEARCHED = "d_model"
# keys that decide whether the sizes fit, named in the message when the config has them
SIZE_KEYS = ("d_model", "width_multiplier", "max_groups", "n_min", "n_max", "n_head", "n_group",
             "groups", "d_inner", "embedding_dim")  # fmt: skip
SPAN, BUDGET_S = 64, 15.0


class ModelSizeError(UserError, ValueError):
    """Sizes the model cannot be built with; the message names the keys and values that fit."""


Build = Callable[[dict], object]  # a model config -> the model (the tools pass Hydra's instantiate)


def builds(model: Mapping[str, Any], build: Build) -> bool:
    """Whether ``model`` (a resolved model config) builds, on the meta device."""
    try:
        with torch.device("meta"):
            build(dict(model))
    except Exception:  # any refusal: this candidate does not build
        return False
    return True


def nearest_that_build(
    model: Mapping[str, Any], build: Build, key: str = SEARCHED
) -> tuple[int | None, int | None]:
    """The nearest values of ``model[key]`` below and above it with which ``model`` builds (None
    where none within :data:`SPAN`, or the search ran out of :data:`BUDGET_S`)."""
    value, below, above = int(model[key]), None, None
    start = time.monotonic()
    for distance in range(1, SPAN + 1):
        if time.monotonic() - start > BUDGET_S:
            break
        if (
            below is None
            and value - distance > 0
            and builds({**model, key: value - distance}, build)
        ):
            below = value - distance
        if above is None and builds({**model, key: value + distance}, build):
            above = value + distance
        if below is not None and above is not None:
            break
    return below, above


def size_error(
    model: Mapping[str, Any], reason: BaseException | None, choice: str | None, build: Build
) -> ModelSizeError | None:
    """A :class:`ModelSizeError` for a model config whose constructor refused its sizes with
    ``reason`` (a ValueError), or None when the config has no ``model.d_model`` to search or no
    nearby value builds either (the refusal is about something else)."""
    if not isinstance(reason, ValueError) or not isinstance(model.get(SEARCHED), int):
        return None
    below, above = nearest_that_build(model, build)
    if below is None and above is None:
        return None
    asked = ", ".join(f"model.{k}={model[k]}" for k in SIZE_KEYS if model.get(k) is not None)
    fits = " or ".join(f"model.{SEARCHED}={v}" for v in (below, above) if v is not None)
    name = (
        f"model={choice}" if choice else str(model.get("_target_", "the model")).rsplit(".", 1)[-1]
    )
    return ModelSizeError(
        f"{name} cannot be built with {asked}: {reason}. With the other model.* keys as they "
        f"are, {fits} builds."
    )
