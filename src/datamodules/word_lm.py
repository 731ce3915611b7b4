"""Word-level language-modelling corpora in the WikiText layout, batched as fairseq does.

``WikiTextDataModule`` reads ``wiki.train.tokens``, ``wiki.valid.tokens`` and ``wiki.test.tokens``
from ``root`` (the unpacked ``wikitext-103-v1.zip``). As ``fairseq-preprocess --only-source``:
every line is split on white space and ends with ``</s>`` (an empty line is ``</s>`` alone); the
dictionary is fairseq's (:class:`~src.datamodules.dictionary.Dictionary`): ``<s> <pad> </s> <unk>`` = 0, 1, 2, 3, then the
training words by descending count, ties in string order (fairseq sorts the words before
``Counter.most_common``), padded with ``madeupword0000``... to a multiple of 8. WikiText-103
gives 267,735 words + 4 specials, padded to 267,744. A fairseq ``dict.txt`` (``word count``
per line, specials omitted) in ``root`` is used instead when present. The word ``<unk>`` of
WikiText is the special ``<unk>``; a word outside the dictionary also maps to it.

Token ids of each split are cached in ``root/word_lm_cache/`` (``dict.txt``, ``<split>.npy``,
``meta.json`` written last), rebuilt when the source files change.

Batches (fairseq ``--sample-break-mode none``): a split is one stream; training takes blocks of
``tokens_per_sample`` targets, each input the stream shifted by one (the split's first token is
predicted from ``</s>``, as fairseq's ``TokenBlockDataset`` does), shuffled. Validation and test
use context windows (fairseq ``eval_lm --context-window``, :class:`ContextWindows`): every token
is scored exactly once, after up to ``eval_context_window`` tokens of context. (Under DDP,
Lightning's distributed sampler repeats up to world_size - 1 windows to even out the ranks; take
the exact figure on one process.)

``PydocWordsDataModule`` is an offline demo corpus: CPython's documentation topics
(``pydoc_data.topics``) cut into words and punctuation, written in the WikiText layout under
``root`` and read back by the same code.
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from src.datamodules.char_lm import pydoc_corpus
from src.datamodules.dictionary import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID, Dictionary
from src.datamodules.text_files import DEFAULT_ENCODING, check_encoding, text_lines
from src.datamodules.token_cache import TokenCache, files_signature
from src.utils.files import atomic_write_text

log = logging.getLogger(__name__)

BOS, PAD, EOS, UNK = BOS_ID, PAD_ID, EOS_ID, UNK_ID
SPLITS = ("train", "val", "test")
SPLIT_FILES = {"train": "wiki.train.tokens", "val": "wiki.valid.tokens", "test": "wiki.test.tokens"}
CACHE_DIR = "word_lm_cache"


def encode_lines(dictionary: Dictionary, lines: Iterable[Sequence[str]]) -> np.ndarray:
    """(N,) int32: the ids of the words of every line, each line followed by ``</s>``."""
    ids: list[int] = []
    for words in lines:
        ids.extend(map(dictionary.index, words))
        ids.append(EOS)
    return np.asarray(ids, dtype=np.int32)


def decode_words(dictionary: Dictionary, ids: Iterable[int]) -> str:
    """The words of ``ids`` joined by spaces, ``</s>`` as a line break."""
    return " ".join(dictionary.symbols[i] for i in ids).replace(" </s> ", "\n").replace("</s>", "\n")


def read_lines(path: Path, encoding: str = DEFAULT_ENCODING) -> list[list[str]]:
    """The white-space separated words of every line of ``path`` (fairseq's ``tokenize_line``),
    decoded as ``encoding``."""
    return [line.split() for line in text_lines(path, encoding)]


def word_counts(lines: Iterable[Sequence[str]]) -> Counter:
    """Word counts; the specials (``<unk>`` in the text, ``</s>`` ending each line) included."""
    counts: Counter = Counter()
    for words in lines:
        counts.update(words)
        counts[SPECIALS[EOS]] += 1
    return counts




class TokenBlocks(Dataset):
    """Consecutive blocks of ``tokens_per_sample`` targets of a stream (sample-break-mode none).

    Item k predicts ``stream[k T : (k + 1) T]`` from the tokens one step earlier; the stream's
    first token is predicted from ``</s>``. The last block may be shorter.

    Shape:
        items are ((t,) int64 inputs, (t,) int64 targets), t <= tokens_per_sample
    """

    def __init__(self, stream: np.ndarray, tokens_per_sample: int) -> None:
        if tokens_per_sample < 1 or len(stream) < 1:
            raise ValueError(
                f"need tokens_per_sample >= 1 and a non-empty stream, got {tokens_per_sample}, "
                f"{len(stream)} tokens"
            )
        self.stream = stream
        self.tokens_per_sample = tokens_per_sample

    def __len__(self) -> int:
        return math.ceil(len(self.stream) / self.tokens_per_sample)

    def __getitem__(self, k: int) -> tuple[Tensor, Tensor]:
        start = k * self.tokens_per_sample
        end = min(start + self.tokens_per_sample, len(self.stream))
        return _shifted(self.stream, start, end)


class ContextWindows(Dataset):
    """Evaluation windows with context (fairseq ``eval_lm --context-window``).

    With T = ``tokens_per_sample`` and C = ``context_window`` < T: window 0 predicts the first T
    tokens, all scored; window j >= 1 predicts the next S = T - C tokens after the C tokens before
    them, whose targets are ``pad`` (not scored). So every token is scored exactly once and all
    but the first T see at least C tokens of context. C = 0 gives :class:`TokenBlocks`.
    (fairseq's first window has S tokens; predictions there see the same context either way.)

    Shape:
        items are ((t,) int64 inputs, (t,) int64 targets with ``pad`` at context positions)
    """

    def __init__(
        self, stream: np.ndarray, tokens_per_sample: int, context_window: int, pad: int = PAD
    ) -> None:
        if not 0 <= context_window < tokens_per_sample or len(stream) < 1:
            raise ValueError(
                f"need 0 <= context_window < tokens_per_sample and a non-empty stream, got "
                f"context_window={context_window}, tokens_per_sample={tokens_per_sample}, "
                f"{len(stream)} tokens"
            )
        self.stream = stream
        self.tokens_per_sample = tokens_per_sample
        self.context_window = context_window
        self.stride = tokens_per_sample - context_window
        self.pad = pad

    def __len__(self) -> int:
        rest = max(len(self.stream) - self.tokens_per_sample, 0)
        return 1 + math.ceil(rest / self.stride)

    def __getitem__(self, j: int) -> tuple[Tensor, Tensor]:
        if j == 0:
            return _shifted(self.stream, 0, min(self.tokens_per_sample, len(self.stream)))
        first = self.tokens_per_sample + (j - 1) * self.stride  # first scored target
        end = min(first + self.stride, len(self.stream))
        inputs, targets = _shifted(self.stream, first - self.context_window, end)
        targets[: self.context_window] = self.pad
        return inputs, targets


def _shifted(stream: np.ndarray, start: int, end: int) -> tuple[Tensor, Tensor]:
    """Targets ``stream[start:end]`` and their inputs, one step earlier (``</s>`` before 0)."""
    targets = torch.from_numpy(np.array(stream[start:end], dtype=np.int64))
    before = np.array(stream[max(start - 1, 0) : end - 1], dtype=np.int64)
    if start == 0:
        before = np.concatenate([[EOS], before])
    return torch.from_numpy(before), targets


def collate(items: Sequence[tuple[Tensor, Tensor]], pad: int = PAD) -> tuple[Tensor, Tensor]:
    """Right-pad (input, target) pairs to the longest; pad targets are not scored.

    Shape:
        -> ((B, T) int64 inputs, (B, T) int64 targets)
    """
    length = max(len(x) for x, _ in items)
    inputs = torch.full((len(items), length), pad, dtype=torch.long)
    targets = torch.full((len(items), length), pad, dtype=torch.long)
    for b, (x, y) in enumerate(items):
        inputs[b, : len(x)] = x
        targets[b, : len(y)] = y
    return inputs, targets


class WikiTextDataModule(L.LightningDataModule):
    """WikiText-103 (or any corpus in its layout) for word-level language modelling.

    Args:
        root: the folder holding ``wiki.{train,valid,test}.tokens`` (and optionally ``dict.txt``).
        vocab_size: the dictionary size the model is built for (WikiText-103: 267,744); a
            dictionary of another size is refused. None: the dictionary's size (read or counted
            when the module is made).
        tokens_per_sample: block length (fairseq ``--tokens-per-sample``, 512).
        batch_size: training blocks per batch (per process).
        eval_batch_size: evaluation windows per batch.
        eval_context_window: C of :class:`ContextWindows` (thesis 480; the official README 400).
        num_workers: DataLoader workers.
        encoding: the text files' encoding (``dict.txt`` included), a Python codec name.

    Shape:
        batches are ((B, T) int64 inputs, (B, T) int64 targets), right-padded with ``pad``
    """

    has_test = True
    url = "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip"

    def __init__(
        self,
        root: str,
        vocab_size: int | None = 267_744,
        tokens_per_sample: int = 512,
        batch_size: int = 16,
        *,
        eval_batch_size: int = 2,
        eval_context_window: int = 480,
        num_workers: int = 0,
        encoding: str = DEFAULT_ENCODING,
    ) -> None:
        super().__init__()
        if tokens_per_sample < 1 or batch_size < 1 or eval_batch_size < 1 or num_workers < 0:
            raise ValueError(
                f"need positive tokens_per_sample and batch sizes, num_workers >= 0; got "
                f"{tokens_per_sample}, {batch_size}, {eval_batch_size}, {num_workers}"
            )
        if not 0 <= eval_context_window < tokens_per_sample:
            raise ValueError(
                f"eval_context_window must be in [0, tokens_per_sample={tokens_per_sample}), "
                f"got {eval_context_window}"
            )
        self.root = root
        self.tokens_per_sample = tokens_per_sample
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.eval_context_window = eval_context_window
        self.num_workers = num_workers
        self.encoding = check_encoding(encoding)
        self.pad = PAD
        self.dictionary: Dictionary | None = None
        self.splits: dict[str, np.ndarray] = {}
        self.vocab_size = self._count_vocabulary() if vocab_size is None else vocab_size

    # -- source and cache -----------------------------------------------------------------------
    def _source_files(self) -> dict[str, Path]:
        """The three split files; raises ``FileNotFoundError`` naming the expected layout."""
        root = Path(self.root)
        files = {split: root / name for split, name in SPLIT_FILES.items()}
        missing = [str(p) for p in files.values() if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"WikiText files not found under {root}: missing {', '.join(missing)}. "
                f"Expected the WikiText-103 layout: {root}/wiki.train.tokens, "
                f"wiki.valid.tokens, wiki.test.tokens (unzip {self.url} and set data.root to "
                "its wikitext-103 folder)"
            )
        return files

    def _cache(self) -> TokenCache:
        return TokenCache(Path(self.root) / CACHE_DIR, SPLITS, "dict.txt")

    def source_signature(self) -> str:
        """Sizes and times of the split files (and ``dict.txt``) and the encoding they are read
        in; a cache of other files, or of the same bytes decoded otherwise, is rebuilt."""
        files = list(self._source_files().values())
        given = Path(self.root) / "dict.txt"
        if given.is_file():
            files.append(given)
        return f"{files_signature(files)};encoding={codecs.lookup(self.encoding).name}"

    def _cache_is_current(self) -> bool:
        return self._cache().is_current(self.source_signature())

    def _dictionary_and_counts(self, files: dict[str, Path]) -> tuple[Dictionary, Counter]:
        counts = word_counts(read_lines(files["train"], self.encoding))
        given = Path(self.root) / "dict.txt"
        if given.is_file():
            return Dictionary.load(given, self.encoding), counts
        return Dictionary.from_counts(counts), counts

    def _count_vocabulary(self) -> int:
        if self._cache_is_current():
            return len(Dictionary.load(self._cache().vocabulary_path))
        return len(self._dictionary_and_counts(self._source_files())[0])

    def prepare_data(self) -> None:
        """Encode the three splits into the cache unless it is current (rank 0 of each node)."""
        if self._cache_is_current():
            return
        files = self._source_files()
        dictionary, counts = self._dictionary_and_counts(files)
        self._check_vocab_size(len(dictionary))
        cache = self._cache()
        cache.folder.mkdir(parents=True, exist_ok=True)
        dictionary.save(cache.vocabulary_path, counts)
        ids = {split: encode_lines(dictionary, read_lines(path, self.encoding)) for split, path in files.items()}
        lengths = cache.write(self.source_signature(), len(dictionary), ids)
        log.info(
            "word LM: %d words, splits %s cached under %s", len(dictionary), lengths, cache.folder
        )

    def _check_vocab_size(self, size: int) -> None:
        if size != self.vocab_size:
            raise ValueError(
                f"the dictionary of {self.root} has {size} entries but data.vocab_size is "
                f"{self.vocab_size}; set data.vocab_size=null (the dictionary's size) or "
                f"data.vocab_size={size}"
            )

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # returns at once when the cache is current
        cache = self._cache()
        self.dictionary = Dictionary.load(cache.vocabulary_path)
        self._check_vocab_size(len(self.dictionary))
        self.splits = cache.load()

    # -- batches --------------------------------------------------------------------------------
    def example_input(self, batch_size: int = 1) -> Tensor:
        """A batch of ``</s>`` tokens with the training block shape: (batch_size, T)."""
        return torch.full((batch_size, self.tokens_per_sample), EOS, dtype=torch.long)

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            collate_fn=collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        blocks = TokenBlocks(self.splits["train"], self.tokens_per_sample)
        return self._loader(blocks, self.batch_size, shuffle=True)

    def _eval_loader(self, split: str) -> DataLoader:
        windows = ContextWindows(
            self.splits[split], self.tokens_per_sample, self.eval_context_window, self.pad
        )
        return self._loader(windows, self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


WORD = re.compile(r"\w+|[^\w\s]")


def pydoc_word_splits(
    val_fraction: float = 0.05, test_fraction: float = 0.05, min_count: int = 3
) -> dict[str, list[list[str]]]:
    """The documentation topics as lines of words and punctuation marks, split in order.

    Empty lines are dropped; the last ``val_fraction`` and ``test_fraction`` of the lines are the
    validation and test splits. Words seen fewer than ``min_count`` times in the training lines
    become ``<unk>`` everywhere (WikiText's rule, with its threshold 3).
    """
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"fractions must be in (0, 1) and sum below 1, got {val_fraction}, {test_fraction}"
        )
    cut = (WORD.findall(line) for line in pydoc_corpus().split("\n"))
    lines = [words for words in cut if words]
    n_val, n_test = round(len(lines) * val_fraction), round(len(lines) * test_fraction)
    n_train = len(lines) - n_val - n_test
    splits = {
        "train": lines[:n_train],
        "val": lines[n_train : n_train + n_val],
        "test": lines[n_train + n_val :],
    }
    counts = Counter(w for words in splits["train"] for w in words)
    keep = {w for w, c in counts.items() if c >= min_count}
    return {
        split: [[w if w in keep else "<unk>" for w in words] for words in split_lines]
        for split, split_lines in splits.items()
    }


class PydocWordsDataModule(WikiTextDataModule):
    """CPython's documentation topics as a word corpus in the WikiText layout (always offline).

    About 114k words and punctuation marks in 8.7k lines; the vocabulary (about 2.1k entries with
    ``min_count`` 3, padded to a multiple of 8) depends on the Python version, so by default
    ``vocab_size`` is counted. The split files are (re)written under ``root`` when missing or made
    from other text or settings, then read like WikiText-103.

    Args (besides :class:`WikiTextDataModule`'s):
        vocab_size: None (the default) for the dictionary's size.
        val_fraction, test_fraction: shares of the lines for validation and test (from the end).
        min_count: training count below which a word becomes ``<unk>``.

    Shape:
        batches are ((B, T) int64 inputs, (B, T) int64 targets)
    """

    def __init__(
        self,
        root: str,
        vocab_size: int | None = None,
        tokens_per_sample: int = 128,
        batch_size: int = 16,
        *,
        eval_batch_size: int = 8,
        eval_context_window: int = 96,
        num_workers: int = 0,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        min_count: int = 3,
    ) -> None:
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.min_count = min_count
        self._texts = {
            split: "".join(" ".join(words) + "\n" for words in lines)
            for split, lines in pydoc_word_splits(val_fraction, test_fraction, min_count).items()
        }
        if vocab_size is None:
            lines = (text.split() for text in self._texts["train"].splitlines())
            vocab_size = len(Dictionary.from_counts(word_counts(lines)))
        super().__init__(
            root,
            vocab_size,
            tokens_per_sample,
            batch_size,
            eval_batch_size=eval_batch_size,
            eval_context_window=eval_context_window,
            num_workers=num_workers,
        )

    def _write_splits(self) -> None:
        """Write the three files unless they hold this text already."""
        root = Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        for split, name in SPLIT_FILES.items():
            path = root / name
            text = self._texts[split]
            if path.is_file() and _digest(path.read_text(encoding="utf-8")) == _digest(text):
                continue
            atomic_write_text(path, text)

    def _source_files(self) -> dict[str, Path]:
        self._write_splits()
        return super()._source_files()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
