"""The ``translate.py`` entry point's reading of sources: blank lines of an input file pass through
as blank output lines, so the translations stay aligned with the input line for line. Run on a
small untrained translation network (the same weights for every call: the alignment is under
test, not the translations)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tests.conftest import compose_config
from tests.tasks.test_translation_task import reversal_corpus
from src.commands.translate import split_lines, translate


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
    """``translate(...)`` with the network initialised from one seed, so every call has its weights."""
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
