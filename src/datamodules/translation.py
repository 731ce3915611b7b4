"""Parallel corpora for translation, batched by token count (fairseq's ``--max-tokens``).

Layout under ``root`` (what the official preparation scripts, ``prepare-iwslt14.sh`` and
``prepare-wmt14en2de.sh``, write)::

    root/train.<src>  root/train.<tgt>     one sentence per line, line i of one file translates
    root/valid.<src>  root/valid.<tgt>     line i of the other
    root/test.<src>   root/test.<tgt>
    root/dict.<lang>.txt                   optional: fairseq-preprocess's dictionaries

``tokenizer: bpe`` reads text already Moses-tokenised and split by subword-nmt (``@@`` markers)
and looks tokens up in fairseq dictionaries (read from ``dict.<lang>.txt`` or built from the
training files as ``fairseq-preprocess`` does: counts, then padding to a multiple of 8; with
``joined_dictionary`` one table from both sides). References are then tokenised text with the BPE
removed, which is what the papers' *tokenised* BLEU scores. ``tokenizer: sentencepiece`` reads raw
text and trains a joint SentencePiece model on the training split (cached in ``root``); references
are the raw target lines, which sacreBLEU scores.

Input checks (all before training starts): a missing file names its path and this layout; a
language pair without files names the languages ``root`` has; files of one split with different
line counts are refused (misaligned corpora translate garbage); pairs with an empty side are
dropped with a logged count; a training pair longer than ``max_source_positions`` /
``max_target_positions`` tokens (eos included) is dropped with a logged count, and in valid/test is
an error (a test sentence is never dropped silently).

Batches (:class:`TokenBatches`), with ``shape_buckets`` K > 0 (the default, 8): every batch is
padded to one of at most K shapes (:mod:`src.datamodules.length_buckets`), so that a training step
traced with static shapes or replayed as a CUDA graph is recorded K times, not once per batch. The
K cells (S, T) of source and target lengths are fitted to the training pairs at ``setup`` and
serve validation and test too (their batch sizes follow ``eval_max_tokens``); each split's table of
shapes, batches and padding is logged. A batch of a cell holds at most ``max_tokens // max(S, T)``
pairs, the cell's pairs split evenly, and the rows of a last batch that hold no pair are scored by
no loss (their target is all pad). The price is padding: on the gettext demo corpus and on an
IWSLT'14-like length distribution, 8 shapes of a pair a row pad about 21% of the tokens, 16 shapes
11-13%, where exact batching pads 16% and 3% (``python benchmarks/buckets.py`` prints the tables).

With ``pack_pairs`` (the default with buckets), the training batches are packed: a row holds as
many pairs as fit, each kept apart by the model (:mod:`src.models.packing`, the batch's
``src_segments``, ``tgt_segments``, ``src_positions`` and ``tgt_positions``), in at most K square
cells doubling in length (:func:`~src.datamodules.length_buckets.packing_cells`). That pads 6% on
the demo corpus (5 shapes) and 2% on the IWSLT-like one (3 shapes), for 1.5x and 2.0x the
attention scores of exact batching (a pair's masked scores against its row's other pairs). A
pair's loss and gradients are the ones it has alone in a row; what changes is the batches'
make-up, which holds about as many real tokens as fairseq's exact batching at the same
``max_tokens``. Validation and test batches are not packed (a pair a row, in the same cells).

With ``shape_buckets: 0``, fairseq's exact batching: sentences sorted by target then source length
(shuffled first for training) are grouped greedily so that ``sentences * longest <= max_tokens``,
each batch padded to its own longest pair (a new shape for most batches).

Either way the training batches are shuffled every epoch and, under DDP, dealt to the processes in
turn (each process gets the same number).
"""

from __future__ import annotations

import json
import logging
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from src.datamodules.dictionary import EOS_ID, PAD_ID, UNK_ID, Dictionary
from src.datamodules.gettext_catalogs import parallel_messages
from src.datamodules.length_buckets import (
    Cell,
    bucket_batches,
    choose_cells,
    format_table,
    packed_batches,
    packing_cells,
    padding_table,
)
from src.datamodules.subword import (
    DictionaryCodec,
    SentencePieceCodec,
    TextCodec,
    remove_bpe,
    train_sentencepiece,
)
from src.datamodules.text_files import DEFAULT_ENCODING, check_encoding, read_text
from src.utils.errors import UserError
from src.utils.files import atomic_write_text

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
TOKENIZERS = ("bpe", "sentencepiece")
MAX_LISTED = 5  # line numbers quoted in a message


