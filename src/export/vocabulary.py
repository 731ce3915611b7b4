"""The token vocabulary of a text system inside its exported files, so that ``generate.py onnx=``
and ``translate.py onnx=`` encode and decode text without the corpus (nothing is read or built
under ``data.root``).

:func:`vocabulary_metadata` describes the vocabulary of a set-up datamodule as JSON data, which
``export.py`` writes under the ``vocabulary`` key of every text graph's metadata
(:mod:`src.export.metadata`); :func:`use_exported_vocabulary` puts it back into a datamodule
built from the file's run record:

- character models (:class:`~src.datamodules.char_lm.CharLMDataModule`): ``{"symbols": [...]}``,
  the code point of each id;
- word models (:class:`~src.datamodules.word_corpus.WordCorpusDataModule`):
  ``{"dictionary": {"specials": [...], "symbols": [...], "eos": "..."}}``, the words in id order
  after the specials;
- translation (:class:`~src.datamodules.translation.TranslationDataModule`): ``{"source": codec,
  "target": codec}``, each a dictionary as above (BPE corpora) or ``{"sentencepiece": "<base64 of
  the serialised model>"}``;
- sentence classifiers (:class:`~src.datamodules.text_classification.TextClassificationDataModule`):
  ``{"sentencepiece": "..."}`` and ``"labels"``, the class names in label order.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import lightning as L
import sentencepiece as spm

from src.datamodules.char_lm import CharLMDataModule
from src.datamodules.dictionary import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Dictionary
from src.datamodules.subword import DictionaryCodec, SentencePieceCodec, TextCodec
from src.datamodules.text_classification import TextClassificationDataModule
from src.datamodules.translation import TranslationDataModule
from src.datamodules.word_corpus import Vocabulary, WordCorpusDataModule
from src.export.metadata import exported_file, read_metadata
from src.utils.errors import UsageError

KEY = "vocabulary"  # the metadata key


class EmbeddedSentencePiece(SentencePieceCodec):
    """A :class:`~src.datamodules.subword.SentencePieceCodec` loaded from the serialised model
    an exported file carries, instead of a ``.model`` file."""

    def __init__(self, model_proto: bytes) -> None:
        # SentencePieceCodec's constructor reads a file; this one has the model's bytes
        self.model_file = None
        self.processor = spm.SentencePieceProcessor(model_proto=model_proto)
        processor = self.processor
        ids = (processor.bos_id(), processor.pad_id(), processor.eos_id(), processor.unk_id())
        if ids != (BOS_ID, PAD_ID, EOS_ID, UNK_ID):
            raise ValueError(f"the embedded SentencePiece model has special ids {ids}")
        self.vocab_size = processor.get_piece_size()


def dictionary_entry(dictionary: Dictionary) -> dict[str, Any]:
    """A :class:`~src.datamodules.dictionary.Dictionary` (or a word corpus's
    :class:`~src.datamodules.word_corpus.Vocabulary`, with its end-of-line word) as JSON data."""
    entry: dict[str, Any] = {
        "specials": list(dictionary.specials),
        "symbols": list(dictionary.symbols[len(dictionary.specials) :]),
    }
    if isinstance(dictionary, Vocabulary):
        entry["eos"] = dictionary.eos
    return entry


def dictionary_of(entry: dict[str, Any]) -> Dictionary:
    """The dictionary :func:`dictionary_entry` wrote (a ``Vocabulary`` when it names an eos)."""
    if "eos" in entry:
        return Vocabulary(entry["symbols"], specials=entry["specials"], eos=entry["eos"])
    return Dictionary(entry["symbols"], specials=entry["specials"])


def codec_entry(codec: TextCodec) -> dict[str, Any]:
    """A translation or classification codec as JSON data: its dictionary or its serialised
    SentencePiece model (base64)."""
    if isinstance(codec, DictionaryCodec):
        return {"dictionary": dictionary_entry(codec.dictionary)}
    if isinstance(codec, SentencePieceCodec):
        proto = codec.processor.serialized_model_proto()
        return {"sentencepiece": base64.b64encode(proto).decode("ascii")}
    raise TypeError(f"no vocabulary entry for a {type(codec).__name__}")


def codec_of(entry: dict[str, Any]) -> TextCodec:
    """The codec :func:`codec_entry` wrote."""
    if "sentencepiece" in entry:
        return EmbeddedSentencePiece(base64.b64decode(entry["sentencepiece"]))
    return DictionaryCodec(dictionary_of(entry["dictionary"]))


def vocabulary_metadata(datamodule: L.LightningDataModule) -> dict[str, Any]:
    """The vocabulary of a text datamodule after ``setup`` (module docstring), as JSON data."""
    if isinstance(datamodule, CharLMDataModule):
        return {"symbols": [int(code) for code in datamodule.symbols]}
    if isinstance(datamodule, WordCorpusDataModule):
        return {"dictionary": dictionary_entry(datamodule.dictionary)}
    if isinstance(datamodule, TranslationDataModule):
        return {side: codec_entry(codec) for side, codec in datamodule.load_codecs().items()}
    if isinstance(datamodule, TextClassificationDataModule):
        return {**codec_entry(datamodule.codec), "labels": list(datamodule.label_names)}
    raise TypeError(f"{type(datamodule).__name__} has no token vocabulary to export")


def use_exported_vocabulary(datamodule: L.LightningDataModule, path: str | Path) -> None:
    """Give ``datamodule`` (built from the file's run record) the vocabulary the exported file at
    ``path`` carries, in place of the one ``setup`` would read or build under ``data.root``."""
    vocabulary = read_metadata(exported_file(path)).get(KEY)
    if not isinstance(vocabulary, dict):
        raise UsageError(
            f"onnx={path} carries no vocabulary (exported before files held one); export the "
            "checkpoint again with python export.py ckpt_path=<the run's .ckpt>"
        )
    if isinstance(datamodule, CharLMDataModule):
        datamodule.symbols = list(vocabulary["symbols"])
    elif isinstance(datamodule, WordCorpusDataModule):
        datamodule.dictionary = dictionary_of(vocabulary["dictionary"])
    elif isinstance(datamodule, TranslationDataModule):
        datamodule.codecs = {side: codec_of(vocabulary[side]) for side in ("source", "target")}
    elif isinstance(datamodule, TextClassificationDataModule):
        datamodule.codec = codec_of(vocabulary)
    else:
        raise TypeError(f"{type(datamodule).__name__} has no token vocabulary to take")
