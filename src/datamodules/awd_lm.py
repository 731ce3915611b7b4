"""Word-level language modelling with contiguous column streams (AWD-LSTM / PRU LMs): PTB,
WikiText-2.

``AWDLMDataModule`` reads ``train.txt``, ``valid.txt`` and ``test.txt`` from ``root`` (files, cache
and vocabulary size check as :class:`~src.datamodules.word_corpus.WordCorpusDataModule`), the
layout the official ``getdata.sh`` scripts leave: Penn Treebank (Mikolov et al.) is
``ptb.{train,valid,test}.txt`` of ``simple-examples.tgz``, WikiText-2 is
``wiki.{train,valid,test}.tokens`` of ``wikitext-2-v1.zip``, each renamed.

Tokens follow the official ``data.py``: every line is split on white space and ends with
``<eos>`` (an empty line is ``<eos>`` alone). The vocabulary
(:meth:`~src.datamodules.word_corpus.Vocabulary.from_lines`) holds the training words in order of
first appearance, so ids (and an official checkpoint's embedding rows) line up with the official
code's. The official code builds it over train + valid + test; for PTB and WikiText-2 the two
agree, because those corpora are already ``<unk>``-processed: their validation and test text uses
only training words, which add no entries after the training ones (the configs' vocab_size, 10,000
and 33,278, checks this). A validation or test word outside the training vocabulary becomes
``<unk>`` when the vocabulary has it (the count is logged); without ``<unk>`` it is an error.
Token ids are cached in ``root/word_stream_cache/`` (``vocab.txt``, ``<split>.npy``, ``meta.json``
written last) and rebuilt when the split files change.

Batches (official ``batchify``/``get_batch``): a split is one stream of N tokens cut into B
contiguous columns of ``N // B`` tokens (the remainder dropped); row b of the batches is column b,
so row b of one batch continues row b of the previous one and a recurrent state carries over.
Training uses B = ``batch_size`` per process: under DDP the stream is cut into W * B columns and
rank r takes columns r*B .. (r+1)*B - 1. Its window lengths follow the official rule: the base
length is ``bptt`` with probability 1 - ``bptt_short_prob``, else ``bptt / 2``; the length is
``max(bptt_min, int(normal(base, bptt_std)))``, cut where the stream ends; one pass per epoch (the
official loop stops one target short of the end when only one is left). The lengths are drawn from
an RNG seeded by (seed, epoch), so every process draws the same ones; the official code draws
them from NumPy's global RNG, so the exact lengths differ. The task rescales the learning rate by
T / bptt from the batch (the official code uses the drawn length, which differs from T only for
the last, cut window). The number of training batches varies by epoch, so the training loader has
no length: Lightning validates at the end of each epoch, and ``limit_train_batches`` and
``val_check_interval`` must be 1.0 or a number of batches.

Fixed shapes (``bptt_step``; 10 in the configs, a deviation from the paper's recipe, which draws
continuous lengths): a training step traced with static shapes or replayed as a CUDA graph is
recorded once per window length, so each drawn length is rounded to the nearest multiple of
``bptt_step`` between ``bptt / 2 - bptt_step`` and ``bptt + bptt_step`` (:func:`bptt_choices`), and
the window the stream's end would cut is dropped (at most ``bptt + bptt_step`` tokens of each
column wait for the next epoch, whose lengths end elsewhere). A step of 10 = 2 * the official
``bptt_std`` keeps the base lengths at the middle of a rounding interval, so the mean moves little:
bptt 70 (PTB, WikiText-2) gives lengths 30 ... 80 (70: 65%, 60 and 80: 15% each, 30 and 40: 2.5%
each, 50: 0.2%), mean 68.3 tokens against the official 67.8 (+0.7%; the official ``int`` truncates
half a token), standard deviation 9.4 against 9.1; bptt 35 (the pydoc_ptb demo) gives 10, 20, 30,
40, mean 33.9 against 33.6 (+0.8%). The learning rate scale T / bptt averages the same fraction
higher. ``bptt_step: null`` restores the official lengths.

Validation and test take fixed windows of ``bptt`` over ``eval_batch_size`` / ``test_batch_size``
columns, in order. The last window is shorter; with ``bptt_step`` it is padded to ``bptt`` instead,
inputs with id 0 and targets with :data:`UNSCORED` (-100, ``F.cross_entropy``'s ``ignore_index``),
which the task neither scores nor counts: the padding follows every scored step, so the loss and
perplexity stay exact and every window has one shape. Every process evaluates the whole split, so
there is no distributed sampler (the loaders serve an ``IterableDataset``).

``PydocPTBDataModule`` is an offline demo corpus: CPython's documentation topics written in PTB
style under ``root`` and read back by the same code.
"""

