"""Channels-last tensors as the ops read them: the layout test and the rows-of-channels view.

A (B, C, H, W) tensor is channels-last when its memory order is (b, h, w, c). A tensor with
H = W = 1 or C = 1 has both layouts' strides; it counts as contiguous, so that ops keep giving
such tensors the contiguous layout they always had.
"""

from __future__ import annotations

import torch
from torch import Tensor


def is_channels_last(x: Tensor) -> bool:
    """Whether ``x`` is 4-D with channels-last strides (and not contiguous strides as well)."""
    return (
        x.dim() == 4
        and x.is_contiguous(memory_format=torch.channels_last)
        and not x.is_contiguous()
    )


def memory_format_of(x: Tensor) -> torch.memory_format:
    """``torch.channels_last`` for a channels-last ``x`` (:func:`is_channels_last`), else
    ``torch.contiguous_format``: the format an op's output takes to keep its input's."""
    return torch.channels_last if is_channels_last(x) else torch.contiguous_format


def channel_rows(x: Tensor) -> Tensor:
    """A channels-last tensor as rows of channels, a view.

    Shape:
        (B, C, H, W) -> (B H W, C)
    """
    return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])


def from_channel_rows(rows: Tensor, shape: torch.Size) -> Tensor:
    """Rows of channels back as a channels-last tensor of ``shape``, a view (the inverse of
    :func:`channel_rows`).

    Shape:
        (B H W, C) -> (B, C, H, W)
    """
    batch, channels, height, width = shape
    return rows.view(batch, height, width, channels).permute(0, 3, 1, 2)