class CorpusError(UserError, ValueError):
    """A parallel corpus that cannot be read as asked; the message names the fix."""


def layout(root: Path, source_lang: str, target_lang: str) -> str:
    """The expected files, for error messages."""
    files = ", ".join(f"{split}.{lang}" for split in SPLITS for lang in (source_lang, target_lang))
    return (
        f"{root}/ with {files} (one sentence per line, aligned by line number; fairseq's "
        "examples/translation/prepare-*.sh scripts write it, docs/delight_mt.md)"
    )


def check_aligned(source: Path, source_lines: int, target: Path, target_lines: int) -> None:
    """:class:`CorpusError` unless the two files have as many lines."""
    if source_lines != target_lines:
        raise CorpusError(
            f"{source} has {source_lines} lines but {target} has {target_lines}: parallel files "
            "must be aligned line by line (line i of one translates line i of the other). Re-run "
            "the preparation script or remove the unmatched lines from both files."
        )


def count_lines(path: Path) -> int:
    """The lines of ``path`` by its line feeds (a last line without one counts), read in 16 MiB
    chunks: the alignment check before anything is decoded or counted."""
    lines, last = 0, b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def read_parallel(
    source: Path, target: Path, encoding: str = DEFAULT_ENCODING
) -> tuple[list[str], list[str], list[int]]:
    """The aligned non-empty lines of two files in ``encoding`` and their 1-based line numbers.

    Raises :class:`CorpusError` when the files have different line counts, and
    :class:`~src.datamodules.text_files.TextEncodingError` for a byte that does not decode; pairs
    with an empty side are dropped and counted in the log.
    """
    src_lines = read_text(source, encoding).splitlines()
    tgt_lines = read_text(target, encoding).splitlines()
    check_aligned(source, len(src_lines), target, len(tgt_lines))
    kept_src, kept_tgt, numbers, empty = [], [], [], []
    for number, (src, tgt) in enumerate(zip(src_lines, tgt_lines), start=1):
        if src.strip() and tgt.strip():
            kept_src.append(src.strip())
            kept_tgt.append(tgt.strip())
            numbers.append(number)
        else:
            empty.append(number)
    if empty:
        log.warning(
            "%s / %s: dropped %d of %d pairs with an empty side (lines %s%s)",
            source,
            target,
            len(empty),
            len(src_lines),
            ", ".join(map(str, empty[:MAX_LISTED])),
            ", ..." if len(empty) > MAX_LISTED else "",
        )
    if not kept_src:
        raise CorpusError(f"{source} and {target} have no pair with both sides non-empty")
    return kept_src, kept_tgt, numbers


@dataclass
class ParallelSplit:
    """One split, encoded: token ids end with eos; ``references`` is the target text BLEU
    compares with; ``line_numbers`` point into the files."""

    source: list[Tensor]
    target: list[Tensor]
    references: list[str]
    line_numbers: list[int]

    def __len__(self) -> int:
        return len(self.source)


def _pad_rows(rows: Sequence[Tensor], count: int, length: int) -> Tensor:
    """``rows`` right-padded with pad into a (count, length) batch; rows past them all pad."""
    batch = torch.full((count, length), PAD_ID, dtype=torch.long)
    for b, row in enumerate(rows):
        batch[b, : len(row)] = row
    return batch


def collate(
    split: ParallelSplit, indices: Sequence[int], shape: tuple[int, int, int] | None = None
) -> dict:
    """A padded batch of the pairs ``indices``, to their count and longest pair or to ``shape``.

    With ``shape`` (B, S, T), rows beyond the pairs are scored by no loss: their target is all pad,
    their source and decoder input ``eos`` then pad (one key to attend to keeps their attention
    finite), their id -1; ``references`` lists the pairs only.

    Shape:
        src_tokens (B, S) and target (B, T) right-padded with pad; prev_output_tokens (B, T) is
        the target shifted right behind eos (teacher forcing); id (B,) the pairs' indices;
        references: one string per pair
    """
    sources = [split.source[i] for i in indices]
    targets = [split.target[i] for i in indices]
    previous = [torch.cat((t.new_tensor([EOS_ID]), t[:-1])) for t in targets]
    longest = (len(indices), max(map(len, sources)), max(map(len, targets)))
    rows, source_len, target_len = longest if shape is None else shape
    if min(rows - longest[0], source_len - longest[1], target_len - longest[2]) < 0:
        raise ValueError(
            f"the pairs {list(indices)} ({longest}) do not fit the batch shape {shape}"
        )
    src_tokens = _pad_rows(sources, rows, source_len)
    prev_output_tokens = _pad_rows(previous, rows, target_len)
    src_tokens[len(indices) :, 0] = EOS_ID
    prev_output_tokens[len(indices) :, 0] = EOS_ID
    return {
        "src_tokens": src_tokens,
        "prev_output_tokens": prev_output_tokens,
        "target": _pad_rows(targets, rows, target_len),
        "id": torch.tensor([*indices, *[-1] * (rows - len(indices))], dtype=torch.long),
        "references": [split.references[i] for i in indices],
    }


