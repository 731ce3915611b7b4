"""Word-level language-modelling corpora: what block batching (:mod:`src.datamodules.word_lm`)
and stream batching (:mod:`src.datamodules.awd_lm`) share.

A corpus is three split files under ``root``; every line is split on white space and ends with an
end-of-line word. :class:`WordCorpusDataModule` builds the :class:`Vocabulary` from the training
split, caches each split's token ids beside the files
(:class:`~src.datamodules.token_cache.TokenCache`, rebuilt when the files or their encoding
change) and checks the vocabulary size; :class:`PydocCorpus` writes CPython's documentation topics
as the split files of an offline demo corpus.
"""

from __future__ import annotations

import abc
import codecs
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import lightning as L
import numpy as np

from src.datamodules.char_lm import pydoc_corpus
from src.datamodules.dictionary import EOS_ID, SPECIALS, UNK, Dictionary
from src.datamodules.text_files import DEFAULT_ENCODING, check_encoding, text_lines
from src.datamodules.token_cache import TokenCache, files_signature
from src.utils.errors import DataNotFoundError
from src.utils.files import atomic_write_text

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
EOS = "<eos>"  # the end-of-line word of the official AWD-LSTM layout (fairseq's is "</s>")
SHOWN = 10  # unknown words named in an error message


class Vocabulary(Dictionary):
    """A word corpus's :class:`~src.datamodules.dictionary.Dictionary`, whose ids decode to text.

    Two layouts: fairseq's (the default; ``from_counts``, ``load``/``save`` of a ``dict.txt``):
    specials ``<s> <pad> </s> <unk>`` first, ``</s>`` ending each line; and the official AWD-LSTM
    ``data.Dictionary`` (:meth:`from_lines`, :meth:`load_words`/:meth:`save_words`): the words in
    order of first appearance, no specials, ``<eos>`` ending each line.

    Args:
        symbols: the table after the specials, in id order.
        specials: the symbols placed first.
        eos: the end-of-line word (a special or one of ``symbols``).
    """

    def __init__(
        self,
        symbols: Iterable[str],
        *,
        specials: Sequence[str] = SPECIALS,
        eos: str = SPECIALS[EOS_ID],
    ) -> None:
        super().__init__(symbols, specials=specials)
        self.eos = eos

    @classmethod
    def from_lines(cls, lines: Iterable[Sequence[str]]) -> Vocabulary:
        """The official layout: the words of ``lines`` (each followed by ``<eos>``) in order of
        first appearance."""
        seen: dict[str, None] = {}
        for words in lines:
            seen.update(dict.fromkeys(words))
            seen.setdefault(EOS)
        return cls(seen, specials=(), eos=EOS)

    @classmethod
    def load_words(cls, path: str | Path) -> Vocabulary:
        """The official layout from one word per line, in id order."""
        words = Path(path).read_text(encoding="utf-8").split("\n")[:-1]
        return cls(words, specials=(), eos=EOS)

    def save_words(self, path: str | Path) -> None:
        """Write one word per line (words hold no white space), atomically."""
        atomic_write_text(Path(path), "".join(f"{word}\n" for word in self.symbols))

    def encode_lines(self, lines: Iterable[Sequence[str]]) -> tuple[np.ndarray, Counter]:
        """(N,) int32 ids of every word of ``lines``, each line followed by the end-of-line word,
        and the counts of the words outside the vocabulary (given ``<unk>``'s id, or -1 without
        one)."""
        unknown: Counter = Counter()
        ids: list[int] = []
        eos = self.indices[self.eos]
        missing = -1 if self.unk_id is None else self.unk_id
        for words in lines:
            for word in words:
                found = self.indices.get(word)
                if found is None:
                    unknown[word] += 1
                    found = missing
                ids.append(found)
            ids.append(eos)
        return np.asarray(ids, dtype=np.int32), unknown

    def decode(self, ids: Iterable[int]) -> str:
        """The words of ``ids`` joined by spaces, the end-of-line word as a line break (the text;
        :meth:`Dictionary.decode <src.datamodules.dictionary.Dictionary.decode>` gives the tokens
        a subword codec joins)."""
        text = " ".join(self.symbols[i] for i in ids)
        return text.replace(f" {self.eos} ", "\n").replace(self.eos, "\n")


