"""Character-level language-modelling corpora served for segment-level recurrence (Transformer-XL).

Three corpora: ``PydocCharsDataModule`` (the English text of CPython's documentation topics,
``pydoc_data.topics``, always available offline; character vocabulary), ``Enwik8DataModule`` (the
first 10^8 bytes of an English Wikipedia dump; byte vocabulary) and ``Text8DataModule`` (cleaned
Wikipedia text; 27 symbols). enwik8 and text8 follow the official Transformer-XL preparation
(``prep_enwik8.py``/``prep_text8.py``): the last 5M symbols are the test set, the 5M before them
the validation set, the rest (90M) the training set; in enwik8 the newline byte is dropped (the
official scripts write newlines as line breaks, which their tokenizer discards), leaving 204
symbols. The vocabulary is the sorted set of symbols of all three splits.

Tokenised splits are cached next to the data as ``<name>.<split>.npy`` (plus ``<name>.vocab.json``)
and memory-mapped, so a second run starts at once. A cache that does not load, has another dtype or
length than it was written with, or holds ids outside its vocabulary is rebuilt from the source
(with a warning), or, without the source, named in a ``CorruptCacheError``. A zip that does not
read (an interrupted download) raises ``zipfile.BadZipFile`` naming it and the download URL.

Batches follow Transformer-XL's ordered iterator: a split is cut into ``batch_size`` contiguous
sub-streams (row b of every batch continues row b of the previous one, so memories line up), served
in order as (input, target) segments of ``tgt_len`` symbols, the target shifted by one. Under DDP
each rank first takes its own contiguous, equally long slice of the stream. Training drops the
last segment when it is shorter (the official iterator serves it), so every training batch has
one shape, (batch_size, tgt_len), as a training step replayed as a CUDA graph needs; the tokens
it would have trained on are at most ``tgt_len - 1`` per row, at the end of the split. Evaluation
keeps it: every symbol is scored, in the two shapes (eval_batch_size, eval_tgt_len) and the last
one's.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import math
import zipfile
import zlib
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from src.utils.errors import DataNotFoundError, UserError
from src.utils.files import atomic_path, atomic_write_text

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
CACHE_DTYPES = (np.uint8, np.uint16)  # uint8 up to 256 symbols


class CorruptCacheError(UserError, ValueError):
    """A tokenised cache that is damaged and cannot be rebuilt (its source is missing)."""


class OrderedSegments(IterableDataset):
    """Consecutive (input, target) segments of a token stream cut into ``batch_size`` rows.

    The stream (after taking slice ``rank`` of ``world_size`` equal slices) is trimmed to a
    multiple of ``batch_size`` and viewed as ``batch_size`` contiguous rows of ``n_step`` tokens;
    segment s covers columns ``[s * tgt_len, (s + 1) * tgt_len)``, the last one possibly shorter
    (or, with ``drop_last``, left out).

    Args:
        tokens: the token ids of one split (a memory map is fine; it is read segment by segment).
        batch_size: number of parallel sub-streams.
        tgt_len: segment length.
        rank: this process's slice.
        world_size: number of slices (processes).
        drop_last: leave out a last segment shorter than ``tgt_len`` (training: one shape).

    Shape:
        items are ((batch_size, T) int64 inputs, (batch_size, T) int64 targets), T <= tgt_len
        (T = tgt_len with ``drop_last``)
    """

    def __init__(
        self,
        tokens: np.ndarray,
        batch_size: int,
        tgt_len: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        if batch_size < 1 or tgt_len < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need batch_size, tgt_len >= 1 and 0 <= rank < world_size, got "
                f"{batch_size}, {tgt_len}, {rank}, {world_size}"
            )
        per_rank = len(tokens) // world_size
        n_step = per_rank // batch_size
        needed = tgt_len + 1 if drop_last else 2
        if n_step < needed:
            raise ValueError(
                f"{len(tokens)} tokens are too few for {world_size} process(es) x batch_size "
                f"{batch_size} (each sub-stream needs at least {needed} tokens)"
            )
        start = rank * per_rank
        # (N,) -> (batch_size, n_step): row b is the b-th contiguous piece of this rank's slice
        self.rows = tokens[start : start + n_step * batch_size].reshape(batch_size, n_step)
        self.tgt_len = tgt_len
        self.n_step = n_step
        self.drop_last = drop_last

    def __len__(self) -> int:
        if self.drop_last:
            return (self.n_step - 1) // self.tgt_len
        return math.ceil((self.n_step - 1) / self.tgt_len)

    def __iter__(self):
        for begin in range(0, len(self) * self.tgt_len, self.tgt_len):
            end = min(begin + self.tgt_len, self.n_step - 1)
            window = torch.from_numpy(np.array(self.rows[:, begin : end + 1], dtype=np.int64))
            yield window[:, :-1], window[:, 1:]


def segments_loader(
    datamodule: L.LightningDataModule, split: str, batch_size: int, tgt_len: int
) -> DataLoader:
    """The :class:`OrderedSegments` of ``datamodule.splits[split]`` for this rank, as a loader:
    whole batches in order (no sampler, no shuffling), the short last training batch dropped
    (one batch shape for training)."""
    trainer = getattr(datamodule, "trainer", None)
    rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
    stream = OrderedSegments(
        datamodule.splits[split],
        batch_size,
        tgt_len,
        rank=rank,
        world_size=world,
        drop_last=split == "train",
    )
    return DataLoader(stream, batch_size=None, num_workers=0)


class CharLMDataModule(L.LightningDataModule, abc.ABC):
    """Shared caching, vocabulary and ordered batching; subclasses say where the symbols come from.

    Args:
        root: folder of the corpus; the tokenised cache is written here.
        vocab_size: size of the model's vocabulary; the corpus may use fewer symbols (ids above
            them are never produced), never more.
        tgt_len: training segment length.
        batch_size: training sub-streams (per process).
        eval_tgt_len: validation/test segment length.
        eval_batch_size: validation/test sub-streams (per process).
    """

    has_test = True
    name = ""

    def __init__(
        self,
        root: str,
        vocab_size: int,
        tgt_len: int,
        batch_size: int,
        *,
        eval_tgt_len: int,
        eval_batch_size: int,
    ) -> None:
        super().__init__()
        if (
            vocab_size < 2
            or tgt_len < 1
            or batch_size < 1
            or eval_tgt_len < 1
            or eval_batch_size < 1
        ):
            raise ValueError(
                "need vocab_size >= 2 and positive lengths/batch sizes, got "
                f"vocab_size={vocab_size}, tgt_len={tgt_len}, batch_size={batch_size}, "
                f"eval_tgt_len={eval_tgt_len}, eval_batch_size={eval_batch_size}"
            )
        self.root = root
        self.vocab_size = vocab_size
        self.tgt_len = tgt_len
        self.batch_size = batch_size
        self.eval_tgt_len = eval_tgt_len
        self.eval_batch_size = eval_batch_size
        self.splits: dict[str, np.ndarray] = {}
        self.symbols: list[int] = []

    # -- what subclasses provide -------------------------------------------------------------
    @abc.abstractmethod
    def source_signature(self) -> str:
        """Identifies the source and the split settings; a cache with another signature is
        rebuilt."""

    @abc.abstractmethod
    def read_symbols(self) -> dict[str, np.ndarray]:
        """The symbol codes (bytes or code points) of each split, keyed by ``SPLITS``."""

    # -- cache --------------------------------------------------------------------------------
    def cache_path(self, split: str) -> Path:
        return Path(self.root) / f"{self.name}.{split}.npy"

    def _vocab_path(self) -> Path:
        return Path(self.root) / f"{self.name}.vocab.json"

    def cache_files(self) -> list[Path]:
        """The split caches and the vocabulary file (written last: it marks the cache complete)."""
        return [self.cache_path(s) for s in SPLITS] + [self._vocab_path()]

    def _cache_damage(self) -> str | None:
        """What is wrong with a complete cache (None: intact, or not complete yet). Needs no
        source."""
        vocab_path = self._vocab_path()
        if not vocab_path.is_file():
            return None
        try:
            vocab = json.loads(vocab_path.read_text())
            n_symbols = len(vocab["symbols"])
        except (ValueError, KeyError, TypeError) as error:  # JSONDecodeError is a ValueError
            return (
                f"{vocab_path} does not hold the cache's vocabulary "
                f"({type(error).__name__}: {error})"
            )
        lengths = (
            vocab.get("lengths") or {}
        )  # absent from caches of older versions: rebuilt as stale
        for split in SPLITS:
            path = self.cache_path(split)
            if not path.is_file():
                return f"{path} is missing from the cache"
            try:
                ids = np.load(path, mmap_mode="r")
            except (OSError, ValueError, EOFError) as error:
                return f"{path} does not load ({type(error).__name__}: {error})"
            expected = lengths.get(split, len(ids))
            if ids.dtype not in CACHE_DTYPES or ids.shape != (expected,):
                return (
                    f"{path} holds {ids.dtype} {ids.shape}, expected uint8 or uint16 ({expected},)"
                )
            if len(ids) and int(ids.max()) >= n_symbols:
                return (
                    f"{path} holds id {int(ids.max())}, outside its vocabulary of {n_symbols} "
                    "symbols"
                )
        return None

    def _cache_is_current(self) -> bool:
        """Complete and built from the current source with the current split settings."""
        path = self._vocab_path()
        if not path.is_file():
            return False
        vocab = json.loads(path.read_text())
        return "lengths" in vocab and vocab.get("source") == self.source_signature()

    def _check_vocab_size(self, n_symbols: int) -> None:
        if n_symbols > self.vocab_size:
            raise ValueError(
                f"{self.name} has {n_symbols} distinct symbols but vocab_size is "
                f"{self.vocab_size}; set data.vocab_size={n_symbols}"
            )

    def prepare_data(self) -> None:
        """Tokenise the corpus into the cache, unless an intact one from the current source is
        there (rank 0 of each node under Lightning). A damaged cache is rebuilt, with a warning."""
        damage = self._cache_damage()
        if damage is None and self._cache_is_current():
            return
        try:
            codes = self.read_symbols()
        except FileNotFoundError as error:
            if damage is None:
                raise
            raise CorruptCacheError(
                f"{damage}, and the cache cannot be rebuilt: {error}\nProvide the source so that "
                "the cache is rebuilt from it, or delete the damaged cache files: "
                f"{' '.join(str(p) for p in self.cache_files())}"
            ) from error
        if damage is not None:
            log.warning("%s: %s; rebuilding the cache from the source", self.name, damage)
        symbols = np.unique(np.concatenate([codes[s] for s in SPLITS]))
        self._check_vocab_size(len(symbols))
        dtype = np.uint8 if self.vocab_size <= 256 else np.uint16
        Path(self.root).mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            ids = np.searchsorted(symbols, codes[split]).astype(dtype)
            _atomic_save(self.cache_path(split), ids)
        lengths = {s: len(codes[s]) for s in SPLITS}
        vocab = {"source": self.source_signature(), "symbols": symbols.tolist(), "lengths": lengths}
        atomic_write_text(
            self._vocab_path(), json.dumps(vocab)
        )  # last: it marks the cache complete
        log.info("%s: cached %s under %s", self.name, lengths, self.root)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # returns at once when the cache is intact and current
        self.symbols = json.loads(self._vocab_path().read_text())["symbols"]
        self._check_vocab_size(len(self.symbols))
        self.splits = {split: np.load(self.cache_path(split), mmap_mode="r") for split in SPLITS}

    # -- batches ------------------------------------------------------------------------------
    def example_input(self, batch_size: int = 1) -> Tensor:
        """A zero batch of token ids with the training segment shape: (batch_size, tgt_len)."""
        return torch.zeros(batch_size, self.tgt_len, dtype=torch.long)

    def _loader(self, split: str, batch_size: int, tgt_len: int) -> DataLoader:
        return segments_loader(self, split, batch_size, tgt_len)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, self.tgt_len)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.eval_batch_size, self.eval_tgt_len)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size, self.eval_tgt_len)


def _atomic_save(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as temporary:
        np.save(temporary, array)


def _last_splits(codes: np.ndarray, valid_size: int, test_size: int) -> dict[str, np.ndarray]:
    """Train = all but the last ``valid_size + test_size``, then validation, then test."""
    if valid_size < 1 or test_size < 1 or valid_size + test_size >= len(codes):
        raise ValueError(
            f"valid_size ({valid_size}) + test_size ({test_size}) must be positive and smaller "
            f"than the corpus ({len(codes)} symbols)"
        )
    held_out = valid_size + test_size
    return {
        "train": codes[:-held_out],
        "val": codes[-held_out:-test_size],
        "test": codes[-test_size:],
    }


class _WikipediaDataModule(CharLMDataModule):
    """enwik8/text8: the raw file ``<root>/<name>`` or the zip ``<root>/<name>.zip`` that holds
    it."""

    url = ""
    symbol_count = 0  # the corpus's vocabulary size, the default of ``vocab_size``

    def __init__(
        self,
        root: str,
        vocab_size: int | None = None,
        tgt_len: int = 512,
        batch_size: int = 22,
        *,
        eval_tgt_len: int = 128,
        eval_batch_size: int = 10,
        valid_size: int = 5_000_000,
        test_size: int = 5_000_000,
    ) -> None:
        super().__init__(
            root,
            self.symbol_count if vocab_size is None else vocab_size,
            tgt_len,
            batch_size,
            eval_tgt_len=eval_tgt_len,
            eval_batch_size=eval_batch_size,
        )
        self.valid_size = valid_size
        self.test_size = test_size

    def _source(self) -> Path:
        raw, packed = Path(self.root) / self.name, Path(self.root) / f"{self.name}.zip"
        if raw.is_file():
            return raw
        if packed.is_file():
            return packed
        raise DataNotFoundError(
            f"{self.name} not found: expected the raw file {raw} or the zip {packed} holding "
            f"'{self.name}' (download {self.url}); set data.root to its folder"
        )

    def source_signature(self) -> str:
        source = self._source()
        stat = source.stat()
        return (
            f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:"
            f"{self.valid_size}:{self.test_size}"
        )

    def _read_bytes(self) -> bytes:
        source = self._source()
        if source.suffix != ".zip":
            return source.read_bytes()
        try:
            with zipfile.ZipFile(source) as archive:
                if self.name not in archive.namelist():
                    raise DataNotFoundError(
                        f"{source} holds {archive.namelist()}, expected a member '{self.name}' "
                        f"(the archive of {self.url})"
                    )
                return archive.read(self.name)
        except (zipfile.BadZipFile, zlib.error, EOFError) as error:  # cut short or damaged
            raise zipfile.BadZipFile(
                f"{source} is not a readable zip archive ({error}); an interrupted download leaves "
                f"it truncated. Delete it and download it again from {self.url}, or put the "
                f"unpacked '{self.name}' file in {Path(self.root)}"
            ) from error

    def read_symbols(self) -> dict[str, np.ndarray]:
        codes = np.frombuffer(self._read_bytes(), dtype=np.uint8)
        return _last_splits(codes, self.valid_size, self.test_size)


class Enwik8DataModule(_WikipediaDataModule):
    """enwik8 (Hutter Prize): bytes, newline dropped as in the official preparation; 204 symbols.

    Args (besides :class:`CharLMDataModule`'s):
        valid_size, test_size: bytes of the validation and test splits (taken from the end).

    Shape:
        batches are ((B, T) int64 inputs, (B, T) int64 targets)
    """

    name = "enwik8"
    url = "http://mattmahoney.net/dc/enwik8.zip"
    symbol_count = 204

    def read_symbols(self) -> dict[str, np.ndarray]:
        # split first, then drop the newline byte, as prep_enwik8.py + the official tokenizer do
        return {split: codes[codes != ord("\n")] for split, codes in super().read_symbols().items()}


class Text8DataModule(_WikipediaDataModule):
    """text8: lower-case letters and space (27 symbols), the standard 90M/5M/5M split.

    Args (besides :class:`CharLMDataModule`'s):
        valid_size, test_size: characters of the validation and test splits (taken from the end).

    Shape:
        batches are ((B, T) int64 inputs, (B, T) int64 targets)
    """

    name = "text8"
    url = "http://mattmahoney.net/dc/text8.zip"
    symbol_count = 27


def pydoc_corpus() -> str:
    """The English text of CPython's documentation topics (``pydoc_data.topics.topics``), joined
    in the order the module lists them, one newline between topics."""
    from pydoc_data.topics import topics

    return "\n".join(topics.values())


def _code_points(text: str) -> np.ndarray:
    """(N,) uint32: the Unicode code point of each character of ``text``."""
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


class PydocCharsDataModule(CharLMDataModule):
    """The documentation topics that ship with CPython as a character corpus (always offline).

    About 465k characters, split 90/5/5 in order. The exact text, and so the vocabulary, depends
    on the Python version (103 distinct characters on 3.11, 104 on 3.12), so by default
    ``vocab_size`` is counted from the text at hand.

    Args (besides :class:`CharLMDataModule`'s):
        vocab_size: None (the default) for the corpus's number of distinct characters; a number
            must cover them.
        val_fraction, test_fraction: shares of the validation and test splits (taken from the end).

    Shape:
        batches are ((B, T) int64 inputs, (B, T) int64 targets)
    """

    name = "pydoc_chars"

    def __init__(
        self,
        root: str,
        vocab_size: int | None = None,
        tgt_len: int = 128,
        batch_size: int = 16,
        *,
        eval_tgt_len: int = 128,
        eval_batch_size: int = 8,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
    ) -> None:
        if vocab_size is None:
            vocab_size = len(np.unique(_code_points(pydoc_corpus())))
        super().__init__(
            root,
            vocab_size,
            tgt_len,
            batch_size,
            eval_tgt_len=eval_tgt_len,
            eval_batch_size=eval_batch_size,
        )
        if not (
            0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1
        ):
            raise ValueError(
                f"fractions must be in (0, 1) and sum below 1, got {val_fraction}, {test_fraction}"
            )
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction

    def source_signature(self) -> str:
        digest = hashlib.sha256(pydoc_corpus().encode()).hexdigest()[:16]
        return f"pydoc_data.topics:{digest}:{self.val_fraction}:{self.test_fraction}"

    def read_symbols(self) -> dict[str, np.ndarray]:
        codes = _code_points(pydoc_corpus())
        n = len(codes)
        return _last_splits(codes, round(n * self.val_fraction), round(n * self.test_fraction))