def collate_packed(
    split: ParallelSplit, rows: Sequence[Sequence[int]], shape: tuple[int, int, int]
) -> dict:
    """A batch of packed rows: row b holds the pairs ``rows[b]`` side by side (module docstring).

    Rows beyond ``rows`` are all pad (segment 0, which attends everywhere and is never scored).

    Shape:
        src_tokens, src_segments, src_positions (B, S); prev_output_tokens, target, tgt_segments,
        tgt_positions (B, T) int64 (segments count a row's pairs from 1, 0 on pads; positions are
        fairseq's, from ``PAD_ID + 1`` at each pair's start, ``PAD_ID`` on pads); id (B, P) the
        pairs of each row, -1 past them, P the most pairs of a row; references one string per pair
    """
    count, source_len, target_len = shape
    if len(rows) > count:
        raise ValueError(f"{len(rows)} rows do not fit the batch shape {shape}")
    sides = {
        name: torch.full((count, length), PAD_ID, dtype=torch.long)
        for name, length in (("src_tokens", source_len), ("prev_output_tokens", target_len),
                             ("target", target_len), ("src_positions", source_len),
                             ("tgt_positions", target_len))
    }  # fmt: skip
    sides["src_segments"] = torch.zeros((count, source_len), dtype=torch.long)
    sides["tgt_segments"] = torch.zeros((count, target_len), dtype=torch.long)
    width = max(map(len, rows), default=1)
    ids = torch.full((count, width), -1, dtype=torch.long)
    for b, pairs in enumerate(rows):
        s = t = 0
        for k, i in enumerate(pairs):
            source, target = split.source[i], split.target[i]
            n, m = len(source), len(target)
            if s + n > source_len or t + m > target_len:
                raise ValueError(
                    f"the pairs {list(pairs)} do not fit a row of the batch shape {shape}"
                )
            sides["src_tokens"][b, s : s + n] = source
            sides["target"][b, t : t + m] = target
            sides["prev_output_tokens"][b, t] = EOS_ID
            sides["prev_output_tokens"][b, t + 1 : t + m] = target[:-1]
            sides["src_segments"][b, s : s + n] = k + 1
            sides["tgt_segments"][b, t : t + m] = k + 1
            sides["src_positions"][b, s : s + n] = torch.arange(PAD_ID + 1, PAD_ID + 1 + n)
            sides["tgt_positions"][b, t : t + m] = torch.arange(PAD_ID + 1, PAD_ID + 1 + m)
            ids[b, k] = i
            s, t = s + n, t + m
    return {**sides, "id": ids, "references": [split.references[i] for r in rows for i in r]}


def batch_by_tokens(
    lengths: Sequence[int], order: Sequence[int], max_tokens: int
) -> list[list[int]]:
    """Consecutive runs of ``order`` with ``len(run) * max(lengths[run]) <= max_tokens``
    (fairseq's ``batch_by_size``); a pair longer than ``max_tokens`` gets a batch of its own."""
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for index in order:
        longest_with = max(longest, lengths[index])
        if batch and (len(batch) + 1) * longest_with > max_tokens:
            batches.append(batch)
            batch, longest_with = [], lengths[index]
        batch.append(index)
        longest = longest_with
    if batch:
        batches.append(batch)
    return batches


