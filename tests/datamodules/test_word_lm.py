"""Word-level WikiText-layout data: fairseq's dictionary, line ends, blocks, context windows
(every token scored exactly once), the vocabulary-size check, the missing-root message and the
embedded pydoc_words corpus."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from src.datamodules.text_files import TextEncodingError
from src.datamodules.word_lm import (
    EOS,
    PAD,
    UNK,
    ContextWindows,
    PydocWordsDataModule,
    TokenBlocks,
    WordLMDataModule,
    collate,
    decode_words,
)
from tests.datamodules.test_text_files import check_message, write_latin1

TRAIN = "the cat sat\n\nthe dog sat on the mat\n= Title =\n"
VALID = "the cat\n"
TEST = "a dog sat <unk>\nzebra\n"


@pytest.fixture
def wikitext(tmp_path: Path) -> Path:
    for name, text in (
        ("wiki.train.tokens", TRAIN),
        ("wiki.valid.tokens", VALID),
        ("wiki.test.tokens", TEST),
    ):
        (tmp_path / name).write_text(text)
    return tmp_path


def test_dictionary_follows_fairseq(wikitext: Path) -> None:
    dm = WordLMDataModule(
        str(wikitext), vocab_size=None, tokens_per_sample=4, eval_context_window=2
    )
    dm.setup()
    words = dm.dictionary.symbols
    # specials, then by count (the 3; "=" and sat 2; then the count-1 words), ties in string
    # order, padded to a multiple of 8
    assert words[:10] == ("<s>", "<pad>", "</s>", "<unk>", "the", "=", "sat", "Title", "cat", "dog")
    assert words[10:12] == ("mat", "on") and words[12:] == (
        "madeupword0000",
        "madeupword0001",
        "madeupword0002",
        "madeupword0003",
    )
    assert dm.vocab_size == len(dm.dictionary) == 16
    assert (dm.dictionary.index("cat"), dm.dictionary.index("zebra")) == (8, UNK)
    assert decode_words(dm.dictionary, [4, 8, EOS, 6]) == "the cat\nsat"
    # every line ends with </s>, an empty line is </s> alone, unknown words are <unk>
    assert np.asarray(dm.splits["val"]).tolist() == [4, 8, EOS]
    assert np.asarray(dm.splits["test"]).tolist() == [UNK, 9, 6, UNK, EOS, UNK, EOS]
    assert len(dm.splits["train"]) == 3 + 1 + 1 + 6 + 1 + 3 + 1
    # the cache holds fairseq's dict.txt: word and training count per line
    lines = (wikitext / "word_lm_cache" / "dict.txt").read_text().splitlines()
    assert lines[:3] == ["the 3", "= 2", "sat 2"] and len(lines) == 12


def test_a_given_dict_txt_is_used(wikitext: Path) -> None:
    (wikitext / "dict.txt").write_text("sat 9\nthe 5\n")
    dm = WordLMDataModule(str(wikitext), vocab_size=6, tokens_per_sample=4, eval_context_window=2)
    dm.setup()
    assert dm.dictionary.symbols == ("<s>", "<pad>", "</s>", "<unk>", "sat", "the")
    assert np.asarray(dm.splits["val"]).tolist() == [5, UNK, EOS]


def test_vocabulary_size_mismatch_names_both_sizes_and_the_fix(wikitext: Path) -> None:
    dm = WordLMDataModule(
        str(wikitext), vocab_size=267744, tokens_per_sample=4, eval_context_window=2
    )
    with pytest.raises(
        ValueError, match="has 16 entries but data.vocab_size is 267744; set data.vocab_size=null"
    ):
        dm.setup()


def test_missing_root_names_the_path_and_layout(tmp_path: Path) -> None:
    dm = WordLMDataModule(str(tmp_path / "absent"), tokens_per_sample=4, eval_context_window=2)
    with pytest.raises(
        FileNotFoundError, match=r"absent.*Expected the WikiText-103 layout: .*wiki.train.tokens"
    ):
        dm.setup()


def test_bad_dict_txt_line_is_named(wikitext: Path) -> None:
    (wikitext / "dict.txt").write_text("sat 9\nbroken\n")
    with pytest.raises(ValueError, match=r"dict.txt:2: expected '<symbol> <count>'"):
        WordLMDataModule(str(wikitext), vocab_size=None, tokens_per_sample=4, eval_context_window=2)


def test_cache_is_rebuilt_when_a_split_changes(wikitext: Path) -> None:
    dm = WordLMDataModule(str(wikitext), vocab_size=16, tokens_per_sample=4, eval_context_window=2)
    dm.setup()
    (wikitext / "wiki.valid.tokens").write_text("the dog dog\n")
    again = WordLMDataModule(
        str(wikitext), vocab_size=16, tokens_per_sample=4, eval_context_window=2
    )
    again.setup()
    assert np.asarray(again.splits["val"]).tolist() == [4, 9, 9, EOS]


def test_blocks_predict_the_stream_shifted_by_one() -> None:
    stream = np.arange(10, 21)  # 11 tokens
    blocks = TokenBlocks(stream, 4)
    assert len(blocks) == 3
    x0, y0 = blocks[0]
    assert x0.tolist() == [EOS, 10, 11, 12] and y0.tolist() == [10, 11, 12, 13]
    x2, y2 = blocks[2]
    assert x2.tolist() == [17, 18, 19] and y2.tolist() == [18, 19, 20]
    inputs, targets = collate([blocks[1], blocks[2]])
    assert inputs.shape == (2, 4) and targets[1].tolist() == [18, 19, 20, PAD]


@pytest.mark.parametrize(
    ("length", "context"), [(11, 0), (11, 2), (23, 3), (4, 3), (3, 1), (100, 7)]
)
def test_context_windows_score_every_token_exactly_once(length: int, context: int) -> None:
    stream = np.arange(10, 10 + length)
    windows = ContextWindows(stream, 8, context)
    scored = []
    for j in range(len(windows)):
        x, y = windows[j]
        assert len(x) == len(y) <= 8
        keep = y != PAD
        # inputs are the stream one step before the targets, context positions included
        start = int(y[keep][0]) - 10 - int((~keep).sum())
        assert x.tolist() == ([EOS] + stream.tolist())[start : start + len(x)]
        if j > 0:
            assert int((~keep).sum()) == context  # exactly C context positions, not scored
        scored += y[keep].tolist()
    assert scored == stream.tolist()


def test_context_zero_windows_are_the_blocks() -> None:
    stream = np.arange(10, 31)
    windows, blocks = ContextWindows(stream, 8, 0), TokenBlocks(stream, 8)
    assert len(windows) == len(blocks) == 3
    for j in range(3):
        assert all(torch.equal(a, b) for a, b in zip(windows[j], blocks[j]))


def test_windows_reject_a_context_as_long_as_the_block() -> None:
    with pytest.raises(ValueError, match="context_window"):
        ContextWindows(np.arange(5), 8, 8)


def test_loaders_batch_and_pad(wikitext: Path) -> None:
    dm = WordLMDataModule(
        str(wikitext),
        vocab_size=None,
        tokens_per_sample=4,
        batch_size=2,
        eval_batch_size=3,
        eval_context_window=2,
    )
    dm.setup()
    x, y = next(iter(dm.test_dataloader()))
    # test: 7 tokens -> window [0, 4) and window scoring [4, 6) and [6, 7) after 2 context tokens
    assert x.shape == (3, 4)
    assert y[0].tolist() == [UNK, 9, 6, UNK] and y[1].tolist() == [PAD, PAD, EOS, UNK]
    assert y[2].tolist() == [PAD, PAD, EOS, PAD]
    assert dm.example_input(2).shape == (2, 4)


def test_pydoc_words_corpus(tmp_path: Path) -> None:
    dm = PydocWordsDataModule(str(tmp_path), tokens_per_sample=32, eval_context_window=16)
    dm.setup()
    assert (tmp_path / "wiki.train.tokens").is_file() and dm.vocab_size == len(dm.dictionary)
    assert dm.vocab_size % 8 == 0 and 1500 < dm.vocab_size < 3000
    train = np.asarray(dm.splits["train"])
    assert 90_000 < len(train) < 130_000 and len(dm.splits["test"]) > 5000
    counts = Counter(train.tolist())
    # every word kept occurs at least min_count = 3 times in training
    assert min(c for i, c in counts.items() if i > UNK) >= 3
    # ids follow descending training counts
    by_id = [counts.get(i, 0) for i in range(UNK + 1, 40)]
    assert by_id == sorted(by_id, reverse=True)
    before = (tmp_path / "wiki.train.tokens").stat().st_mtime_ns
    PydocWordsDataModule(str(tmp_path), tokens_per_sample=32, eval_context_window=16).setup()
    assert (tmp_path / "wiki.train.tokens").stat().st_mtime_ns == before  # same text: not rewritten


def test_a_latin1_corpus_is_named_and_read_in_its_encoding(wikitext: Path) -> None:
    train = wikitext / "wiki.train.tokens"
    offset = write_latin1(train, ["the cat sat", "the dog sat", "the grün mat"])
    with pytest.raises(TextEncodingError) as error:
        WordLMDataModule(str(wikitext), vocab_size=None, tokens_per_sample=4, eval_context_window=2)
    check_message(str(error.value), train, offset)
    dm = WordLMDataModule(
        str(wikitext),
        vocab_size=None,
        tokens_per_sample=4,
        eval_context_window=2,
        encoding="latin-1",
    )
    dm.setup()
    assert (
        decode_words(dm.dictionary, np.asarray(dm.splits["train"])[-4:-1].tolist())
        == "the grün mat"
    )
    # the cache is of the Latin-1 reading: read as UTF-8, the files are decoded again (and fail)
    again = WordLMDataModule(
        str(wikitext), vocab_size=dm.vocab_size, tokens_per_sample=4, eval_context_window=2
    )
    with pytest.raises(TextEncodingError, match="line 3 does not decode as utf-8"):
        again.setup()