from __future__ import annotations

import abc
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from src.datamodules.text_files import DEFAULT_ENCODING
from src.datamodules.word_corpus import EOS, PydocCorpus, Vocabulary, WordCorpusDataModule

PTB_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
WIKITEXT2_URL = "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip"
UNSCORED = -100  # the target of a padded step: F.cross_entropy's default ignore_index


def batchify(stream: np.ndarray, columns: int) -> np.ndarray:
    """The official ``batchify``, batch-first: ``columns`` contiguous rows of ``N // columns``.

    Shape:
        (N,) -> (columns, N // columns)
    """
    steps = len(stream) // columns
    # (N,) -> (columns, steps): row b is the b-th contiguous piece, the remainder dropped
    return stream[: steps * columns].reshape(columns, steps)


def bptt_choices(bptt: int, step: int, min_len: int) -> tuple[int, ...]:
    """The window lengths of the rounded rule: the multiples of ``step`` from
    ``max(min_len, bptt / 2 - step)`` to ``bptt + step`` (at least one: the multiple nearest
    ``bptt``). With the official σ = 5 and ``step`` 10 = 2σ: bptt 70 -> 30, 40, ..., 80 and
    bptt 35 -> 10, 20, 30, 40."""
    if step < 1:
        raise ValueError(f"bptt_step must be >= 1, got {step}")
    low, high = max(min_len, bptt / 2 - step), bptt + step
    choices = tuple(c for c in range(step, int(high) + 1, step) if c >= low)
    return choices or (step * max(1, round(bptt / step)),)


def bptt_lengths(
    steps: int,
    *,
    bptt: int,
    short_prob: float,
    std: float,
    min_len: int,
    seed: int,
    epoch: int,
    step: int | None = None,
) -> list[int]:
    """Window lengths of one training pass over rows of ``steps`` tokens.

    Official rule (``step`` None): base ``bptt`` with probability 1 - ``short_prob``, else
    ``bptt / 2``; length ``max(min_len, int(normal(base, std)))``, cut at the end of the rows; the
    pass stops when fewer than two targets are left (the official ``while i < len - 2``).

    Rounded rule (``step``): the same draws, each length the nearest of :func:`bptt_choices`; a
    window that would run past the end of the rows ends the pass instead (its tokens wait for
    the next epoch's windows), so every length is one of the choices. Seeded by (seed, epoch).
    """
    rng = np.random.default_rng((seed, epoch))
    choices = None if step is None else np.asarray(bptt_choices(bptt, step, min_len))
    lengths = []
    start = 0
    while start < steps - 2:
        base = bptt if rng.random() < 1 - short_prob else bptt / 2
        drawn = rng.normal(base, std)
        if choices is None:
            length = max(min_len, int(drawn))
        else:
            length = int(choices[np.abs(choices - drawn).argmin()])
            if start + length > steps - 1:
                break
        lengths.append(min(length, steps - 1 - start))
        start += length
    return lengths


class _ColumnWindows(IterableDataset):
    """(inputs, targets) windows of a stream's rows, in order; subclasses choose the windows.

    Loader workers take turns (worker w serves windows w, w + n_workers, ...), which a
    ``DataLoader`` reads round robin, so the order is kept.

    Shape:
        items are ((B, t) int64 inputs, (B, t) int64 targets), targets one step later
    """

    def __init__(self, rows: np.ndarray) -> None:
        super().__init__()
        self.rows = rows

    @abc.abstractmethod
    def _pass_windows(self) -> list[tuple[int, int]]:
        """(start, length) of the windows of the next pass."""

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        windows = self._pass_windows()
        worker = get_worker_info()
        if worker is not None:
            windows = windows[worker.id :: worker.num_workers]
        return (self._window(start, length) for start, length in windows)

    def _window(self, start: int, length: int) -> tuple[Tensor, Tensor]:
        inputs = np.array(self.rows[:, start : start + length], dtype=np.int64)
        targets = np.array(self.rows[:, start + 1 : start + 1 + length], dtype=np.int64)
        return torch.from_numpy(inputs), torch.from_numpy(targets)