class TokenBatches(IterableDataset):
    """Token-count batches of one split, collated; see the module docstring for the order.

    Args:
        split: the encoded pairs.
        max_tokens: the largest ``sentences * longest side`` of a batch.
        shuffle: shuffle before batching and shuffle the batches every epoch (training).
        seed: base of the shuffles' seeds.
        epoch: called at each pass, the shuffle's epoch (the trainer's current epoch).
        rank: this process.
        world_size: the number of processes; training batches are dealt round-robin and cut to
            a common count, evaluation batches are dealt without cutting.
        cells: the length buckets every batch is padded to
            (:mod:`src.datamodules.length_buckets`); None: fairseq's exact batching.
        pack: pack the pairs into rows of the cells (:func:`collate_packed`).
    """

    def __init__(
        self,
        split: ParallelSplit,
        max_tokens: int,
        *,
        shuffle: bool,
        seed: int = 0,
        epoch: Callable[[], int] = lambda: 0,
        rank: int = 0,
        world_size: int = 1,
        cells: Sequence[Cell] | None = None,
        pack: bool = False,
    ) -> None:
        super().__init__()
        if pack and cells is None:
            raise ValueError("packed rows need length buckets (cells)")
        self.pack = pack
        self.split = split
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = epoch
        self.rank = rank
        self.world_size = world_size
        self.cells = cells
        self.source_lengths = [len(s) for s in split.source]
        self.target_lengths = [len(t) for t in split.target]
        self.lengths = [max(s, t) for s, t in zip(self.source_lengths, self.target_lengths)]
        self._last: tuple[int, list] | None = None

    def shaped_batches(self, epoch: int) -> list[tuple[tuple[int, int, int] | None, list]]:
        """This process's batches for ``epoch``: (B, S, T) to pad to, None with exact batching,
        and the pair indices (packed: the pairs of each row). The last epoch's are kept: the
        loader's length is asked for several times a pass, and packing a large corpus takes
        seconds."""
        if self._last is not None and self._last[0] == epoch:
            return self._last[1]
        batches = self._batches(epoch)
        self._last = (epoch, batches)
        return batches

    def _batches(self, epoch: int) -> list[tuple[tuple[int, int, int] | None, list]]:
        generator = random.Random(self.seed + epoch)
        if self.pack:
            batches = packed_batches(
                self.cells, self.source_lengths, self.target_lengths, self.max_tokens,
                generator if self.shuffle else None,
            )  # fmt: skip
        elif self.cells is not None:
            shuffle = generator if self.shuffle else None
            batches = bucket_batches(
                self.cells, self.source_lengths, self.target_lengths, self.max_tokens, shuffle
            )
        else:
            batches = [(None, indices) for indices in self._exact_batches(generator)]
        if self.shuffle:
            generator.shuffle(batches)
            per_rank = len(batches) // self.world_size
            if per_rank == 0:
                raise CorpusError(
                    f"{len(batches)} batches cannot feed {self.world_size} processes; lower "
                    "max_tokens"
                )
            batches = batches[: per_rank * self.world_size]
        return batches[self.rank :: self.world_size]

    def _exact_batches(self, generator: random.Random) -> list[list[int]]:
        order = list(range(len(self.split)))
        if self.shuffle:
            generator.shuffle(order)
        # stable sorts: by source length, then target length (fairseq's ordered_indices)
        order.sort(key=lambda i: self.source_lengths[i])
        order.sort(key=lambda i: self.target_lengths[i])
        return batch_by_tokens(self.lengths, order, self.max_tokens)

    def batches(self, epoch: int) -> list[list[int]]:
        """This process's batches (lists of pair indices) for ``epoch``."""
        if self.pack:
            return [[i for row in rows for i in row] for _, rows in self.shaped_batches(epoch)]
        return [indices for _, indices in self.shaped_batches(epoch)]

    def __len__(self) -> int:
        # this epoch's count: packed rows, shuffled anew each epoch, may number a few more or less
        return len(self.shaped_batches(self.epoch()))

    def __iter__(self):
        for shape, indices in self.shaped_batches(self.epoch()):
            yield (
                collate_packed(self.split, indices, shape)
                if self.pack
                else collate(self.split, indices, shape)
            )


