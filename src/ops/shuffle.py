"""Feature (channel) shuffle: interleave g groups' outputs so the next grouped layer mixes them.

ShuffleNet's channel shuffle and DeLighT's feature shuffle are the same permutation on different
axes: view the axis as (g, n/g), transpose to (n/g, g), flatten. Output index ``j * g + i`` holds
input index ``i * (n / g) + j`` (group i, unit j).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from src.kernels.layout import is_channels_last


def feature_shuffle(x: Tensor, groups: int, dim: int = -1) -> Tensor:
    """Shuffle the ``dim`` axis of ``x`` across ``groups`` groups.

    Shape:
        any shape; ``x.shape[dim]`` must be divisible by ``groups``. The output has the same shape.
    """
    dim = dim % x.dim()
    size = x.shape[dim]
    if groups < 1 or size % groups:
        raise ValueError(f"cannot shuffle {size} features into {groups} groups")
    if groups == 1:
        return x
    # (..., n, ...) -> (..., g, n/g, ...) -> (..., n/g, g, ...) -> (..., n, ...)
    grouped = x.unflatten(dim, (groups, size // groups))
    return grouped.transpose(dim, dim + 1).flatten(dim, dim + 1)


def channel_shuffle(x: Tensor, groups: int) -> Tensor:
    """ShuffleNet channel shuffle of a (B, C, H, W) feature map: :func:`feature_shuffle` on dim 1,
    in x's layout (a channels-last map stays channels-last)."""
    if is_channels_last(x):
        # shuffled as rows of channels: (B, H, W, C), then viewed back as (B, C, H, W)
        return feature_shuffle(x.permute(0, 2, 3, 1), groups).permute(0, 3, 1, 2)
    return feature_shuffle(x, groups, dim=1)


def concat_shuffle(parts: Sequence[Tensor], groups: int) -> Tensor:
    """``channel_shuffle(torch.cat(parts, dim=1), groups)`` with one copy instead of two.

    With ``groups`` parts of equal width (the ShuffleNet-style units, after their first) the
    shuffled concatenation is a stack on a new axis after the channels; other cases concatenate
    and shuffle.

    Shape:
        parts (B, C_i, H, W) -> (B, sum C_i, H, W)
    """
    if len(parts) == groups and all(p.shape == parts[0].shape for p in parts):
        if all(p.dim() == 4 and p.stride(1) == 1 and p.shape[1] > 1 for p in parts):
            # channels innermost (channels-last maps and channel slices of them, as a unit's
            # pass-through half) give a channels-last output:
            # g x (B, H, W, n) -> (B, H, W, n, g) -> (B, H, W, g * n)
            rows = [p.permute(0, 2, 3, 1) for p in parts]
            return torch.stack(rows, dim=-1).flatten(-2).permute(0, 3, 1, 2)
        # g x (B, n, H, W) -> (B, n, g, H, W) -> (B, g * n, H, W)
        return torch.stack(tuple(parts), dim=2).flatten(1, 2)
    return channel_shuffle(torch.cat(tuple(parts), dim=1), groups)
