"""The SentencePiece cache is written so that a reader never finds half a model.

Under DDP every process trains the same model into the same ``<root>/spm<V>.<crc>`` prefix; a
process that tested for ``.model``, found it while another process was writing it and loaded it
crashed the run ("connection closed by peer" on the other rank).
"""

from __future__ import annotations

import pytest
import sentencepiece as spm

from src.datamodules.subword import SentencePieceCodec, train_sentencepiece

TEXTS = ["ab ba abc cab bca", "cc a b aab"] * 20


def test_the_model_appears_only_once_it_is_written_whole(tmp_path, monkeypatch) -> None:
    prefix = tmp_path / "cache" / "spm16"
    trained_to = []
    real_train = spm.SentencePieceTrainer.train

    def train_and_look(**kwargs):
        real_train(**kwargs)
        trained_to.append(kwargs["model_prefix"])
        # the trainer has finished writing, and the cache's name still holds nothing
        assert not prefix.with_suffix(".model").exists()
        assert not prefix.with_suffix(".vocab").exists()

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", train_and_look)
    codec = train_sentencepiece(TEXTS, prefix, 16)

    assert len(trained_to) == 1 and trained_to[0] != str(prefix)
    assert codec.vocab_size == 16
    # the scratch folder is gone: only the two files are left
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["spm16.model", "spm16.vocab"]
    again = SentencePieceCodec(prefix.with_suffix(".model"))
    assert again.encode("abc cab") == codec.encode("abc cab")


def test_a_truncated_model_at_the_cache_name_is_replaced_whole(tmp_path) -> None:
    prefix = tmp_path / "spm16"
    whole = train_sentencepiece(TEXTS, prefix, 16)
    size = prefix.with_suffix(".model").stat().st_size
    prefix.with_suffix(".model").write_bytes(prefix.with_suffix(".model").read_bytes()[:100])

    retrained = train_sentencepiece(TEXTS, prefix, 16)

    assert prefix.with_suffix(".model").stat().st_size == size
    assert retrained.encode("ab cc aab") == whole.encode("ab cc aab")


def test_a_failed_training_leaves_no_scratch_behind(tmp_path) -> None:
    with pytest.raises(ValueError, match="cannot train a SentencePiece model of 5000 pieces"):
        train_sentencepiece(TEXTS, tmp_path / "spm5000", 5000)
    assert list(tmp_path.iterdir()) == []