class TranslationDataModule(L.LightningDataModule):
    """A parallel corpus under ``root`` in the layout of the module docstring.

    Args:
        root: the corpus folder.
        source_lang: the source files' suffix (``de`` for IWSLT'14 De-En).
        target_lang: the target files' suffix.
        tokenizer: ``"bpe"`` (pre-tokenised, BPE-split text and fairseq dictionaries) or
            ``"sentencepiece"`` (raw text; a joint model trained on the training split).
        src_vocab_size: the source dictionary's size (the model is built with it before any data
            is read); a dictionary of another size is an error that names the size to set. None
            takes the data's count.
        tgt_vocab_size: the same for the target.
        joined_dictionary: one dictionary for both sides (WMT; ``share_all_embeddings``).
        sentencepiece_vocab_size: pieces of the SentencePiece model (``tokenizer: sentencepiece``).
        max_tokens: training batch size in tokens.
        eval_max_tokens: validation/test batch size in tokens; ``max_tokens`` when None.
        shape_buckets: the most batch shapes (length buckets, fitted to the training pairs and
            shared by every split); 0: fairseq's exact batching, a shape per batch.
        pack_pairs: with buckets, pack the training pairs several to a row (module docstring);
            the buckets are then :func:`~src.datamodules.length_buckets.packing_cells`.
        max_source_positions: the longest source in tokens, eos included.
        max_target_positions: the longest target in tokens, eos included.
        padding_idx: the pad id (fairseq's 1); the models are built with it.
        compound_split: this corpus's BLEU splits hyphenated compounds (WMT'14 En-De); the task
            reads it.
        seed: base seed of the batch shuffles.
        encoding: the text files' encoding (``dict.<lang>.txt`` included), a Python codec name.
    """

    has_test = True

    def __init__(
        self,
        root: str,
        source_lang: str,
        target_lang: str,
        *,
        tokenizer: str = "bpe",
        src_vocab_size: int | None = None,
        tgt_vocab_size: int | None = None,
        joined_dictionary: bool = False,
        sentencepiece_vocab_size: int = 8000,
        max_tokens: int = 4096,
        eval_max_tokens: int | None = None,
        shape_buckets: int = 8,
        pack_pairs: bool = True,
        max_source_positions: int = 1024,
        max_target_positions: int = 1024,
        padding_idx: int = PAD_ID,
        compound_split: bool = False,
        seed: int = 0,
        encoding: str = DEFAULT_ENCODING,
    ) -> None:
        super().__init__()
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
        if padding_idx != PAD_ID:
            raise ValueError(
                f"the dictionaries pad with id {PAD_ID} (fairseq's), got padding_idx={padding_idx}"
            )
        if source_lang == target_lang:
            raise ValueError(f"source_lang and target_lang must differ, got {source_lang!r} twice")
        if (
            min(
                max_tokens,
                eval_max_tokens or max_tokens,
                max_source_positions,
                max_target_positions,
            )
            < 2
        ):
            raise ValueError("max_tokens, eval_max_tokens and the max positions must be >= 2")
        if shape_buckets < 0:
            raise ValueError(f"shape_buckets must be >= 0 (0: exact batching), got {shape_buckets}")
        self.root = Path(root)
        self.source_lang = source_lang
        self.target_lang = target_lang
        self.tokenizer = tokenizer
        self.joined_dictionary = joined_dictionary or tokenizer == "sentencepiece"
        self.sentencepiece_vocab_size = sentencepiece_vocab_size
        self.max_tokens = max_tokens
        self.eval_max_tokens = eval_max_tokens or max_tokens
        self.shape_buckets = shape_buckets
        self.pack_pairs = pack_pairs and shape_buckets > 0
        self.cells: tuple[Cell, ...] | None = None
        self.max_positions = {"source": max_source_positions, "target": max_target_positions}
        self.padding_idx = padding_idx
        self.compound_split = compound_split
        self.seed = seed
        self.encoding = check_encoding(encoding)
        self.configured_sizes = {"source": src_vocab_size, "target": tgt_vocab_size}
        self.codecs: dict[str, TextCodec] | None = None
        self.splits: dict[str, ParallelSplit] = {}

    # -- vocabulary ---------------------------------------------------------------------------
    @property
    def tokenized(self) -> bool:
        """Whether the text (and so the references) is tokenised: BLEU then counts its tokens."""
        return self.tokenizer == "bpe"

    @property
    def src_vocab_size(self) -> int:
        return self.configured_sizes["source"] or self.load_codecs()["source"].vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.configured_sizes["target"] or self.load_codecs()["target"].vocab_size

    def example_input(
        self, batch_size: int = 1, source_len: int = 20, target_len: int = 20
    ) -> tuple:
        """A batch of ``source_len`` source and ``target_len`` target tokens (the thesis counts
        MACs for 20 + 20, Table 5.2), no padding: ``(src_tokens, None, prev_output_tokens)``."""
        src = torch.full((batch_size, source_len), UNK_ID, dtype=torch.long)
        prev = torch.full((batch_size, target_len), UNK_ID, dtype=torch.long)
        return src, None, prev

    def path(self, split: str, lang: str) -> Path:
        return self.root / f"{split}.{lang}"

    def check_files(self) -> None:
        """Every file of the layout is there, or an error that says what is."""
        if not self.root.is_dir():
            raise CorpusError(
                f"translation data not found: {self.root} does not exist. Expected "
                f"{layout(self.root, self.source_lang, self.target_lang)}; set data.root to that "
                "folder."
            )
        missing = [
            self.path(s, lang) for s in SPLITS for lang in (self.source_lang, self.target_lang)
        ]
        missing = [p for p in missing if not p.is_file()]
        if not missing:
            return
        found = sorted({p.suffix[1:] for p in self.root.glob("train.*")})
        pair = f"{self.source_lang}-{self.target_lang}"
        if found and not {self.source_lang, self.target_lang} <= set(found):
            raise CorpusError(
                f"{self.root} has no {pair} corpus: its training files are for the languages "
                f"{', '.join(found)}. Set data.source_lang/data.target_lang to two of them, or "
                f"data.root to a {pair} corpus."
            )
        raise CorpusError(
            f"missing {', '.join(str(p) for p in missing)}. Expected "
            f"{layout(self.root, self.source_lang, self.target_lang)}."
        )

    def load_codecs(self) -> dict[str, TextCodec]:
        """The source and target codecs: read (``dict.<lang>.txt``, a cached SentencePiece model)
        or built from the training files, then checked against the configured sizes."""
        if self.codecs is not None:
            return self.codecs
        self.check_files()
        # misaligned files first: a vocabulary counted from them would be the wrong complaint
        for split in SPLITS:
            source, target = self.path(split, self.source_lang), self.path(split, self.target_lang)
            check_aligned(source, count_lines(source), target, count_lines(target))
        if self.tokenizer == "sentencepiece":
            codec = self._sentencepiece()
            codecs: dict[str, TextCodec] = {"source": codec, "target": codec}
        else:
            codecs = {side: DictionaryCodec(d) for side, d in self._dictionaries().items()}
        for side, codec in codecs.items():
            configured = self.configured_sizes[side]
            if configured is not None and configured != codec.vocab_size:
                key = "src_vocab_size" if side == "source" else "tgt_vocab_size"
                raise CorpusError(
                    f"data.{key} is {configured} but the {side} vocabulary of {self.root} has "
                    f"{codec.vocab_size} entries; set data.{key}={codec.vocab_size} (or null to "
                    "take the data's count). A checkpoint only fits data with its vocabulary."
                )
        self.codecs = codecs
        return codecs

    def _dictionaries(self) -> dict[str, Dictionary]:
        langs = {"source": self.source_lang, "target": self.target_lang}
        files = {side: self.root / f"dict.{lang}.txt" for side, lang in langs.items()}
        if all(f.is_file() for f in files.values()):
            log.info("dictionaries: %s", ", ".join(str(f) for f in files.values()))
            return {side: Dictionary.load(f, self.encoding) for side, f in files.items()}
        train = {
            side: read_text(self.path("train", lang), self.encoding).splitlines()
            for side, lang in langs.items()
        }
        if self.joined_dictionary:
            joined = Dictionary.build([*train["source"], *train["target"]])
            return {"source": joined, "target": joined}
        return {side: Dictionary.build(lines) for side, lines in train.items()}

    def _sentencepiece(self) -> SentencePieceCodec:
        src, tgt, _ = read_parallel(
            self.path("train", self.source_lang),
            self.path("train", self.target_lang),
            self.encoding,
        )
        texts = [*src, *tgt]
        # the model is cached under a name that changes with the training text and the size
        digest = zlib.crc32("\n".join(texts).encode("utf-8"))
        prefix = self.root / f"spm{self.sentencepiece_vocab_size}.{digest:08x}"
        if Path(f"{prefix}.model").is_file():
            return SentencePieceCodec(f"{prefix}.model")
        return train_sentencepiece(texts, prefix, self.sentencepiece_vocab_size)

    # -- splits -------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        self.check_files()

    def setup(self, stage: str | None = None) -> None:
        codecs = self.load_codecs()
        for split in SPLITS:
            if split not in self.splits:
                self.splits[split] = self._encode(split, codecs)
        if self.shape_buckets and self.cells is None:
            self.cells = self._fit_buckets()

    def _fit_buckets(self) -> tuple[Cell, ...]:
        """The length buckets of the training pairs, the largest holding every split's longest;
        each split's shapes and padding logged."""
        lengths = {
            split: ([len(s) for s in data.source], [len(t) for t in data.target])
            for split, data in self.splits.items()
        }
        cover = (max(max(s) for s, _ in lengths.values()), max(max(t) for _, t in lengths.values()))
        fit = packing_cells if self.pack_pairs else choose_cells
        cells = fit(*lengths["train"], self.shape_buckets, cover=cover)
        for split, (source, target) in lengths.items():
            max_tokens = self.max_tokens if split == "train" else self.eval_max_tokens
            generator = random.Random(self.seed) if split == "train" else None
            packed = split == "train" and self.pack_pairs
            if packed:
                rows = packed_batches(cells, source, target, max_tokens, generator)
                batches = [(shape, [i for row in pairs for i in row]) for shape, pairs in rows]
            else:
                batches = bucket_batches(cells, source, target, max_tokens, generator)
            table = padding_table(batches, source, target)
            log.info(
                "%s: %d batch shapes (B, S, T)%s, %.1f%% padding\n%s",
                split,
                len(table) - 1,
                " of packed rows" if packed else "",
                100 * table[-1]["padding"],
                format_table(table),
            )
        return cells

    def _encode(self, split: str, codecs: dict[str, TextCodec]) -> ParallelSplit:
        source_path, target_path = (
            self.path(split, self.source_lang),
            self.path(split, self.target_lang),
        )
        src_lines, tgt_lines, numbers = read_parallel(source_path, target_path, self.encoding)
        encoded = ParallelSplit([], [], [], [])
        too_long: list[int] = []
        for src, tgt, number in zip(src_lines, tgt_lines, numbers):
            source = codecs["source"].encode(src) + [EOS_ID]
            target = codecs["target"].encode(tgt) + [EOS_ID]
            if (
                len(source) > self.max_positions["source"]
                or len(target) > self.max_positions["target"]
            ):
                if split != "train":
                    raise CorpusError(
                        f"{source_path}:{number}: a pair of {len(source)} source / "
                        f"{len(target)} target tokens exceeds the model's maximum of "
                        f"{self.max_positions['source']} / {self.max_positions['target']}; "
                        f"{split} sentences are never dropped. Raise "
                        "data.max_source_positions / data.max_target_positions."
                    )
                too_long.append(number)
                continue
            encoded.source.append(torch.tensor(source, dtype=torch.long))
            encoded.target.append(torch.tensor(target, dtype=torch.long))
            # raw text for sacreBLEU, or the tokenised text without BPE markers (tokenised BLEU)
            encoded.references.append(tgt if self.tokenizer == "sentencepiece" else remove_bpe(tgt))
            encoded.line_numbers.append(number)
        if too_long:
            log.warning(
                "%s: dropped %d of %d training pairs longer than %d source / %d target tokens "
                "(lines %s%s)",
                source_path,
                len(too_long),
                len(src_lines),
                self.max_positions["source"],
                self.max_positions["target"],
                ", ".join(map(str, too_long[:MAX_LISTED])),
                ", ..." if len(too_long) > MAX_LISTED else "",
            )
        if not len(encoded):
            raise CorpusError(f"{source_path}: no pair is left after the length filter")
        log.info("%s: %d pairs", split, len(encoded))
        return encoded

    def decode(self, ids: Sequence[int]) -> str:
        """The target text of ``ids`` as BLEU compares it with the references."""
        return self.load_codecs()["target"].decode(ids)

    def encode_source(self, text: str) -> Tensor:
        """A source sentence's ids with eos, as the training pairs are encoded.

        Shape:
            -> (S,) int64
        """
        ids = self.load_codecs()["source"].encode(text) + [EOS_ID]
        return torch.tensor(ids, dtype=torch.long)

    def unknown_source(self, text: str) -> list[str]:
        """What of a source sentence the source vocabulary lacks, each encoded as ``<unk>``: the
        characters no SentencePiece piece covers, or the BPE tokens the dictionary lacks."""
        return self.load_codecs()["source"].unknown(text)

    # -- loaders ------------------------------------------------------------------------------
    def _loader(self, split: str, max_tokens: int, shuffle: bool) -> DataLoader:
        trainer = getattr(self, "trainer", None)
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        batches = TokenBatches(
            self.splits[split],
            max_tokens,
            shuffle=shuffle,
            seed=self.seed,
            epoch=lambda: trainer.current_epoch if trainer is not None else 0,
            rank=rank,
            world_size=world,
            cells=self.cells,
            pack=self.pack_pairs and split == "train",
        )
        # the dataset yields whole collated batches
        return DataLoader(batches, batch_size=None, num_workers=0)

    def train_dataloader(self) -> DataLoader:
        trainer = getattr(self, "trainer", None)
        # overfit_batches repeats the first batches: they must be the same every epoch
        overfit = trainer is not None and bool(trainer.overfit_batches)
        return self._loader("train", self.max_tokens, shuffle=not overfit)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", self.eval_max_tokens, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_max_tokens, shuffle=False)


