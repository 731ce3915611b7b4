"""fairseq's sinusoidal positions (``SinusoidalPositionalEmbedding`` with ``make_positions``):
fixed, parameter-free position vectors for the encoder-decoders, language models and classifiers
of the fairseq family (DeLighT, Transformer).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def sinusoidal_positions(
    padding_mask: Tensor,
    dim: int,
    padding_idx: int,
    *,
    offset: int = 0,
    positions: Tensor | None = None,
) -> Tensor:
    """fairseq's sinusoidal positions (``SinusoidalPositionalEmbedding``, no parameters).

    Non-pad tokens are numbered ``padding_idx + 1, padding_idx + 2, ...`` in order, skipping pads
    (fairseq's ``make_positions``), so left and right padding give a token the same position.
    ``offset`` counts unpadded tokens before the given ones (incremental decoding); ``positions``
    gives the numbers instead, e.g. restarting at each pair of a packed row
    (:mod:`src.models.packing`). The
    vector of position t is ``[sin(t f_0), ..., sin(t f_{h-1}), cos(t f_0), ..., cos(t f_{h-1})]``
    with h = dim // 2 and ``f_i = 10000^(-i / (h - 1))`` (a zero column appended when dim is odd);
    pads get the zero vector (fairseq zeroes the table's ``padding_idx`` row).

    Shape:
        padding_mask (B, T) bool, True = pad; positions (B, T) int64 or None -> (B, T, dim)
        float32
    """
    half = dim // 2
    if half < 2:
        raise ValueError(f"sinusoidal positions need dim >= 4, got {dim}")
    if positions is None:
        keep = ~padding_mask
        # (B, T), pads at padding_idx
        positions = (torch.cumsum(keep, dim=1) + offset) * keep + padding_idx
    # fairseq builds its table in float32 with these operations, so the values agree exactly
    freq = torch.exp(
        torch.arange(half, dtype=torch.float, device=padding_mask.device)
        * -(math.log(10000) / (half - 1))
    )
    angles = positions.float().unsqueeze(-1) * freq  # (B, T, h)
    emb = torch.cat((torch.sin(angles), torch.cos(angles)), dim=-1)  # (B, T, 2h)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb.masked_fill(padding_mask.unsqueeze(-1), 0.0)