class WordCorpusDataModule(L.LightningDataModule, abc.ABC):
    """A word corpus's files, vocabulary and token cache; subclasses batch the token streams.

    Subclasses name the split files, the cache folder and vocabulary file, and give the
    vocabulary's layout and the messages for missing files and a vocabulary of another size. A
    validation or test word outside the vocabulary becomes ``<unk>`` (the count is logged); a
    vocabulary without ``<unk>`` refuses it.

    Args:
        root: the folder holding the split files.
        vocab_size: the vocabulary size the model is built for; a vocabulary of another size is
            refused at ``prepare_data``/``setup``. None: the vocabulary's size (read from the
            cache or counted from the training split when the module is made).
        num_workers: DataLoader workers.
        encoding: the text files' encoding, a Python codec name.

    After ``setup``: ``dictionary`` (the :class:`Vocabulary`) and ``splits`` (split -> (N,) int32
    ids, memory-mapped).
    """

    has_test = True
    split_files: ClassVar[Mapping[str, str]]
    cache_dir: ClassVar[str]
    vocabulary_file: ClassVar[str]

    def __init__(
        self,
        root: str,
        vocab_size: int | None,
        *,
        num_workers: int = 0,
        encoding: str = DEFAULT_ENCODING,
    ) -> None:
        super().__init__()
        self.root = root
        self.num_workers = num_workers
        self.encoding = check_encoding(encoding)
        self.dictionary: Vocabulary | None = None
        self.splits: dict[str, np.ndarray] = {}
        self.vocab_size = self._count_vocabulary() if vocab_size is None else vocab_size

    # -- the vocabulary's layout and the messages -------------------------------------------------
    @abc.abstractmethod
    def _vocabulary_of(self, train: list[list[str]]) -> tuple[Vocabulary, Mapping[str, int]]:
        """The vocabulary of the training lines and the word counts its file records."""

    @abc.abstractmethod
    def _load_vocabulary(self, path: Path) -> Vocabulary:
        """The vocabulary of the cache's vocabulary file."""

    @abc.abstractmethod
    def _save_vocabulary(
        self, vocabulary: Vocabulary, path: Path, counts: Mapping[str, int]
    ) -> None:
        """Write the cache's vocabulary file."""

    @abc.abstractmethod
    def _missing_files_message(self, root: Path, missing: list[Path]) -> str:
        """What to do when split files are missing: the expected layout and where to get it."""

    @abc.abstractmethod
    def _vocab_size_message(self, size: int) -> str:
        """Why a vocabulary of ``size`` entries is refused, and the fix."""

    # -- source and cache -------------------------------------------------------------------------
    def _source_files(self) -> dict[str, Path]:
        """The three split files; raises :class:`DataNotFoundError` naming the expected layout."""
        root = Path(self.root)
        files = {split: root / name for split, name in self.split_files.items()}
        missing = [path for path in files.values() if not path.is_file()]
        if missing:
            raise DataNotFoundError(self._missing_files_message(root, missing))
        return files

    def _signature_files(self) -> list[Path]:
        """The files whose change makes the cache stale."""
        return list(self._source_files().values())

    def _cache(self) -> TokenCache:
        return TokenCache(Path(self.root) / self.cache_dir, SPLITS, self.vocabulary_file)

    def source_signature(self) -> str:
        """Names, sizes and times of the source files and the encoding they are read in; a cache
        of other files, or of the same bytes decoded otherwise, is rebuilt."""
        signature = files_signature(self._signature_files())
        return f"{signature};encoding={codecs.lookup(self.encoding).name}"

    def _cache_is_current(self) -> bool:
        return self._cache().is_current(self.source_signature())

    def _read(self, path: Path) -> list[list[str]]:
        """The white-space separated words of every line of ``path`` (fairseq's
        ``tokenize_line``, the official ``data.py``'s split), decoded as ``encoding``."""
        return [line.split() for line in text_lines(path, self.encoding)]

    def _build_vocabulary(self, files: dict[str, Path]) -> tuple[Vocabulary, Mapping[str, int]]:
        return self._vocabulary_of(self._read(files["train"]))

    def _count_vocabulary(self) -> int:
        if self._cache_is_current():
            return len(self._load_vocabulary(self._cache().vocabulary_path))
        return len(self._build_vocabulary(self._source_files())[0])

    def _check_vocab_size(self, size: int) -> None:
        if size != self.vocab_size:
            raise ValueError(self._vocab_size_message(size))

    def _encode(self, vocabulary: Vocabulary, path: Path) -> np.ndarray:
        ids, unknown = vocabulary.encode_lines(self._read(path))
        if not unknown:
            return ids
        tokens, words = sum(unknown.values()), len(unknown)
        if vocabulary.unk_id is None:
            first = [w for w, _ in unknown.most_common(SHOWN)]
            raise ValueError(
                f"{path}: {tokens} tokens ({words} distinct words) are not in the training "
                f"vocabulary, which has no {UNK} to map them to; the most frequent: {first}. "
                f"Use the corpus's own splits, or replace rare words by {UNK} in all three files"
            )
        log.warning(
            "%s: %d tokens (%d distinct words) outside the training vocabulary mapped to %s",
            path, tokens, words, UNK,
        )  # fmt: skip
        return ids

    def prepare_data(self) -> None:
        """Encode the three splits into the cache unless it is current (rank 0 of each node)."""
        if self._cache_is_current():
            return
        files = self._source_files()
        vocabulary, counts = self._build_vocabulary(files)
        self._check_vocab_size(len(vocabulary))
        cache = self._cache()
        cache.folder.mkdir(parents=True, exist_ok=True)
        self._save_vocabulary(vocabulary, cache.vocabulary_path, counts)
        ids = {split: self._encode(vocabulary, path) for split, path in files.items()}
        lengths = cache.write(self.source_signature(), len(vocabulary), ids)
        log.info(
            "%s: %d words, splits %s cached under %s",
            type(self).__name__, len(vocabulary), lengths, cache.folder,
        )  # fmt: skip

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # returns at once when the cache is current
        cache = self._cache()
        self.dictionary = self._load_vocabulary(cache.vocabulary_path)
        self._check_vocab_size(len(self.dictionary))
        self.splits = cache.load()


