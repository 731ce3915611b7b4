"""The token ids of a word corpus's splits, cached beside the corpus and rebuilt when it changes.

A cache folder holds ``<split>.npy`` (int32 ids, one array per split), the vocabulary file the
datamodule writes there, and ``meta.json``, written last: a folder without it, or whose recorded
source signature differs from the current one, is rebuilt. Every file is written to a temporary
name and renamed, so an interrupted build never leaves a half-written file under a final name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from src.utils.files import atomic_path, atomic_write_text


def files_signature(paths: Iterable[Path]) -> str:
    """Names, sizes and modification times of ``paths``: a cache built from other files differs."""
    return ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in paths)


class TokenCache:
    """One corpus's cached splits in ``folder``.

    Args:
        folder: where the cache lives (created on :meth:`write`).
        splits: the split names, e.g. ``("train", "val", "test")``.
        vocabulary_file: the name of the datamodule's vocabulary file in ``folder``; the cache is
            incomplete without it.
    """

    def __init__(self, folder: Path, splits: Sequence[str], vocabulary_file: str) -> None:
        self.folder = Path(folder)
        self.splits = tuple(splits)
        self.vocabulary_file = vocabulary_file

    @property
    def vocabulary_path(self) -> Path:
        return self.folder / self.vocabulary_file

    def is_current(self, signature: str) -> bool:
        """Whether ``meta.json`` records ``signature`` and every file is there."""
        meta = self.folder / "meta.json"
        if not meta.is_file():
            return False
        try:
            recorded = json.loads(meta.read_text())
        except ValueError:
            return False
        names = (self.vocabulary_file, *(f"{split}.npy" for split in self.splits))
        return recorded.get("source") == signature and all(
            (self.folder / name).is_file() for name in names
        )

    def write(
        self, signature: str, vocab_size: int, ids: Mapping[str, np.ndarray]
    ) -> dict[str, int]:
        """Save each split's ids, then ``meta.json``; returns the split lengths. The vocabulary
        file is the caller's to write into ``folder`` first."""
        self.folder.mkdir(parents=True, exist_ok=True)
        lengths = {}
        for split in self.splits:
            with atomic_path(self.folder / f"{split}.npy") as temporary:
                np.save(temporary, ids[split])
            lengths[split] = len(ids[split])
        meta = {"source": signature, "vocab_size": vocab_size, "lengths": lengths}
        # written last: its presence says the cache is complete
        atomic_write_text(self.folder / "meta.json", json.dumps(meta))
        return lengths

    def load(self) -> dict[str, np.ndarray]:
        """Each split's ids, memory-mapped.

        Shape:
            split -> (N_split,) int32
        """
        return {s: np.load(self.folder / f"{s}.npy", mmap_mode="r") for s in self.splits}
