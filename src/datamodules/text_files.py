"""Reading text files in a stated encoding, with one message for a byte that does not decode.

Every reader of a corpus's text (and ``translate.py``'s ``input=`` file) decodes through this
module. A file that is not in the stated encoding stops with a :class:`TextEncodingError` naming
the file, the 1-based line, the byte offset in the file, the byte, the encoding tried and the fix
(the setting to change, or an ``iconv`` command), instead of Python's ``UnicodeDecodeError``,
which names none of the file, the line or the fix. Byte-level corpora (enwik8, text8) are read as
bytes and never decoded.
"""

from __future__ import annotations

import codecs
import logging
import shlex
from collections.abc import Iterator
from pathlib import Path

from src.utils.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_ENCODING = "utf-8"
KEY = "data.encoding"  # the setting a message tells the user to change
EXAMPLE = "latin-1"  # decodes every byte, so a file that fails elsewhere at least reads in it
ERRORS = ("strict", "replace")
REPLACEMENT = "\ufffd"


class TextEncodingError(UserError, ValueError):
    """A text file that does not decode in the stated encoding, or an encoding Python lacks."""


def check_encoding(encoding: str, key: str = KEY) -> str:
    """``encoding`` when Python decodes text with it; else :class:`TextEncodingError` naming
    ``key`` and the value (``LookupError`` covers unknown names and bytes-only codecs)."""
    try:
        b"\x00".decode(encoding)  # not b"": an empty decode skips the codec lookup
    except UnicodeDecodeError:  # a text codec that needs more bytes (utf-16)
        pass
    except (LookupError, TypeError) as error:
        raise TextEncodingError(
            f"{key}={encoding!r} cannot decode text ({error}); use a codec name such as utf-8, "
            "latin-1 or cp1252 "
            "(https://docs.python.org/3/library/codecs.html#standard-encodings)"
        ) from None
    return encoding


def _where(raw: bytes, error: UnicodeDecodeError, encoding: str) -> str:
    """Line, file offset and value of the first byte ``error`` rejects, for a message."""
    offset = error.start
    # lines as the decoded text counts them (b"\n" is not the line break of every encoding)
    line = raw[:offset].decode(encoding, errors="replace").count("\n") + 1
    byte = raw[offset]
    seen_as = bytes([byte]).decode(EXAMPLE)
    hint = f"; in {EXAMPLE} it is {seen_as!r}" if seen_as.isprintable() else ""
    return (
        f"line {line} does not decode as {encoding}: byte 0x{byte:02x} at byte offset {offset} of "
        f"the file ({error.reason}{hint})"
    )


def _fix(source: str, encoding: str, key: str) -> str:
    """What to do about a file that does not decode as ``encoding``, for a message."""
    quoted = shlex.quote(source)
    to_utf8 = "" if codecs.lookup(encoding).name == "utf-8" else f" with {key}=utf-8"
    return (
        f"Set {key} to the file's encoding (e.g. {key}={EXAMPLE}), or re-encode the file to "
        f"UTF-8 and use the copy in its place{to_utf8}: iconv -f latin1 -t utf-8 {quoted} > "
        f"{shlex.quote(source + '.utf8')}"
    )


def decode_text(
    raw: bytes,
    encoding: str = DEFAULT_ENCODING,
    *,
    source: str,
    key: str = KEY,
    errors: str = "strict",
) -> str:
    """``raw`` decoded as ``encoding``; line ends are left as they are.

    Args:
        raw: the file's bytes.
        encoding: a Python codec name.
        source: the file's name in messages (a path, or ``<stdin>``).
        key: the setting that chooses the encoding, named in the fix.
        errors: ``"strict"``: a byte that does not decode raises :class:`TextEncodingError`;
            ``"replace"``: such bytes become U+FFFD, and one warning gives their count and the
            first one's place.
    """
    if errors not in ERRORS:
        raise ValueError(f"errors must be one of {ERRORS}, got {errors!r}")
    check_encoding(encoding, key)
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as error:
        where, fix = _where(raw, error, encoding), _fix(source, encoding, key)
    if errors == "strict":
        raise TextEncodingError(f"{source}: {where}. {fix}")
    text = raw.decode(encoding, errors="replace")
    log.warning(
        "%s: bytes that do not decode as %s became U+FFFD (%d replacement characters); "
        "the first: %s. %s",
        source,
        encoding,
        text.count(REPLACEMENT),
        where,
        fix,
    )
    return text


def read_text(path: str | Path, encoding: str = DEFAULT_ENCODING, *, key: str = KEY) -> str:
    """The text of ``path`` decoded as ``encoding`` (:func:`decode_text`, strict), every line end
    (``\\r\\n``, ``\\r``) as ``\\n``, as ``Path.read_text`` gives it."""
    text = decode_text(Path(path).read_bytes(), encoding, source=str(path), key=key)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def text_lines(
    path: str | Path, encoding: str = DEFAULT_ENCODING, *, key: str = KEY
) -> Iterator[str]:
    """The lines of ``path`` (each with its ``\\n``), decoded as ``encoding`` while they are read,
    so a large corpus is never held as one string; a byte that does not decode raises
    :class:`TextEncodingError` as :func:`read_text` does."""
    check_encoding(encoding, key)
    with open(path, encoding=encoding) as handle:
        try:
            yield from handle
        except UnicodeDecodeError:
            # the decoder saw one chunk: decode the whole file to place the byte in it
            decode_text(Path(path).read_bytes(), encoding, source=str(path), key=key)
            raise  # not reached: the whole file fails where its chunk did