class VariableBPTTWindows(_ColumnWindows):
    """Training windows of variable length (:func:`bptt_lengths`, rounded to multiples of ``step``
    unless it is None), one pass per iteration.

    Each iteration is the next epoch, starting at ``epoch`` (``set_epoch`` moves it); with loader
    workers they must be persistent, so that each worker's copy counts the epochs. The number of
    windows varies by epoch, so there is no ``__len__``.

    Shape:
        items are ((B, t) int64 inputs, (B, t) int64 targets), t varies
    """

    def __init__(
        self,
        rows: np.ndarray,
        *,
        bptt: int,
        short_prob: float,
        std: float,
        min_len: int,
        seed: int,
        epoch: int = 0,
        step: int | None = None,
    ) -> None:
        super().__init__(rows)
        self.bptt = bptt
        self.short_prob = short_prob
        self.std = std
        self.min_len = min_len
        self.seed = seed
        self.epoch = epoch
        self.step = step

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``."""
        self.epoch = epoch

    def _pass_windows(self) -> list[tuple[int, int]]:
        lengths = bptt_lengths(
            self.rows.shape[1],
            bptt=self.bptt,
            short_prob=self.short_prob,
            std=self.std,
            min_len=self.min_len,
            seed=self.seed,
            epoch=self.epoch,
            step=self.step,
        )
        self.epoch += 1
        starts = np.cumsum([0, *lengths[:-1]]).tolist()
        return list(zip(starts, lengths))


class FixedWindows(_ColumnWindows):
    """Evaluation windows of ``length``: every target once, in order. The last one is shorter, or
    with ``pad_last`` as long as the others: inputs padded with id 0 and targets with
    :data:`UNSCORED`, which the loss skips (the padding comes after every scored step, so no score
    changes).

    Shape:
        items are ((B, t) int64 inputs, (B, t) int64 targets), t <= length (t = length with
        ``pad_last``)
    """

    def __init__(self, rows: np.ndarray, length: int, *, pad_last: bool = False) -> None:
        super().__init__(rows)
        self.length = length
        self.pad_last = pad_last

    def __len__(self) -> int:
        return math.ceil((self.rows.shape[1] - 1) / self.length)

    def _pass_windows(self) -> list[tuple[int, int]]:
        targets = self.rows.shape[1] - 1
        return [(s, min(self.length, targets - s)) for s in range(0, targets, self.length)]

    def _window(self, start: int, length: int) -> tuple[Tensor, Tensor]:
        inputs, targets = super()._window(start, length)
        if not self.pad_last or length == self.length:
            return inputs, targets
        missing = self.length - length
        return F.pad(inputs, (0, missing), value=0), F.pad(targets, (0, missing), value=UNSCORED)


class AWDLMDataModule(WordCorpusDataModule):
    """PTB or WikiText-2 (or any corpus in their layout) for AWD-LSTM-style language modelling.

    Args:
        root: the folder holding ``train.txt``, ``valid.txt``, ``test.txt``.
        vocab_size: the vocabulary size the model is built for (PTB 10,000, WikiText-2 33,278); a
            corpus with another count is refused at ``prepare_data``/``setup``. None: counted from
            the training split when the module is made.
        batch_size: training columns per process.
        eval_batch_size: validation columns (official 10).
        test_batch_size: test columns (official ``test.py``: 1).
        bptt: base training window and the evaluation window (official 70).
        bptt_short_prob: probability of a base of ``bptt / 2`` (official 0.05).
        bptt_std: standard deviation of the training window length (official 5).
        bptt_min: shortest training window (official 5).
        bptt_step: round every training window to the nearest multiple of ``bptt_step`` in
            :func:`bptt_choices` (a few batch shapes), drop the window the stream's end would
            cut, and pad the last evaluation window (module docstring); None: the official
            continuous lengths, the last windows as long as the stream leaves them.
        seed: seeds the window lengths, with the epoch.
        num_workers: DataLoader workers (persistent for training, see
            :class:`VariableBPTTWindows`).
        encoding: the split files' encoding, a Python codec name.

    Shape:
        batches are ((B, T) int64 inputs, (B, T) int64 targets); ``targets[:, t]`` follows
        ``inputs[:, t]``
    """

    split_files: ClassVar[Mapping[str, str]] = {
        "train": "train.txt", "val": "valid.txt", "test": "test.txt"
    }  # fmt: skip
    cache_dir = (
        "word_stream_cache"  # the name caches were written under before the module was awd_lm
    )
    vocabulary_file = "vocab.txt"

    def __init__(
        self,
        root: str,
        vocab_size: int | None = None,
        batch_size: int = 20,
        *,
        eval_batch_size: int = 10,
        test_batch_size: int = 1,
        bptt: int = 70,
        bptt_short_prob: float = 0.05,
        bptt_std: float = 5.0,
        bptt_min: int = 5,
        bptt_step: int | None = None,
        seed: int = 1111,
        num_workers: int = 0,
        encoding: str = DEFAULT_ENCODING,
    ) -> None:
        if bptt_step is not None and bptt_step < 1:
            raise ValueError(
                f"bptt_step must be >= 1 or None (the official lengths), got {bptt_step}"
            )
        if min(batch_size, eval_batch_size, test_batch_size, bptt, bptt_min) < 1:
            raise ValueError(
                f"batch sizes, bptt and bptt_min must be >= 1, got batch_size={batch_size}, "
                f"eval_batch_size={eval_batch_size}, test_batch_size={test_batch_size}, "
                f"bptt={bptt}, bptt_min={bptt_min}"
            )
        if not 0 <= bptt_short_prob <= 1 or bptt_std < 0 or num_workers < 0:
            raise ValueError(
                f"need 0 <= bptt_short_prob <= 1, bptt_std >= 0 and num_workers >= 0, got "
                f"{bptt_short_prob}, {bptt_std}, {num_workers}"
            )
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.test_batch_size = test_batch_size
        self.bptt = bptt
        self.bptt_short_prob = bptt_short_prob
        self.bptt_std = bptt_std
        self.bptt_min = bptt_min
        self.bptt_step = bptt_step
        self.seed = seed
        super().__init__(root, vocab_size, num_workers=num_workers, encoding=encoding)

    # -- the vocabulary and the checks ----------------------------------------------------------
    def _read(self, path: Path) -> list[list[str]]:
        lines = super()._read(path)
        if not any(lines):
            raise ValueError(
                f"{path} holds no words (an empty split file: a download or an unpacking cut "
                "short?); put the corpus's text there again"
            )
        return lines

    def _vocabulary_of(self, train: list[list[str]]) -> tuple[Vocabulary, Mapping[str, int]]:
        return Vocabulary.from_lines(train), {}

    def _load_vocabulary(self, path: Path) -> Vocabulary:
        return Vocabulary.load_words(path)

    def _save_vocabulary(
        self, vocabulary: Vocabulary, path: Path, counts: Mapping[str, int]
    ) -> None:
        vocabulary.save_words(path)

    def _missing_files_message(self, root: Path, missing: list[Path]) -> str:
        return (
            f"word corpus files not found under {root}: missing "
            f"{', '.join(path.name for path in missing)}. "
            f"Expected {root}/train.txt, valid.txt and test.txt, one sentence per line (the "
            f"layout of the official getdata.sh). Penn Treebank: data/ptb.train.txt, "
            f"ptb.valid.txt, ptb.test.txt of {PTB_URL}; WikiText-2: wiki.train.tokens, "
            f"wiki.valid.tokens, wiki.test.tokens of {WIKITEXT2_URL}; renamed to train.txt, "
            "valid.txt, test.txt. Set data.root to their folder"
        )

    def _vocab_size_message(self, size: int) -> str:
        return (
            f"the training split of {self.root} has {size} distinct words (with {EOS}) but "
            f"data.vocab_size is {self.vocab_size}; set data.vocab_size={size}, or null to "
            "count it"
        )

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        self._train_rows()  # fail here, not at the first epoch, when the stream is too short
        self._eval_rows("val", self.eval_batch_size)
        self._eval_rows("test", self.test_batch_size)

    # -- batches --------------------------------------------------------------------------------
    def example_input(self, batch_size: int = 1) -> Tensor:
        """Token ids with the base training shape, (batch_size, bptt); reads no data."""
        return torch.zeros(batch_size, self.bptt, dtype=torch.long)

    def _process(self) -> tuple[int, int, int]:
        """(rank, world size, epoch) from the attached trainer; (0, 1, 0) without one."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1, 0
        return trainer.global_rank, trainer.world_size, trainer.current_epoch

    def _train_rows(self) -> np.ndarray:
        """This process's training columns: rows r*B .. (r+1)*B - 1 of W*B.

        Shape:
            (batch_size, N // (W * batch_size))
        """
        rank, world, _ = self._process()
        stream, columns = self.splits["train"], world * self.batch_size
        steps = len(stream) // columns
        if self.bptt_step is None:
            longest, name, lower = self.bptt, "bptt", "data.bptt"
        else:
            longest = max(bptt_choices(self.bptt, self.bptt_step, self.bptt_min))
            name, lower = "the longest window", "data.bptt or data.bptt_step"
        if steps < longest + 1:
            raise ValueError(
                f"the training split has {len(stream):,} tokens: {world} process(es) x "
                f"batch_size {self.batch_size} = {columns} columns of {steps} tokens, fewer than "
                f"{name} + 1 = {longest + 1}; lower data.batch_size or {lower}"
            )
        return batchify(stream, columns)[rank * self.batch_size : (rank + 1) * self.batch_size]

    def _eval_rows(self, split: str, batch_size: int) -> np.ndarray:
        """The columns every process evaluates.

        Shape:
            (batch_size, N // batch_size)
        """
        stream = self.splits[split]
        if len(stream) // batch_size < 2:
            name = "eval_batch_size" if split == "val" else "test_batch_size"
            raise ValueError(
                f"the {split} split has {len(stream):,} tokens: {name} {batch_size} columns of "
                f"{len(stream) // batch_size} tokens, fewer than the 2 (an input and its target) "
                f"each needs; lower data.{name}"
            )
        return batchify(stream, batch_size)

    def _loader(self, windows: _ColumnWindows, *, persistent: bool) -> DataLoader:
        # whole batches, in order: no batching, sampler or shuffling by the loader
        return DataLoader(
            windows,
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=persistent and self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        windows = VariableBPTTWindows(
            self._train_rows(),
            bptt=self.bptt,
            short_prob=self.bptt_short_prob,
            std=self.bptt_std,
            min_len=self.bptt_min,
            seed=self.seed,
            epoch=self._process()[2],
            step=self.bptt_step,
        )
        return self._loader(windows, persistent=True)

    def _eval_windows(self, split: str, batch_size: int) -> FixedWindows:
        rows = self._eval_rows(split, batch_size)
        return FixedWindows(rows, self.bptt, pad_last=self.bptt_step is not None)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self._eval_windows("val", self.eval_batch_size), persistent=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._eval_windows("test", self.test_batch_size), persistent=False)


