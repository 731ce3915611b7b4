"""The ``translate.py`` entry point's reading of sources: blank lines of an input file pass through
as blank output lines, so the translations stay aligned with the input line for line; a line
longer than the model's maximum is translated in pieces (or truncated) on its own output line; what
the vocabulary lacks is named. Run on a
small untrained translation network (the same weights for every call: the alignment is under
test, not the translations)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from src.commands.translate import split_lines, translate
from src.datamodules.dictionary import UNK_ID
from src.datamodules.subword import train_sentencepiece
from tests.conftest import compose_config
from tests.tasks.test_translation_task import reversal_corpus


@pytest.fixture(scope="module")
def overrides(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A small DeLighT translating a generated corpus, greedy and short, with random weights."""
    corpus = reversal_corpus(tmp_path_factory.mktemp("translate") / "corpus", n_train=200)
    return [
        "data=iwslt14_de_en", f"data.root={corpus}", "data.source_lang=xx", "data.target_lang=yy",
        "data.src_vocab_size=null", "data.tgt_vocab_size=null", "model.d_model=32", "model.n_min=2",
        "model.n_max=3", "task.max_len_a=0", "task.max_len_b=6", "allow_random=true",
        "decoding=greedy", "batch_size=2",
    ]  # fmt: skip


def translate_here(
    overrides: list[str], tmp_path: Path, sentences: list[str], *extra: str
) -> list[str]:
    """``translate(...)`` with the network initialised from one seed, so every call has its
    weights."""
    cfg = compose_config("translate", [*overrides, *extra], tmp_path / "run")
    torch.manual_seed(0)
    return translate(cfg, sentences)


def test_split_lines_breaks_at_line_ends_only() -> None:
    # the final line break ends the last line and adds none
    assert split_lines("a b\n\n  \nc\n") == ["a b", "", "  ", "c"]
    assert split_lines("a\r\nb\rc") == ["a", "b", "c"]
    # a form feed or a Unicode line separator inside a sentence does not split it
    assert split_lines("a\x0cb\u2028c\n") == ["a\x0cb\u2028c"]
    assert split_lines("") == [] and split_lines("\n") == [""]


def test_blank_lines_pass_through_aligned(overrides, tmp_path, capsys, caplog) -> None:
    sources = ["w1 w2", "w3 w4 w5", "w6"]
    expected = translate_here(overrides, tmp_path, sources)
    assert len(set(expected)) == 3, (
        "distinct sources should translate differently, else alignment goes untested"
    )
    # an empty, a white-space-only and a tab line; a final line break
    text = "w1 w2\n\n   \nw3 w4 w5\n\t\nw6\n"
    path = tmp_path / "sources.txt"
    path.write_text(text, encoding="utf-8")
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="translate"):
        got = translate_here(overrides, tmp_path, [], f"input={path}")
    assert got == [expected[0], "", "", expected[1], "", expected[2]]
    # one output line per input line
    assert capsys.readouterr().out == "".join(f"{t}\n" for t in got)
    assert [r.getMessage() for r in caplog.records if "blank" in r.getMessage()] == [
        "3 blank line(s) passed through as blank output lines"
    ]


def test_an_all_blank_input_is_refused_in_one_line(overrides, tmp_path) -> None:
    path = tmp_path / "blank.txt"
    path.write_text("\n  \n\n", encoding="utf-8")
    with pytest.raises(
        ValueError,
        match=r"^nothing to translate \(3 source\(s\), all blank; input=.*blank\.txt has 3 line",
    ) as caught:
        translate_here(overrides, tmp_path, [], f"input={path}")
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"^nothing to translate \(no source\)"):
        translate_here(overrides, tmp_path, [])


# -- long sources and words outside the vocabulary ---------------------------------------------
@pytest.fixture(scope="module")
def punctuated(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The small DeLighT's overrides on the generated corpus with " ." ending every line, and a
    maximum source length of 6 tokens (eos included)."""
    corpus = reversal_corpus(tmp_path_factory.mktemp("translate_long") / "corpus", n_train=200)
    for path in corpus.iterdir():
        path.write_text("".join(f"{line} .\n" for line in path.read_text().splitlines()))
    return [
        "data=iwslt14_de_en", f"data.root={corpus}", "data.source_lang=xx", "data.target_lang=yy",
        "data.src_vocab_size=null", "data.tgt_vocab_size=null", "data.max_source_positions=6",
        "model.d_model=32", "model.n_min=2", "model.n_max=3", "task.max_len_a=0",
        "task.max_len_b=6", "allow_random=true", "decoding=greedy", "batch_size=2",
    ]  # fmt: skip


def test_a_long_line_is_translated_in_pieces_on_its_own_line(punctuated, tmp_path, caplog) -> None:
    alone = translate_here(punctuated, tmp_path, ["w1 w2 .", "w3 w4 . w5 .", "w6 w7 w8 w9 w10"])
    assert len(set(alone)) == 3, "distinct pieces should translate differently"
    # line 2: 9 tokens with eos, cut after a sentence end into pieces of at most 6 (4 and 6);
    # line 3: one sentence of 8 tokens, truncated to its first 5 and eos
    path = tmp_path / "long.txt"
    path.write_text("w6 .\nw1 w2 . w3 w4 . w5 .\nw6 w7 w8 w9 w10 w11 w0\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="translate"):
        got = translate_here(punctuated, tmp_path, [], f"input={path}")
    assert len(got) == 3
    assert got[1:] == [f"{alone[0]} {alone[1]}", alone[2]]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{path}:2: 9 tokens (eos included), more than the model's maximum of 6 "
        "(data.max_source_positions): translated in 2 pieces split at sentence ends",
        f"{path}:3: 8 tokens (eos included), more than the model's maximum of 6 "
        "(data.max_source_positions): 2 token(s) cut off the end of over-long sentences and not "
        "translated",
        "2 of 3 source(s) longer than 6 tokens: 1 split at sentence ends, 1 truncated (their end "
        "not translated)",
    ]


def test_tokens_outside_the_vocabulary_are_named_and_read_as_unk(
    punctuated, tmp_path, caplog
) -> None:
    with caplog.at_level(logging.INFO, logger="translate"):
        got = translate_here(punctuated, tmp_path, ["w1 zz ö w2 .", "w3 ."])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "sentence 1: not in the model's source vocabulary, read as <unk> (their words will be "
        "missing or wrong in the translation): 'zz', 'ö' (U+00F6)",
        "1 of 2 source(s) have characters or tokens outside the vocabulary (read as <unk>)",
    ]
    assert got[0] == translate_here(punctuated, tmp_path, ["w1 <unk> <unk> w2 ."])[0]


def test_sentencepiece_names_the_characters_no_piece_covers(tmp_path) -> None:
    codec = train_sentencepiece(["ab ba abc cab bca"] * 20, tmp_path / "spm", 12)
    # a run of unknown characters is one <unk>; a full-width b is a b after NFKC
    assert codec.encode("ab 日本x€ ｂ").count(UNK_ID) == 1
    assert codec.unknown("ab 日本x€ ｂ") == ["日", "本", "x", "€"]
    assert codec.unknown("cab ba") == []
