"""Official PRU (github.com/sacmehta/PRU) state dicts -> :mod:`src.ops.pru` and
:class:`AWDLanguageModel`.

:func:`from_official` builds the op an official state dict holds and fills it;
:func:`load_official` fills a pyramidal transform, context GLT, one-layer PRU or a whole
:class:`AWDLanguageModel` of ours in place.

Official names: a PRU layer has ``pt.pyramid.{k}.weight`` (4 m_k, ceil(N / 2^k)) and
``pt.pyramid.{k}.bias`` (4 m_k), and ``glt.W`` (g, M/g, 4M/g) and ``glt.bias`` (g, 4M/g); the
stand-alone transforms have the same names without the ``pt.`` / ``glt.`` prefix. The official
``RNNModel`` adds ``encoder.weight`` (the embedding), ``decoder.{weight,bias}`` and
``rnns.{l}.*`` (a PRU layer, or ``nn.LSTM``'s ``{weight,bias}_{ih,hh}_l0``). Every layout is
already this project's (the GLT weight stays (g, M/g, 4M/g)): only names change. Every size is
read from the state dict and checked against the config's, where the config gives one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from src.compat.common import (
    OfficialWeightsError,
    Weights,
    check_keys,
    fill,
    load_with,
    unsupported,
)
from src.models.awd_lm import AWDLanguageModel
from src.ops.pru import PRU, GroupedContextTransform
from src.ops.pyramidal import GATES, PyramidalTransform

FAMILY = "PRU"

# config keys of the official fixtures for each size, per module kind
_CONFIG_KEYS = {
    "pyramid": {"in_features": "ninp", "out_features": "nhid", "levels": "K"},
    "context": {"hidden_size": "nInp", "groups": "groups"},
    "layer": {
        "input_size": "input_size",
        "hidden_size": "hidden_size",
        "groups": "groups",
        "levels": "K",
    },
}

# official RNNModel names -> AWDLanguageModel's, for the parts that are renamed
_OFFICIAL_RENAMES = (
    (re.compile(r"encoder\.weight"), "embedding.weight"),
    (re.compile(r"decoder\.(weight|bias)"), r"decoder.\1"),
    (
        re.compile(r"rnns\.(\d+)\.pt\.pyramid\.(\d+)\.(weight|bias)"),
        r"rnns.\1.cells.0.pyramid.transforms.\2.\3",
    ),
    (re.compile(r"rnns\.(\d+)\.glt\.W"), r"rnns.\1.cells.0.context.glt.weight"),
    (re.compile(r"rnns\.(\d+)\.glt\.bias"), r"rnns.\1.cells.0.context.glt.bias"),
    (re.compile(r"rnns\.(\d+)\.((weight|bias)_(ih|hh)_l0)"), r"rnns.\1.\2"),
)


def _check_config(kind: str, sizes: Mapping[str, int], config: Mapping[str, Any]) -> None:
    for name, key in _CONFIG_KEYS[kind].items():
        if key in config and config[key] != sizes[name]:
            raise ValueError(
                f"config {key}={config[key]} disagrees with the state dict, "
                f"which gives {name}={sizes[name]}"
            )


# -- official tensors -> ours, for a module of ours ----------------------------------------------


def _renamed(state_dict: Mapping[str, Tensor], names: Mapping[str, str]) -> dict[str, Tensor]:
    """``state_dict`` with exactly the official keys of ``names``, under our names."""
    check_keys(state_dict, names)
    return {ours: state_dict[theirs] for theirs, ours in names.items()}


def _pyramid_names(module: PyramidalTransform, official: str, ours: str) -> dict[str, str]:
    return {
        f"{official}pyramid.{k}.{name}": f"{ours}transforms.{k}.{name}"
        for k, transform in enumerate(module.transforms)
        for name, _ in transform.named_parameters()
    }


def _context_names(module: GroupedContextTransform, official: str, ours: str) -> dict[str, str]:
    names = {f"{official}W": f"{ours}glt.weight"}
    if module.glt.bias is not None:
        names[f"{official}bias"] = f"{ours}glt.bias"
    return names


def _pru_names(module: PRU) -> dict[str, str]:
    if len(module.cells) != 1:
        raise OfficialWeightsError(
            f"an official PRU layer is one layer; this PRU has {len(module.cells)}"
        )
    cell = module.cells[0]
    return _pyramid_names(cell.pyramid, "pt.", "cells.0.pyramid.") | _context_names(
        cell.context, "glt.", "cells.0.context."
    )


def _awd_state(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An official ``RNNModel`` state dict in :class:`AWDLanguageModel`'s names.

    ``encoder.weight`` -> ``embedding.weight``; ``decoder.*`` kept; a PRU layer's
    ``rnns.{l}.pt.pyramid.{k}.*`` -> ``rnns.{l}.cells.0.pyramid.transforms.{k}.*`` and
    ``rnns.{l}.glt.{W,bias}`` -> ``rnns.{l}.cells.0.context.glt.{weight,bias}``; an LSTM layer's
    ``rnns.{l}.{weight,bias}_{ih,hh}_l0`` kept. Tensors are not copied.
    """
    converted = {}
    for key, value in state_dict.items():
        for pattern, replacement in _OFFICIAL_RENAMES:
            if pattern.fullmatch(key):
                converted[pattern.sub(replacement, key)] = value
                break
        else:
            raise OfficialWeightsError(f"{key!r} is not a parameter of the official RNNModel")
    return converted


