"""Over-long translation sources cut at sentence ends into pieces that fit, truncated where one
sentence alone is too long; checked with a whitespace "encoder" (one id a word, eos last)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from src.decoding.source_pieces import fit_source, sentence_ends

EOS = 2


def encode(text: str) -> Tensor:
    """Each word's length + 10 as its id (so the truncation's kept words can be read back), eos."""
    return torch.tensor([len(w) + 10 for w in text.split()] + [EOS])


def words_of(ids: Tensor) -> list[int]:
    return [i - 10 for i in ids.tolist()[:-1]]


def test_sentence_ends_need_white_space_after_latin_marks_only() -> None:
    text = "Ein Satz. Noch einer! Um 3.5 auf www.x.org?  Ende"
    ends = sentence_ends(text)
    assert [text[:e] for e in ends] == ["Ein Satz. ", "Ein Satz. Noch einer! ", text[:-4], text]
    assert sentence_ends("日本語。テスト！終わり") == [4, 8, 11]
    assert sentence_ends("no end at all") == [13]


def test_a_source_that_fits_is_one_piece() -> None:
    fitted = fit_source("a bb ccc.", encode, 4)
    assert (
        len(fitted.pieces) == 1
        and not fitted.split
        and fitted.truncated == 0
        and fitted.num_tokens == 4
    )


def test_sentences_are_packed_into_pieces_that_fit() -> None:
    # sentences of 2, 2, 1 and 3 words; at most 4 tokens (3 words and eos) a piece
    text = "a bb. ccc dddd. e. fffff gg hhh."
    fitted = fit_source(text, encode, 4)
    assert [words_of(p) for p in fitted.pieces] == [[1, 3], [3, 5, 2], [5, 2, 4]]
    assert all(int(p[-1]) == EOS for p in fitted.pieces)
    assert fitted.split and fitted.truncated == 0 and fitted.num_tokens == 9
    # room for 4 words: two sentences a piece
    assert [words_of(p) for p in fit_source(text, encode, 5).pieces] == [[1, 3, 3, 5], [2, 5, 2, 4]]


def test_a_sentence_too_long_alone_is_truncated_to_the_limit() -> None:
    fitted = fit_source("a bb. c dd eee ffff ggggg hhhhhh. i.", encode, 4)
    assert [words_of(p) for p in fitted.pieces] == [[1, 3], [1, 2, 3], [2]]
    assert [len(p) for p in fitted.pieces] == [3, 4, 2]
    assert fitted.truncated == 3  # 6 words + eos cut to 3 words + eos
    # no sentence end at all: one truncated piece
    lone = fit_source("a b c d e f", encode, 3)
    assert [words_of(p) for p in lone.pieces] == [[1, 1]] and lone.truncated == 4 and not lone.split
    with pytest.raises(ValueError, match="limit must be >= 2"):
        fit_source("a", encode, 1)