class GettextTranslationDataModule(TranslationDataModule):
    """English-<language> messages of the installed packages' gettext catalogues
    (:mod:`src.datamodules.gettext_catalogs`), written to ``root`` in the corpus layout and read
    back as a raw-text (``sentencepiece``) corpus.

    Each message goes to train/valid/test by a hash of its English text (``valid_percent`` and
    ``test_percent`` of 100 buckets), so a split never shares a message with another and stays
    the same when packages add messages. Line breaks inside a message become spaces.

    The files are a cache keyed on the split: ``split.<language>.json`` beside them records the
    percentages they were written with, and a root written with other percentages (or before
    the record existed) is written again, so its SentencePiece model, named by the training
    text's hash, is another one too. Runs of different splits at the same time need different
    roots (``data.root``): each would rewrite the other's files.

    Args:
        root: where the corpus files and the SentencePiece model are written.
        language: the catalogues' language (``de``).
        direction: ``"to_english"`` (source = the translation, target = English, like IWSLT
            De-En) or ``"from_english"``.
        valid_percent: share of the messages for validation.
        test_percent: share for the test.
        **kwargs: :class:`TranslationDataModule`'s (``tokenizer`` is ``sentencepiece``).
    """

    def __init__(
        self,
        root: str,
        language: str = "de",
        *,
        direction: str = "to_english",
        valid_percent: int = 5,
        test_percent: int = 5,
        **kwargs,
    ) -> None:
        if direction not in ("to_english", "from_english"):
            raise ValueError(f"direction must be 'to_english' or 'from_english', got {direction!r}")
        if not (0 < valid_percent and 0 < test_percent and valid_percent + test_percent < 100):
            raise ValueError(
                "need 0 < valid_percent, test_percent and a sum < 100, got "
                f"{valid_percent}, {test_percent}"
            )
        source_lang, target_lang = (
            (language, "en") if direction == "to_english" else ("en", language)
        )
        kwargs.setdefault("tokenizer", "sentencepiece")
        super().__init__(root, source_lang, target_lang, **kwargs)
        self.language = language
        self.bounds = (valid_percent, valid_percent + test_percent)
        self.split_record = {"valid_percent": valid_percent, "test_percent": test_percent}

    def split_of(self, message: str) -> str:
        bucket = zlib.crc32(message.encode("utf-8")) % 100
        return (
            "valid" if bucket < self.bounds[0] else "test" if bucket < self.bounds[1] else "train"
        )

    @property
    def split_file(self) -> Path:
        """The record of the percentages the corpus files under ``root`` were written with."""
        return self.root / f"split.{self.language}.json"

    def written_split(self) -> dict | None:
        """The percentages of the files under ``root``; None when a file or the record is
        missing."""
        files = [
            self.path(s, lang) for s in SPLITS for lang in (self.source_lang, self.target_lang)
        ]
        if not self.split_file.is_file() or not all(f.is_file() for f in files):
            return None
        return json.loads(self.split_file.read_text())

    def check_files(self) -> None:
        written = self.written_split()
        if written != self.split_record:
            if written is not None:
                log.warning(
                    "%s holds the split %s; writing it again for %s",
                    self.root,
                    written,
                    self.split_record,
                )
            self.write_corpus()
        super().check_files()

    def write_corpus(self) -> None:
        """Collect the catalogues' messages and write the six corpus files under ``root``."""
        lines: dict[tuple[str, str], list[str]] = {
            (s, lang): [] for s in SPLITS for lang in ("en", self.language)
        }
        count = 0
        for entry in parallel_messages(self.language):
            split = self.split_of(entry.source)
            lines[split, "en"].append(" ".join(entry.source.split()))
            lines[split, self.language].append(" ".join(entry.translation.split()))
            count += 1
        if count == 0:
            raise CorpusError(
                f"no gettext catalogue for language {self.language!r} among the installed packages "
                f"(locale*/{self.language}/LC_MESSAGES/*.mo); install Django and pycountry "
                "(pip install django pycountry) or choose a language they ship."
            )
        self.root.mkdir(parents=True, exist_ok=True)
        for (split, lang), text in lines.items():
            # in the encoding the files are read back in (UTF-8 unless ``encoding`` says otherwise)
            atomic_write_text(
                self.path(split, lang), "".join(f"{line}\n" for line in text), self.encoding
            )
        # last: a record names files that are all written
        atomic_write_text(self.split_file, json.dumps(self.split_record, sort_keys=True))
        log.info(
            "wrote %d %s-en messages to %s: %s",
            count,
            self.language,
            self.root,
            ", ".join(f"{s} {len(lines[s, 'en'])}" for s in SPLITS),
        )
