"""translate.py's input file and stdin: decoded in the ``encoding=`` it is given, and a byte that
does not decode named with the file, the line, the offset and the fix."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.commands.translate import read_sources
from src.datamodules.text_files import TextEncodingError
from tests.datamodules.test_text_files import LATIN1_LINES, check_message, write_latin1


def test_a_latin1_input_is_named_and_read_in_its_encoding(tmp_path: Path) -> None:
    path = tmp_path / "sentences.de"
    offset = write_latin1(path)
    with pytest.raises(TextEncodingError) as error:
        read_sources(OmegaConf.create({"input": str(path), "encoding": "utf-8"}), [])
    check_message(str(error.value), path, offset, key="encoding")
    assert "data.encoding" not in str(error.value)
    cfg = OmegaConf.create({"input": str(path), "encoding": "latin-1"})
    assert read_sources(cfg, ["Ein Satz."]) == ["Ein Satz.", *LATIN1_LINES]


def test_stdin_is_read_in_the_encoding(tmp_path: Path, monkeypatch) -> None:
    raw = "".join(f"{line}\n" for line in LATIN1_LINES).encode("latin-1")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    assert read_sources(OmegaConf.create({"input": "-", "encoding": "latin-1"}), []) == list(
        LATIN1_LINES
    )
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    with pytest.raises(
        TextEncodingError, match=r"^<stdin>: line 3 does not decode as utf-8: byte 0xfc"
    ):
        read_sources(OmegaConf.create({"input": "-", "encoding": "utf-8"}), [])
