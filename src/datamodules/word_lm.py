"""Word-level language modelling with block batching, as fairseq does (DeLighT, Transformer LMs).

``WordLMDataModule`` reads ``wiki.train.tokens``, ``wiki.valid.tokens`` and ``wiki.test.tokens``
from ``root`` (the unpacked ``wikitext-103-v1.zip``; files, cache and vocabulary size check as
:class:`~src.datamodules.word_corpus.WordCorpusDataModule`). As ``fairseq-preprocess
--only-source``: every line is split on white space and ends with ``</s>`` (an empty line is
``</s>`` alone); the dictionary is fairseq's (:class:`~src.datamodules.word_corpus.Vocabulary`):
``<s> <pad> </s> <unk>`` = 0, 1, 2, 3, then the training words by descending count, ties in string
order (fairseq sorts the words before ``Counter.most_common``), padded with ``madeupword0000``...
to a multiple of 8. WikiText-103 gives 267,735 words + 4 specials, padded to 267,744. A fairseq
``dict.txt`` (``word count`` per line, specials omitted) in ``root`` is used instead when present.
The word ``<unk>`` of WikiText is the special ``<unk>``; a word outside the dictionary also maps
to it.

Token ids of each split are cached in ``root/word_lm_cache/`` (``dict.txt``, ``<split>.npy``,
``meta.json`` written last), rebuilt when the source files change.

Batches (fairseq ``--sample-break-mode none``): a split is one stream; training takes blocks of
``tokens_per_sample`` targets, each input the stream shifted by one (the split's first token is
predicted from ``</s>``, as fairseq's ``TokenBlockDataset`` does), shuffled. Validation and test
use context windows (fairseq ``eval_lm --context-window``, :class:`ContextWindows`): every token
is scored exactly once, after up to ``eval_context_window`` tokens of context. (Under DDP,
Lightning's distributed sampler repeats up to world_size - 1 windows to even out the ranks; take
the exact figure on one process.)

Every batch has one shape, as a step replayed as a CUDA graph needs: (batch_size,
tokens_per_sample) in training, whose last incomplete batch is dropped (the shuffle drops other
blocks each epoch), and (eval_batch_size, tokens_per_sample) in evaluation, whose short last
window and last batch are padded with ``pad`` rows and targets, which are not scored.

``PydocWordsDataModule`` is an offline demo corpus: CPython's documentation topics
(``pydoc_data.topics``) cut into words and punctuation, written in the WikiText layout under
``root`` and read back by the same code.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from src.datamodules.dictionary import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID
from src.datamodules.text_files import DEFAULT_ENCODING
from src.datamodules.word_corpus import PydocCorpus, Vocabulary, WordCorpusDataModule

BOS, PAD, EOS, UNK = BOS_ID, PAD_ID, EOS_ID, UNK_ID


def decode_words(dictionary: Vocabulary, ids: Iterable[int]) -> str:
    """The words of ``ids`` joined by spaces, ``</s>`` as a line break."""
    return dictionary.decode(ids)


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


def collate(
    items: Sequence[tuple[Tensor, Tensor]],
    pad: int = PAD,
    *,
    length: int | None = None,
    rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Right-pad (input, target) pairs to the longest, or to ``length``, and add rows of pad up to
    ``rows``; pad targets are not scored.

    Shape:
        -> ((B, T) int64 inputs, (B, T) int64 targets), B = ``rows`` or the items, T = ``length``
        or the longest
    """
    longest = max(len(x) for x, _ in items)
    length = longest if length is None else length
    rows = len(items) if rows is None else rows
    if rows < len(items) or length < longest:
        raise ValueError(f"{len(items)} items up to {longest} long do not fit ({rows}, {length})")
    inputs = torch.full((rows, length), pad, dtype=torch.long)
    targets = torch.full((rows, length), pad, dtype=torch.long)
    for b, (x, y) in enumerate(items):
        inputs[b, : len(x)] = x
        targets[b, : len(y)] = y
    return inputs, targets


