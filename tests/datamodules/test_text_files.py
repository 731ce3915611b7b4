"""Text files read in a stated encoding: the message for a byte that does not decode (file, line,
offset, byte, encoding, fix), files decoded chunk by chunk, replaced bytes and unknown encodings.
The helpers write the Latin-1 files the readers' own tests use."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from src.datamodules.text_files import (
    TextEncodingError,
    check_encoding,
    decode_text,
    read_text,
    text_lines,
)
from src.utils.errors import UserError

# line 3 holds the one non-ASCII character, whose Latin-1 byte 0xfc is not UTF-8
LATIN1_LINES = ("das haus", "ein auto", "ein grün haus")


def write_latin1(path: Path, lines: Sequence[str] = LATIN1_LINES) -> int:
    """Write ``lines`` in Latin-1, one a line; the byte offset of the first 0xfc ('ü')."""
    raw = "".join(f"{line}\n" for line in lines).encode("latin-1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return raw.index(b"\xfc")


def check_message(
    message: str, path: Path, offset: int, line: int = 3, key: str = "data.encoding"
) -> None:
    """``message`` names the file, the line, the offset and value of the byte, and the fix."""
    assert str(path) in message
    assert f"line {line} does not decode as utf-8" in message
    assert f"byte 0xfc at byte offset {offset} of the file" in message
    assert f"{key}=latin-1" in message
    assert f"iconv -f latin1 -t utf-8 {path} > {path}.utf8" in message


def test_a_bad_byte_names_the_file_line_offset_byte_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "train.de"
    offset = write_latin1(path)
    assert offset == len("das haus\nein auto\nein gr")
    with pytest.raises(TextEncodingError) as error:
        read_text(path)
    message = str(error.value)
    check_message(message, path, offset)
    assert "(invalid start byte; in latin-1 it is 'ü')" in message
    assert "\n" not in message  # one line
    assert isinstance(error.value, UserError) and isinstance(error.value, ValueError)


def test_the_stated_encoding_reads_the_text(tmp_path: Path) -> None:
    path = tmp_path / "train.de"
    write_latin1(path)
    assert read_text(path, "latin-1").splitlines() == list(LATIN1_LINES)
    assert [line.rstrip("\n") for line in text_lines(path, "latin-1")] == list(LATIN1_LINES)


def test_line_ends_are_read_as_newlines(tmp_path: Path) -> None:
    path = tmp_path / "dos.txt"
    path.write_bytes(b"one\r\ntwo\rthree\n")
    assert read_text(path) == "one\ntwo\nthree\n"  # as Path.read_text gives it
    assert list(text_lines(path)) == ["one\n", "two\n", "three\n"]
    assert decode_text(path.read_bytes(), source=str(path)) == "one\r\ntwo\rthree\n"  # left as is


def test_a_bad_byte_past_the_first_chunk_is_placed_in_the_file(tmp_path: Path) -> None:
    # the line reader decodes in chunks; the message must count from the start of the file
    path = tmp_path / "wiki.train.tokens"
    head = [f"line {i} of plain words" for i in range(20_000)]
    offset = write_latin1(path, [*head, "ein grün haus", "the end"])
    assert offset > 100_000
    with pytest.raises(TextEncodingError) as error:
        list(text_lines(path))
    check_message(str(error.value), path, offset, line=20_001)


def test_a_script_names_its_own_setting(tmp_path: Path) -> None:
    path = tmp_path / "sentences.txt"
    offset = write_latin1(path)
    with pytest.raises(TextEncodingError) as error:
        read_text(path, key="encoding")
    check_message(str(error.value), path, offset, key="encoding")
    assert "data.encoding" not in str(error.value)


def test_another_encoding_than_utf8_is_named_with_the_way_back(tmp_path: Path) -> None:
    path = tmp_path / "train.de"
    offset = write_latin1(path)
    with pytest.raises(TextEncodingError) as error:
        read_text(path, "ascii")
    message = str(error.value)
    assert f"line 3 does not decode as ascii: byte 0xfc at byte offset {offset}" in message
    assert (
        "re-encode the file to UTF-8 and use the copy in its place with data.encoding=utf-8"
        in message
    )


def test_replaced_bytes_give_one_warning(tmp_path: Path, caplog) -> None:
    path = tmp_path / "tweets.csv"
    offset = write_latin1(path, ["text", "gut", "grün", "süß"])
    with caplog.at_level(logging.WARNING):
        text = decode_text(path.read_bytes(), source=str(path), errors="replace")
    assert text == "text\ngut\ngr\ufffdn\ns\ufffd\ufffd\n"
    [record] = caplog.records
    assert (
        f"{path}: bytes that do not decode as utf-8 became U+FFFD (3 replacement characters)"
        in record.message
    )
    assert (
        f"the first: line 3 does not decode as utf-8: byte 0xfc at byte offset {offset}"
        in record.message
    )
    assert "data.encoding=latin-1" in record.message
    with pytest.raises(ValueError, match="errors must be one of"):
        decode_text(b"", source="x", errors="ignore")


@pytest.mark.parametrize("encoding", ["utf-8", "UTF8", "latin-1", "cp1252", "utf-16"])
def test_known_encodings_pass(encoding: str) -> None:
    assert check_encoding(encoding) == encoding


@pytest.mark.parametrize(
    ("encoding", "reason"),
    [
        ("latin-9x", "unknown encoding: latin-9x"),
        ("base64", "'base64' is not a text encoding"),
        (None, "must be str"),
    ],
)
def test_an_unknown_encoding_names_the_key_and_value(
    encoding: str, reason: str, tmp_path: Path
) -> None:
    with pytest.raises(
        TextEncodingError,
        match=rf"^data\.encoding={encoding!r} cannot decode text \(.*{re.escape(reason)}",
    ):
        check_encoding(encoding)
    path = tmp_path / "plain.txt"
    path.write_text("plain\n")
    with pytest.raises(TextEncodingError, match=rf"^encoding={encoding!r} cannot decode text"):
        read_text(path, encoding, key="encoding")
    with pytest.raises(TextEncodingError, match=rf"^data\.encoding={encoding!r}"):
        list(text_lines(path, encoding))
