"""Official-format EdgeNets files made from networks of ours, for tests without the releases."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from src.compat.edgenets import official_key_map


def official_state(net: nn.Module) -> dict[str, Tensor]:
    """``net``'s tensors under the official EdgeNets names and layouts (``module.``-prefixed, as
    the released files are)."""
    ours = net.state_dict()
    key_map, _ = official_key_map(net)
    official = {}
    for name, (target, transform) in key_map.items():
        value = ours[target].detach().clone()
        if transform is not None:  # a permutation of a (3C,) vector: invert it
            order = transform(torch.arange(value.numel()))
            value = torch.empty_like(value).index_copy_(0, order, value)
        official[f"module.{name}"] = value
    return official


def official_file(net: nn.Module, path: Path) -> dict[str, Tensor]:
    """Save :func:`official_state` of ``net`` at ``path``; returns ``net``'s own state."""
    torch.save(official_state(net), path)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}