class WordLMDataModule(WordCorpusDataModule):
    """WikiText-103 (or any corpus in its layout) for word-level language modelling in blocks.

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

    url = "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip"
    split_files: ClassVar[Mapping[str, str]] = {
        "train": "wiki.train.tokens", "val": "wiki.valid.tokens", "test": "wiki.test.tokens"
    }  # fmt: skip
    cache_dir = "word_lm_cache"
    vocabulary_file = "dict.txt"

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
        self.tokens_per_sample = tokens_per_sample
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.eval_context_window = eval_context_window
        self.pad = PAD
        super().__init__(root, vocab_size, num_workers=num_workers, encoding=encoding)

    # -- the dictionary -------------------------------------------------------------------------
    def _given_dictionary(self) -> Path | None:
        given = Path(self.root) / "dict.txt"
        return given if given.is_file() else None

    def _signature_files(self) -> list[Path]:
        given = self._given_dictionary()
        return [*super()._signature_files(), *([given] if given else [])]

    def _vocabulary_of(self, train: list[list[str]]) -> tuple[Vocabulary, Mapping[str, int]]:
        counts = word_counts(train)
        return Vocabulary.from_counts(counts), counts

    def _build_vocabulary(self, files: dict[str, Path]) -> tuple[Vocabulary, Mapping[str, int]]:
        given = self._given_dictionary()
        if given is None:
            return super()._build_vocabulary(files)
        return Vocabulary.load(given, self.encoding), word_counts(self._read(files["train"]))

    def _load_vocabulary(self, path: Path) -> Vocabulary:
        return Vocabulary.load(path)

    def _save_vocabulary(
        self, vocabulary: Vocabulary, path: Path, counts: Mapping[str, int]
    ) -> None:
        vocabulary.save(path, counts)

    def _missing_files_message(self, root: Path, missing: list[Path]) -> str:
        return (
            f"WikiText files not found under {root}: missing {', '.join(map(str, missing))}. "
            f"Expected the WikiText-103 layout: {root}/wiki.train.tokens, "
            f"wiki.valid.tokens, wiki.test.tokens (unzip {self.url} and set data.root to "
            "its wikitext-103 folder)"
        )

    def _vocab_size_message(self, size: int) -> str:
        return (
            f"the dictionary of {self.root} has {size} entries but data.vocab_size is "
            f"{self.vocab_size}; set data.vocab_size=null (the dictionary's size) or "
            f"data.vocab_size={size}"
        )

    # -- batches --------------------------------------------------------------------------------
    def example_input(self, batch_size: int = 1) -> Tensor:
        """A batch of ``</s>`` tokens with the training block shape: (batch_size, T)."""
        return torch.full((batch_size, self.tokens_per_sample), EOS, dtype=torch.long)

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool) -> DataLoader:
        # training drops its last incomplete batch, evaluation pads it: one shape either way
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=shuffle,
            collate_fn=partial(
                collate, pad=self.pad, length=self.tokens_per_sample, rows=batch_size
            ),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        blocks = TokenBlocks(self.splits["train"], self.tokens_per_sample)
        if len(blocks) < self.batch_size:
            raise ValueError(
                f"the training split has {len(blocks)} blocks of {self.tokens_per_sample} tokens, "
                f"fewer than batch_size {self.batch_size}; lower data.batch_size or "
                "data.tokens_per_sample"
            )
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


class PydocWordsDataModule(PydocCorpus, WordLMDataModule):
    """CPython's documentation topics as a word corpus in the WikiText layout (always offline).

    About 114k words and punctuation marks in 8.7k lines; the vocabulary (about 2.1k entries with
    ``min_count`` 3, padded to a multiple of 8) depends on the Python version, so by default
    ``vocab_size`` is counted. The split files are (re)written under ``root`` when missing or made
    from other text or settings, then read like WikiText-103.

    Args (besides :class:`WordLMDataModule`'s):
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
        vocab_size = self._use_pydoc(
            WORD.findall, vocab_size, val_fraction, test_fraction, min_count
        )
        super().__init__(
            root,
            vocab_size,
            tokens_per_sample,
            batch_size,
            eval_batch_size=eval_batch_size,
            eval_context_window=eval_context_window,
            num_workers=num_workers,
        )