def _fill(network: nn.Module, state_dict: Mapping[str, Tensor]) -> None:
    if isinstance(network, AWDLanguageModel):
        state = _awd_state(state_dict)
    elif isinstance(network, PRU):
        state = _renamed(state_dict, _pru_names(network))
    elif isinstance(network, GroupedContextTransform):
        state = _renamed(state_dict, _context_names(network, "", ""))
    else:
        state = _renamed(state_dict, _pyramid_names(network, "", ""))
    fill(network, state)


NETWORKS: tuple[type[nn.Module], ...] = (
    AWDLanguageModel,
    PRU,
    PyramidalTransform,
    GroupedContextTransform,
)


def load_official(network: nn.Module, weights: Weights) -> None:
    """Fill ``network`` in place with official PRU weights (a path or a state dict).

    ``network``: an :class:`AWDLanguageModel` (the official ``RNNModel``, PRU or LSTM layers), a
    one-layer :class:`PRU` (an official PRU layer), a :class:`PyramidalTransform` or a
    :class:`GroupedContextTransform` (the stand-alone transforms).

    Raises:
        OfficialWeightsError: official tensors missing or unknown, or shapes that differ.
        TypeError: ``network`` is none of :data:`NETWORKS`.
    """
    if not isinstance(network, NETWORKS):
        raise unsupported(network, FAMILY, NETWORKS)
    load_with(network, weights, FAMILY, _fill)


# -- building from the state dict (sizes) and the official config ---------------------------------


def _pyramid_sizes(state_dict: Mapping[str, Tensor], prefix: str) -> dict[str, int]:
    pattern = re.compile(rf"{re.escape(prefix)}pyramid\.(\d+)\.weight")
    weights = {int(m.group(1)): v for k, v in state_dict.items() if (m := pattern.fullmatch(k))}
    if not weights or sorted(weights) != list(range(len(weights))):
        raise OfficialWeightsError(
            f"no consecutive {prefix}pyramid.{{k}}.weight in {sorted(state_dict)}"
        )
    return {
        "in_features": weights[0].shape[1],
        "out_features": sum(w.shape[0] // GATES for w in weights.values()),
        "levels": len(weights),
    }


def pyramidal_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> PyramidalTransform:
    """The official stand-alone ``PyramidalTransform`` (``pyramid.{k}.weight/bias``)."""
    sizes = _pyramid_sizes(state_dict, "")
    _check_config("pyramid", sizes, config)
    module = PyramidalTransform(sizes["in_features"], sizes["out_features"], levels=sizes["levels"])
    load_official(module, state_dict)
    return module


def context_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> GroupedContextTransform:
    """The official stand-alone context GLT (``W`` (g, M/g, 4M/g), ``bias`` (g, 4M/g))."""
    weight = state_dict["W"]
    sizes = {"hidden_size": weight.shape[0] * weight.shape[1], "groups": weight.shape[0]}
    _check_config("context", sizes, config)
    module = GroupedContextTransform(sizes["hidden_size"], groups=sizes["groups"])
    load_official(module, state_dict)
    return module


def pru_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any], *, batch_first: bool = False
) -> PRU:
    """An official PRU layer (``pt.pyramid.{k}.*``, ``glt.W``, ``glt.bias``): a one-layer PRU."""
    pyramid = _pyramid_sizes(state_dict, "pt.")
    weight = state_dict["glt.W"]
    sizes = {
        "input_size": pyramid["in_features"],
        "hidden_size": weight.shape[0] * weight.shape[1],
        "groups": weight.shape[0],
        "levels": pyramid["levels"],
    }
    if pyramid["out_features"] != sizes["hidden_size"]:
        raise OfficialWeightsError(
            f"the pyramid gives {pyramid['out_features']} outputs per gate, "
            f"glt.W {tuple(weight.shape)} a hidden size of {sizes['hidden_size']}"
        )
    _check_config("layer", sizes, config)
    module = PRU(
        sizes["input_size"],
        sizes["hidden_size"],
        groups=sizes["groups"],
        levels=sizes["levels"],
        batch_first=batch_first,
    )
    load_official(module, state_dict)
    return module


def from_official(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    """Whichever of the three the state dict holds, built and filled: a PRU layer (``glt.W``), a
    context GLT (``W``) or a pyramid (``pyramid.0.weight``); ``config`` (the fixtures' official
    sizes: ``ninp``, ``nhid``, ``K``, ``nInp``, ``groups``, ``input_size``, ``hidden_size``) is
    checked against the tensors where it gives a size."""
    if "glt.W" in state_dict:
        return pru_from_official(state_dict, config)
    if "W" in state_dict:
        return context_from_official(state_dict, config)
    if "pyramid.0.weight" in state_dict:
        return pyramidal_from_official(state_dict, config)
    raise ValueError(f"not an official PRU state dict: keys {sorted(state_dict)}")
