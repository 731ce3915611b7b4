"""Packed rows: several sentence pairs side by side in one row of a translation batch.

A training batch padded to a few static shapes (CUDA graphs) pads a fifth of its tokens when each
row holds one pair (:mod:`src.datamodules.length_buckets`). Packing fills a row's free length with
further pairs, each a *segment* of the row: segment ids count the pairs of a row from 1, pads are
0. The model then sees each pair as if it were alone:

- attention stays within a segment (:func:`segment_mask`, :func:`cross_segment_mask`): a query
  reads the keys of its own segment only (and, in the decoder, not later ones), the decoder's
  query of pair k reads the source of pair k;
- positions restart at every segment (the data gives them, fairseq's numbering from
  ``padding_idx + 1``);
- per-sequence dropout draws one mask per segment, not per row
  (:func:`src.models.delight_mt.recurrent_dropout`).

Everything else (embeddings, DExTra, FFN, LayerNorm, the loss) acts token by token, so a packed
pair's loss and gradients equal its own unpacked ones, up to float rounding and the dropout masks
drawn. Pad queries (segment 0) may read every key (causally in the decoder): their outputs are
never scored, and a row of -inf scores would turn them into NaN, which the backward would spread.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PackedRows:
    """Where each pair of a packed batch sits.

    Shape:
        source_segments (B, S), target_segments (B, T) int64: the pair's number in its row (1, 2,
        ...), 0 on pads; source_positions (B, S), target_positions (B, T) int64: fairseq's
        positions, ``padding_idx + 1`` at each pair's first token, ``padding_idx`` on pads
    """

    source_segments: Tensor
    target_segments: Tensor
    source_positions: Tensor
    target_positions: Tensor

    @classmethod
    def of(cls, batch: dict) -> PackedRows | None:
        """The packing of a collated translation batch, None for a batch of one pair a row."""
        if "src_segments" not in batch:
            return None
        return cls(
            batch["src_segments"], batch["tgt_segments"],
            batch["src_positions"], batch["tgt_positions"],
        )  # fmt: skip


def segment_mask(segments: Tensor, dtype: torch.dtype, *, causal: bool = False) -> Tensor:
    """Self-attention within segments, as the additive mask the attention adds (0 or -inf).

    Shape:
        segments (B, T) int64 -> (B, T, T)
    """
    return _additive(segments, segments, dtype, causal=causal)


def cross_segment_mask(queries: Tensor, keys: Tensor, dtype: torch.dtype) -> Tensor:
    """Encoder-decoder attention from each target segment to its source segment.

    Shape:
        queries (B, T), keys (B, S) int64 segments -> (B, T, S)
    """
    return _additive(queries, keys, dtype, causal=False)


def _additive(queries: Tensor, keys: Tensor, dtype: torch.dtype, *, causal: bool) -> Tensor:
    allowed = (queries[:, :, None] == keys[:, None, :]) | (queries[:, :, None] == 0)  # (B, T, S)
    if causal:
        t = torch.arange(queries.shape[1], device=queries.device)
        allowed = allowed & (t[None, :, None] >= t[None, None, :])
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, float("-inf")
    )


def per_segment(mask: Tensor, segments: Tensor) -> Tensor:
    """One mask row per segment, spread over the segment's tokens.

    Shape:
        mask (B, T + 1, C), row k for segment k; segments (B, T) -> (B, T, C)
    """
    return mask.gather(1, segments[:, :, None].expand(-1, -1, mask.shape[2]))
