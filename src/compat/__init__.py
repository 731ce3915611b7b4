"""Converters from the official implementations' weights to this project's modules.

One module per official family: :mod:`~src.compat.edgenets` (DiCENet, ESPNetv2),
:mod:`~src.compat.delight` (DeLighT), :mod:`~src.compat.group_transformer` (Group-Transformer,
Transformer-XL) and :mod:`~src.compat.pru` (PRU, AWD-LM). Each has the same two entry points:

- ``from_official(state_dict, config) -> nn.Module`` builds the module an official state dict and
  its constructor arguments describe (``config`` as the reference fixtures store it) and fills it;
- ``load_official(network, state_dict_or_path) -> None`` fills a module of ours in place, strictly:
  missing, unexpected or misshapen tensors raise :class:`OfficialWeightsError` naming them.

:func:`load_official` here picks the family by the network's type. The converters only rename and
reshape tensors; the models hold no official-layout special cases. Imports go one way: compat
imports models and ops, which never import compat.

``python -m src.compat.convert <official file> family=... model=... data=... out=<path.ckpt>``
(:mod:`src.compat.convert`, not imported here: it composes configs with Hydra) writes a whole
official model as a checkpoint of this project, which ``eval.py``, ``predict.py``,
``generate.py``, ``translate.py`` and ``export.py`` rebuild the network from
(``ckpt_path=<path.ckpt>``).
"""

from __future__ import annotations

from types import ModuleType

from torch import nn

from src.compat import delight, edgenets, group_transformer, pru
from src.compat.common import OfficialWeightsError, Weights

__all__ = ["FAMILIES", "OfficialWeightsError", "family_of", "load_official"]

# family name -> its converter module (each has NETWORKS, from_official and load_official)
FAMILIES: dict[str, ModuleType] = {
    edgenets.FAMILY: edgenets,
    pru.FAMILY: pru,
    group_transformer.FAMILY: group_transformer,
    delight.FAMILY: delight,
}


def family_of(network: nn.Module) -> str | None:
    """The name of the family whose official weights fill ``network``, or None."""
    for name, family in FAMILIES.items():
        if isinstance(network, family.NETWORKS):
            return name
    return None


def load_official(network: nn.Module, weights: Weights) -> None:
    """Fill ``network`` in place with official weights (a path or a state dict), converted by the
    family that ``network``'s type belongs to.

    Raises:
        OfficialWeightsError: the weights do not fit ``network`` (the message names what).
        TypeError: no family converts to ``network``'s type (the message lists those that do).
    """
    name = family_of(network)
    if name is None:
        known = sorted(t.__name__ for family in FAMILIES.values() for t in family.NETWORKS)
        raise TypeError(
            f"no official weights convert to {type(network).__name__}; the converters fill {known}"
        )
    FAMILIES[name].load_official(network, weights)