def pydoc_splits(
    cut: Callable[[str], list[str]], val_fraction: float, test_fraction: float, min_count: int
) -> dict[str, list[list[str]]]:
    """CPython's documentation topics as lines of words (``cut`` of each source line), split in
    order.

    Lines left without words are dropped; the last ``val_fraction`` and ``test_fraction`` of the
    lines are validation and test. Words seen fewer than ``min_count`` times in the training lines
    become ``<unk>`` everywhere (WikiText's rule), so no validation or test word is outside the
    vocabulary.
    """
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"fractions must be in (0, 1) and sum below 1, got {val_fraction}, {test_fraction}"
        )
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    lines = [words for words in map(cut, pydoc_corpus().split("\n")) if words]
    n_val, n_test = round(len(lines) * val_fraction), round(len(lines) * test_fraction)
    n_train = len(lines) - n_val - n_test
    splits = {
        "train": lines[:n_train],
        "val": lines[n_train : n_train + n_val],
        "test": lines[n_train + n_val :],
    }
    counts = Counter(w for words in splits["train"] for w in words)
    return {
        split: [[w if counts[w] >= min_count else UNK for w in words] for words in split_lines]
        for split, split_lines in splits.items()
    }


class PydocCorpus(WordCorpusDataModule):
    """A word corpus made of CPython's documentation topics (:func:`pydoc_splits`), written as the
    split files under ``root`` (when missing or of other text) before they are read.

    A subclass also derives from the datamodule that batches it and calls :meth:`_use_pydoc`
    before that datamodule's constructor.
    """

    def _use_pydoc(
        self,
        cut: Callable[[str], list[str]],
        vocab_size: int | None,
        val_fraction: float,
        test_fraction: float,
        min_count: int,
    ) -> int:
        """Make the split texts; returns ``vocab_size``, or when None their training vocabulary's
        size (it depends on the Python version)."""
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.min_count = min_count
        splits = pydoc_splits(cut, val_fraction, test_fraction, min_count)
        self._texts = {
            split: "".join(" ".join(words) + "\n" for words in lines)
            for split, lines in splits.items()
        }
        if vocab_size is None:
            return len(self._vocabulary_of(splits["train"])[0])
        return vocab_size

    def _source_files(self) -> dict[str, Path]:
        root = Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        for split, name in self.split_files.items():
            path, text = root / name, self._texts[split]
            if not (path.is_file() and path.read_text(encoding="utf-8") == text):
                atomic_write_text(path, text)
        return super()._source_files()
