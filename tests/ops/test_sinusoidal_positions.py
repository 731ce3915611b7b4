"""fairseq's sinusoidal positions: the table fairseq builds, indexed as ``make_positions`` numbers
the tokens, and the offset of incremental decoding."""

from __future__ import annotations

import math

import torch

from src.ops.sinusoidal_positions import sinusoidal_positions

PADDING_IDX = 1  # fairseq's dictionary: <s>=0, <pad>=1, </s>=2, <unk>=3


def _fairseq_sinusoids(num: int, dim: int, padding_idx: int) -> torch.Tensor:
    # fairseq SinusoidalPositionalEmbedding.get_embedding, written out
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(num, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)
    table[padding_idx] = 0
    return table


def test_sinusoidal_positions_match_fairseq() -> None:
    tokens = torch.tensor([[7, 8, 9, 10, PADDING_IDX], [PADDING_IDX, PADDING_IDX, 5, 6, 7]])
    pad = tokens.eq(PADDING_IDX)
    # fairseq make_positions: cumulative count of non-pads, offset by padding_idx; pads at it
    positions = torch.tensor([[2, 3, 4, 5, 1], [1, 1, 2, 3, 4]])
    expected = _fairseq_sinusoids(16, 64, PADDING_IDX)[positions]
    assert torch.equal(sinusoidal_positions(pad, 64, PADDING_IDX), expected)


def test_an_offset_continues_the_numbering() -> None:
    """Incremental decoding: the positions of the last tokens, given how many unpadded tokens came
    before, equal those of the whole (left-padded) sequence."""
    pad = torch.tensor([[True, False, False, False, False], [True, True, False, False, False]])
    whole = sinusoidal_positions(pad, 10, PADDING_IDX)
    # two unpadded tokens before position 3 in one row, one in the other: decode row by row
    for row, before in ((0, 2), (1, 1)):
        tail = sinusoidal_positions(pad[row : row + 1, 3:], 10, PADDING_IDX, offset=before)
        assert torch.equal(tail, whole[row : row + 1, 3:])


def test_odd_widths_end_with_a_zero_column() -> None:
    pad = torch.tensor([[False, False, True]])
    emb = sinusoidal_positions(pad, 9, PADDING_IDX)
    assert emb.shape == (1, 3, 9)
    assert torch.equal(emb[..., :8], sinusoidal_positions(pad, 8, PADDING_IDX))
    assert not emb[..., 8].any() and not emb[0, 2].any()
