"""Atomic writes: a reader sees the old file or the whole new one, never half of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from src.utils.files import atomic_path, atomic_write_bytes, atomic_write_text, write_json


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "vocab.txt"
    atomic_write_text(target, "old\n")
    with pytest.raises(RuntimeError), atomic_path(target) as temporary:
        temporary.write_text("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab.txt"]


def test_writes_replace_whole_files_and_keep_the_suffix_numpy_needs(tmp_path: Path) -> None:
    atomic_write_bytes(tmp_path / "a.bin", b"\x00\x01")
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    atomic_write_text(tmp_path / "t.txt", "ü", encoding="latin-1")
    assert (tmp_path / "t.txt").read_bytes() == b"\xfc"
    with atomic_path(tmp_path / "ids.npy") as temporary:
        np.save(temporary, np.arange(3))  # np.save adds no second .npy
    assert np.load(tmp_path / "ids.npy").tolist() == [0, 1, 2]
    write_json(tmp_path / "sub" / "m.json", {"b": 1, "a": 2})
    assert (tmp_path / "sub" / "m.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "ids.npy", "sub", "t.txt"]
