"""Text <-> token ids for translation: pre-tokenised BPE text, or a SentencePiece model.

Two codecs with one interface (``encode(text) -> ids``, ``decode(ids) -> text``, ``vocab_size``,
``unknown(text)``: what of the text encodes as ``<unk>``):

- :class:`DictionaryCodec`: text already tokenised and split into subwords (Moses + subword-nmt,
  as the official IWSLT/WMT preparation scripts write it); tokens are looked up in a fairseq
  :class:`~src.datamodules.dictionary.Dictionary`. Decoding joins the tokens and removes the
  ``@@ `` continuation markers (fairseq's ``--remove-bpe``), giving tokenised text.
- :class:`SentencePieceCodec`: raw text and a SentencePiece model trained on the training split
  (:func:`train_sentencepiece`). Its special ids are fairseq's (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2,
  ``<unk>`` 3), so the models' ``padding_idx`` and eos are the same for both codecs. Decoding
  gives detokenised text, which sacreBLEU scores as it should.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import sentencepiece as spm

from src.datamodules.dictionary import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Dictionary

log = logging.getLogger(__name__)

BPE_MARKER = "@@ "


class TextCodec(Protocol):
    """Text <-> ids of one vocabulary (no eos added or expected)."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def unknown(self, text: str) -> list[str]: ...


def distinct(items: Iterable[str]) -> list[str]:
    """``items`` without repeats, in the order of their first occurrence."""
    return list(dict.fromkeys(items))


class DictionaryCodec:
    """Whitespace tokens of pre-tokenised (and BPE-split) text looked up in ``dictionary``."""

    def __init__(self, dictionary: Dictionary) -> None:
        self.dictionary = dictionary
        self.vocab_size = len(dictionary)

    def encode(self, text: str) -> list[int]:
        return self.dictionary.encode(text.split())

    def decode(self, ids: Iterable[int]) -> str:
        return remove_bpe(" ".join(self.dictionary.decode(ids)))

    def unknown(self, text: str) -> list[str]:
        """The distinct tokens of ``text`` that the dictionary lacks (each encodes as ``<unk>``)."""
        return distinct(t for t in text.split() if t not in self.dictionary.indices)


def remove_bpe(text: str) -> str:
    """Join subword-nmt pieces: ``"Ge@@ schich@@ te"`` -> ``"Geschichte"`` (fairseq's rule)."""
    return (text + " ").replace(BPE_MARKER, "").rstrip()


class SentencePieceCodec:
    """A SentencePiece model whose special ids are fairseq's."""

    def __init__(self, model_file: str | Path) -> None:
        self.model_file = Path(model_file)
        self.processor = spm.SentencePieceProcessor(model_file=str(model_file))
        ids = (
            self.processor.bos_id(),
            self.processor.pad_id(),
            self.processor.eos_id(),
            self.processor.unk_id(),
        )
        if ids != (BOS_ID, PAD_ID, EOS_ID, UNK_ID):
            raise ValueError(
                f"{model_file} has special ids (bos, pad, eos, unk) = {ids}; the models expect "
                f"{(BOS_ID, PAD_ID, EOS_ID, UNK_ID)}. Train it with train_sentencepiece."
            )
        self.vocab_size = self.processor.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.processor.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        return self.processor.decode([i for i in ids if i not in (BOS_ID, PAD_ID, EOS_ID)])

    def unknown(self, text: str) -> list[str]:
        """The distinct characters of ``text`` that no piece covers (a run of them encodes as one
        ``<unk>``), after the model's normalisation (NFKC: a full-width letter is a known one)."""
        pieces = self.processor.encode(text, out_type=str)
        runs = (p for p in pieces if self.processor.piece_to_id(p) == UNK_ID)
        # U+2581 is SentencePiece's mark of a word start, not a character of the text
        return distinct(ch for run in runs for ch in run if not ch.isspace() and ch != "\u2581")


def train_sentencepiece(
    texts: Sequence[str], model_prefix: str | Path, vocab_size: int, *, model_type: str = "bpe"
) -> SentencePieceCodec:
    """Train a SentencePiece model of exactly ``vocab_size`` pieces on ``texts``.

    Writes ``<model_prefix>.model`` and ``.vocab``. Every character of the text is covered
    (``character_coverage=1.0``: names in many scripts must not become ``<unk>``). One thread, so
    the same text gives the same model.

    The trainer writes both files into a scratch folder beside the cache, and they are moved into
    place (``.vocab`` first; :mod:`src.utils.files` does the same for single files): the
    ``.model`` that callers test for as the cache appears whole or not at all. Under DDP every
    process trains the same model into the same cache, and a process that found the file while
    another was still writing it would load a truncated model.
    """
    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=model_prefix.parent, prefix=".spm-") as scratch:
        scratch_prefix = Path(scratch) / model_prefix.name
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(texts),
                model_prefix=str(scratch_prefix),
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=1.0,
                bos_id=BOS_ID,
                pad_id=PAD_ID,
                eos_id=EOS_ID,
                unk_id=UNK_ID,
                num_threads=1,
                minloglevel=2,
            )
        except RuntimeError as error:
            # e.g. "Vocabulary size is too high (2000). Please set it to a value <= 1500."
            raise ValueError(
                f"cannot train a SentencePiece model of {vocab_size} pieces on {len(texts)} "
                f"sentences: {error}. Choose a smaller vocabulary size."
            ) from error
        for suffix in (".vocab", ".model"):
            os.replace(f"{scratch_prefix}{suffix}", f"{model_prefix}{suffix}")
    log.info(
        "trained a %s SentencePiece model of %d pieces: %s.model",
        model_type,
        vocab_size,
        model_prefix,
    )
    return SentencePieceCodec(f"{model_prefix}.model")