# letter runs (inner apostrophes kept: "it's") and numbers ("3.14", "1,000")
PTB_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*|\d+(?:[.,]\d+)*")


def ptb_style(line: str) -> list[str]:
    """Mikolov's PTB style: lower case, every number ``N``, punctuation and symbols dropped."""
    return ["N" if word[0].isdigit() else word for word in PTB_WORD.findall(line.lower())]


class PydocPTBDataModule(PydocCorpus, AWDLMDataModule):
    """CPython's documentation topics as a PTB-style word corpus (always offline).

    Lower-cased words, every number ``N``, punctuation dropped (apostrophes inside words kept),
    one line per source line. On Python 3.11 with the defaults: 6,647 / 831 / 831 lines and
    59,215 / 7,755 / 7,011 tokens (with ``<eos>``) in train / valid / test (3% of the training
    tokens ``<unk>``), a vocabulary of 1,608 words.
    The text, and so the vocabulary, depends on the Python version, so by default
    ``vocab_size`` is counted. The split files are (re)written under ``root`` when missing or
    different, then read as PTB.

    Args (besides :class:`AWDLMDataModule`'s):
        vocab_size: None (the default) for the training split's count.
        val_fraction, test_fraction: shares of the lines for validation and test (from the end).
        min_count: training count below which a word becomes ``<unk>``.

    Shape:
        batches are ((B, T) int64 inputs, (B, T) int64 targets)
    """

    def __init__(
        self,
        root: str,
        vocab_size: int | None = None,
        batch_size: int = 20,
        *,
        eval_batch_size: int = 10,
        test_batch_size: int = 1,
        bptt: int = 35,
        bptt_short_prob: float = 0.05,
        bptt_std: float = 5.0,
        bptt_min: int = 5,
        bptt_step: int | None = None,
        seed: int = 1111,
        num_workers: int = 0,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        min_count: int = 3,
    ) -> None:
        vocab_size = self._use_pydoc(ptb_style, vocab_size, val_fraction, test_fraction, min_count)
        super().__init__(
            root,
            vocab_size,
            batch_size,
            eval_batch_size=eval_batch_size,
            test_batch_size=test_batch_size,
            bptt=bptt,
            bptt_short_prob=bptt_short_prob,
            bptt_std=bptt_std,
            bptt_min=bptt_min,
            bptt_step=bptt_step,
            seed=seed,
            num_workers=num_workers,
        )
