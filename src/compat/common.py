"""What the family converters share: their error, reading an official weights file, and the strict
fill that names every tensor that does not match."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor, nn

from src.utils.errors import InputFileError, UserError
from src.utils.state_dicts import torch_load

Weights = str | Path | Mapping[str, Tensor]
Network = TypeVar("Network", bound=nn.Module)

LISTED = 5  # names quoted in a message; the rest are counted


class OfficialWeightsError(UserError, KeyError, ValueError):
    """Official weights that do not fit the module asked for: missing or unexpected tensors
    (hence a ``KeyError``) or tensors of another shape (hence a ``ValueError``). The message is one
    line naming them."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0]) if self.args else ""


def listed(names: Collection[str]) -> str:
    """``['a', 'b', ...] and 12 more``: the first few names, the rest counted."""
    names = list(names)
    shown = str(names[:LISTED])
    return shown if len(names) <= LISTED else f"{shown} and {len(names) - LISTED} more"


def check_keys(state_dict: Mapping[str, Tensor], expected: Collection[str]) -> None:
    """Refuse an official state dict that lacks one of ``expected`` or holds another tensor."""
    wanted = set(expected)
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in wanted]
    if missing or unexpected:
        raise OfficialWeightsError(
            f"official state dict does not match: missing {listed(missing)}, "
            f"unexpected {listed(unexpected)}"
        )


def fill(module: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Load ``state`` (this project's names) into ``module`` strictly, after naming any key or
    shape that does not match (``load_state_dict`` would list every one of them)."""
    expected = module.state_dict()
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    if missing or unexpected:
        raise OfficialWeightsError(
            f"converted weights do not fit {type(module).__name__}: missing {listed(missing)}, "
            f"unexpected {listed(unexpected)}"
        )
    shapes = [
        f"{key}: file {tuple(state[key].shape)} vs {tuple(value.shape)}"
        for key, value in expected.items()
        if state[key].shape != value.shape
    ]
    if shapes:
        raise OfficialWeightsError(
            f"{len(shapes)} tensors do not fit {type(module).__name__} "
            f"(another width or number of classes?): {listed(shapes)}"
        )
    with torch.no_grad():
        module.load_state_dict({key: value.contiguous() for key, value in state.items()})


def read_official(weights: Weights, family: str) -> dict[str, Tensor]:
    """``weights`` as a state dict: a mapping as it is, a path read on the CPU with
    ``weights_only=True``; a ``state_dict`` entry is unwrapped and ``module.`` (DataParallel)
    prefixes are removed."""
    if isinstance(weights, (str, Path)):
        path = Path(weights)
        try:
            loaded = torch_load(path, f"official {family} weights")
        except FileNotFoundError as error:
            raise InputFileError(str(error)) from None
        except ValueError as error:  # not a file torch can read
            raise OfficialWeightsError(str(error)) from None
        if isinstance(loaded, Mapping) and isinstance(loaded.get("state_dict"), Mapping):
            loaded = loaded["state_dict"]
        if not isinstance(loaded, Mapping):
            raise OfficialWeightsError(
                f"official {family} weights {path} hold a {type(loaded).__name__}, not a state dict"
            )
        weights = loaded
    return {str(key).removeprefix("module."): value for key, value in weights.items()}


def load_with(
    network: Network,
    weights: Weights,
    family: str,
    loader: Callable[[Network, dict[str, Tensor]], None],
) -> None:
    """Read ``weights`` (:func:`read_official`) and ``loader`` them into ``network``; an error
    about a file names the file."""
    state = read_official(weights, family)
    try:
        loader(network, state)
    except OfficialWeightsError as error:
        if not isinstance(weights, (str, Path)):
            raise
        raise OfficialWeightsError(
            f"official {family} weights {weights} do not fit {type(network).__name__}: {error}"
        ) from None


def unsupported(network: nn.Module, family: str, supported: Collection[type]) -> TypeError:
    """The error for a module that no converter of ``family`` fills."""
    names = sorted(t.__name__ for t in supported)
    return TypeError(
        f"no official {family} weights convert to {type(network).__name__}; the {family} "
        f"converters fill {names}"
    )
