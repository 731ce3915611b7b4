"""Reading weights files: a file torch cannot read is named with torch's reason in whole
sentences."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from src.utils.state_dicts import first_sentences, torch_load


def test_a_truncated_checkpoint_is_named_with_the_whole_reason(tmp_path: Path) -> None:
    full, cut = tmp_path / "full.ckpt", tmp_path / "cut.ckpt"
    torch.save({"state_dict": {"w": torch.randn(200, 200)}}, full)
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(ValueError) as error:
        torch_load(cut, "ckpt_path")
    message = str(error.value)
    assert message.startswith(f"ckpt_path={cut} is not a weights file or checkpoint")
    # torch's reason ends where its sentence does, with the closing parenthesis after it
    assert message.endswith(".)"), message


def test_first_sentences_keeps_whole_sentences_within_the_limit() -> None:
    text = "First one. Second one is longer. Third.\nsecond line"
    assert first_sentences(text, limit=40) == "First one. Second one is longer. Third."
    assert first_sentences(text, limit=25) == "First one."
    long = "word " * 100
    cut = first_sentences(long, limit=50)
    assert cut.endswith("...") and len(cut) <= 53 and not cut.endswith(" ...")
    assert first_sentences("") == ""
