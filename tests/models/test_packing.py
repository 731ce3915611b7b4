"""Packed rows (src/models/packing.py): attention stays within a pair, pad queries read every key
(so no row of scores is all -inf), and the per-sequence dropout draws one mask per pair."""

from __future__ import annotations

import torch

from src.models.delight_mt import recurrent_dropout
from src.models.packing import cross_segment_mask, segment_mask

INF = float("-inf")


def test_segment_masks_keep_each_pair_to_itself() -> None:
    segments = torch.tensor([[1, 1, 2, 0]])
    mask = segment_mask(segments, torch.float32)
    assert mask[0].tolist() == [
        [0, 0, INF, INF],
        [0, 0, INF, INF],
        [INF, INF, 0, INF],
        [0, 0, 0, 0],  # the pad query reads every key
    ]
    causal = segment_mask(segments, torch.float32, causal=True)
    assert causal[0].tolist() == [
        [0, INF, INF, INF],
        [0, 0, INF, INF],
        [INF, INF, 0, INF],
        [0, 0, 0, 0],
    ]
    across = cross_segment_mask(
        torch.tensor([[1, 2, 2, 0]]), torch.tensor([[2, 1, 1]]), torch.bfloat16
    )
    assert across.dtype == torch.bfloat16
    assert across[0].float().tolist() == [[INF, 0, 0], [0, INF, INF], [0, INF, INF], [0, 0, 0]]
    # every query keeps a key: softmax rows stay finite
    assert torch.isfinite(torch.softmax(causal, -1)).all()


def test_recurrent_dropout_draws_one_mask_per_pair() -> None:
    torch.manual_seed(0)
    x = torch.ones(2, 6, 64)
    segments = torch.tensor([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    y = recurrent_dropout(x, 0.5, True, segments)
    assert set(y.unique().tolist()) == {0.0, 2.0}
    for row, spans in ((0, [(0, 3), (3, 5)]), (1, [(0, 6)])):
        for a, b in spans:
            assert y[row, a:b].eq(y[row, a]).all()  # one mask over the pair's tokens
    assert not y[0, 0].eq(y[0, 3]).all()  # the row's two pairs have their own masks
    assert recurrent_dropout(x, 0.5, False, segments) is x
