"""Word-level corpora served for segment-level recurrence (Transformer-XL's ordered iterator), for
the word-level Transformer-XL and Group-Transformer (Group-Transformer paper, appendix D).

The corpus, dictionary and token cache are WikiText-103's as :mod:`src.datamodules.word_lm` reads
them (every line ends with ``</s>``; fairseq's dictionary, so the adaptive input's bands follow the
words' training counts). The batches are the character models' instead of fairseq's blocks: each
split is one stream cut into ``batch_size`` contiguous rows, served in order as (input, target)
segments of ``tgt_len`` words (:class:`~src.datamodules.char_lm.OrderedSegments`), so the memories
of one batch are the context of the next; training drops a last shorter segment (one batch shape).
Validation and test score every word once, with the memories of all the split before it (as the
official ``eval.py``), in segments of ``eval_tgt_len`` (the last one shorter).

``PydocWordSegmentsDataModule`` is the offline demo: CPython's documentation topics as
``PydocWordsDataModule`` writes them.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from src.datamodules.char_lm import segments_loader
from src.datamodules.dictionary import EOS_ID
from src.datamodules.text_files import DEFAULT_ENCODING
from src.datamodules.word_corpus import PydocCorpus
from src.datamodules.word_lm import WORD, WordLMDataModule


class WordSegmentsDataModule(WordLMDataModule):
    """WikiText-103 (or any corpus in its layout) in ordered segments of words.

    Args:
        root: the folder holding ``wiki.{train,valid,test}.tokens`` (and optionally ``dict.txt``).
        vocab_size: the dictionary size the model is built for (WikiText-103: 267,744); a
            dictionary of another size is refused. None: the dictionary's size.
        tgt_len: training segment length (the official WikiText-103 base script: 150).
        batch_size: parallel sub-streams in training (per process).
        eval_tgt_len: evaluation segment length.
        eval_batch_size: parallel sub-streams in evaluation (1 scores the split as one stream).
        num_workers: unused (the stream is read in order in the main process); kept for the
            shared corpus code.
        encoding: the text files' encoding, a Python codec name.

    Shape:
        batches are ((B, T) int64 inputs, (B, T) int64 targets); T = tgt_len in training,
        T <= eval_tgt_len in evaluation
    """

    def __init__(
        self,
        root: str,
        vocab_size: int | None = 267_744,
        tgt_len: int = 150,
        batch_size: int = 60,
        *,
        eval_tgt_len: int = 150,
        eval_batch_size: int = 10,
        num_workers: int = 0,
        encoding: str = DEFAULT_ENCODING,
    ) -> None:
        if eval_tgt_len < 1:
            raise ValueError(f"eval_tgt_len must be >= 1, got {eval_tgt_len}")
        self.tgt_len = tgt_len
        self.eval_tgt_len = eval_tgt_len
        super().__init__(
            root,
            vocab_size,
            tgt_len,
            batch_size,
            eval_batch_size=eval_batch_size,
            eval_context_window=0,
            num_workers=num_workers,
            encoding=encoding,
        )

    def example_input(self, batch_size: int = 1) -> Tensor:
        """A batch of ``</s>`` tokens with the training segment shape: (batch_size, tgt_len)."""
        return torch.full((batch_size, self.tgt_len), EOS_ID, dtype=torch.long)

    def _segments(self, split: str, batch_size: int, tgt_len: int) -> DataLoader:
        return segments_loader(self, split, batch_size, tgt_len)

    def train_dataloader(self) -> DataLoader:
        return self._segments("train", self.batch_size, self.tgt_len)

    def val_dataloader(self) -> DataLoader:
        return self._segments("val", self.eval_batch_size, self.eval_tgt_len)

    def test_dataloader(self) -> DataLoader:
        return self._segments("test", self.eval_batch_size, self.eval_tgt_len)


class PydocWordSegmentsDataModule(PydocCorpus, WordSegmentsDataModule):
    """CPython's documentation topics as a word corpus (``PydocWordsDataModule``'s text and
    dictionary), in ordered segments (always offline).

    Args (besides :class:`WordSegmentsDataModule`'s):
        vocab_size: None (the default) for the dictionary's size.
        val_fraction, test_fraction: shares of the lines for validation and test (from the end).
        min_count: training count below which a word becomes ``<unk>``.
    """

    def __init__(
        self,
        root: str,
        vocab_size: int | None = None,
        tgt_len: int = 64,
        batch_size: int = 16,
        *,
        eval_tgt_len: int = 64,
        eval_batch_size: int = 8,
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
            tgt_len,
            batch_size,
            eval_tgt_len=eval_tgt_len,
            eval_batch_size=eval_batch_size,
            num_workers=num_workers,
        )
