"""Converters from the official PRU state dicts (github.com/sacmehta/PRU) to :mod:`src.ops.pru`.

Official names: a PRU layer has ``pt.pyramid.{k}.weight`` (4 m_k, ceil(N / 2^k)) and
``pt.pyramid.{k}.bias`` (4 m_k), and ``glt.W`` (g, M/g, 4M/g) and ``glt.bias`` (g, 4M/g); the
stand-alone transforms have the same names without the ``pt.`` / ``glt.`` prefix. Every size is
read from the state dict and checked against the config's, where the config gives one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from src.ops.pru import PRU, GroupedContextTransform
from src.ops.pyramidal import GATES, PyramidalTransform

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


def _check_config(kind: str, sizes: Mapping[str, int], config: Mapping[str, Any]) -> None:
    for name, key in _CONFIG_KEYS[kind].items():
        if key in config and config[key] != sizes[name]:
            raise ValueError(
                f"config {key}={config[key]} disagrees with the state dict, "
                f"which gives {name}={sizes[name]}"
            )


def _copy(target: Tensor, source: Tensor, name: str) -> None:
    # the official layouts are this project's (GroupLinear keeps the GLT's (g, M/g, 4M/g)), so
    # every tensor must fit as it is
    if source.shape != target.shape:
        raise ValueError(
            f"{name}: official shape {tuple(source.shape)} does not fit {tuple(target.shape)}"
        )
    with torch.no_grad():
        target.copy_(source)


def _pyramid_sizes(state_dict: Mapping[str, Tensor], prefix: str) -> dict[str, int]:
    pattern = re.compile(rf"{re.escape(prefix)}pyramid\.(\d+)\.weight")
    weights = {int(m.group(1)): v for k, v in state_dict.items() if (m := pattern.fullmatch(k))}
    if not weights or sorted(weights) != list(range(len(weights))):
        raise ValueError(f"no consecutive {prefix}pyramid.{{k}}.weight in {sorted(state_dict)}")
    return {
        "in_features": weights[0].shape[1],
        "out_features": sum(w.shape[0] // GATES for w in weights.values()),
        "levels": len(weights),
    }


def _load_pyramid(
    module: PyramidalTransform, state_dict: Mapping[str, Tensor], prefix: str
) -> None:
    for k, transform in enumerate(module.transforms):
        _copy(
            transform.weight,
            state_dict[f"{prefix}pyramid.{k}.weight"],
            f"{prefix}pyramid.{k}.weight",
        )
        _copy(transform.bias, state_dict[f"{prefix}pyramid.{k}.bias"], f"{prefix}pyramid.{k}.bias")


def _load_context(
    module: GroupedContextTransform, state_dict: Mapping[str, Tensor], prefix: str
) -> None:
    _copy(module.glt.weight, state_dict[f"{prefix}W"], f"{prefix}W")
    _copy(module.glt.bias, state_dict[f"{prefix}bias"], f"{prefix}bias")


def pyramidal_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> PyramidalTransform:
    """The official stand-alone ``PyramidalTransform`` (``pyramid.{k}.weight/bias``)."""
    sizes = _pyramid_sizes(state_dict, "")
    _check_config("pyramid", sizes, config)
    module = PyramidalTransform(sizes["in_features"], sizes["out_features"], levels=sizes["levels"])
    _load_pyramid(module, state_dict, "")
    return module


def context_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> GroupedContextTransform:
    """The official stand-alone context GLT (``W`` (g, M/g, 4M/g), ``bias`` (g, 4M/g))."""
    weight = state_dict["W"]
    sizes = {"hidden_size": weight.shape[0] * weight.shape[1], "groups": weight.shape[0]}
    _check_config("context", sizes, config)
    module = GroupedContextTransform(sizes["hidden_size"], groups=sizes["groups"])
    _load_context(module, state_dict, "")
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
        raise ValueError(
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
    cell = module.cells[0]
    _load_pyramid(cell.pyramid, state_dict, "pt.")
    _load_context(cell.context, state_dict, "glt.")
    return module


def from_official(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    """Whichever of the three the state dict holds: a PRU layer, a pyramid or a context GLT."""
    if "glt.W" in state_dict:
        return pru_from_official(state_dict, config)
    if "W" in state_dict:
        return context_from_official(state_dict, config)
    if "pyramid.0.weight" in state_dict:
        return pyramidal_from_official(state_dict, config)
    raise ValueError(f"not an official PRU state dict: keys {sorted(state_dict)}")
