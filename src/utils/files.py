"""Small file helpers: writes that a reader (another rank, a later run, a crash) sees whole or
not at all.

A file is written to a temporary name beside it and renamed onto its own: ``os.replace`` within
one file system is atomic, so an interrupted write leaves the old file (or none), never half of
one. The temporary name carries the process id, so ranks that write the same file at once do not
write into each other's. (Checkpoints also fsync: :mod:`src.utils.checkpoint_io`.)
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so ``np.save`` adds none) for the block to
    write; renamed onto ``path`` when the block ends, removed when it raises."""
    path = Path(path)
    temporary = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)  # only still there when the block raised


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` whole or not at all (:func:`atomic_path`)."""
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding=encoding)
    return Path(path)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all (:func:`atomic_path`)."""
    with atomic_path(path) as temporary:
        temporary.write_bytes(data)
    return Path(path)


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, whole or not at all, creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
