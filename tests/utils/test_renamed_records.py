"""Checkpoints written before a rename still rebuild: their run records name today's classes."""

from __future__ import annotations

import importlib

import pytest

from src.utils.run_record import RENAMED_TARGETS, record_of


def resolve(path: str) -> object:
    """The module or attribute a dotted ``_target_`` path names."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("new", sorted(set(RENAMED_TARGETS.values())))
def test_every_new_name_exists(new: str) -> None:
    assert resolve(new) is not None


@pytest.mark.parametrize("old", sorted(RENAMED_TARGETS))
def test_no_old_name_is_still_in_use(old: str) -> None:
    """An old path that still imports would be mapped away from a live module."""
    with pytest.raises((ModuleNotFoundError, AttributeError)):
        resolve(old)


def test_an_old_record_names_todays_classes() -> None:
    old = {
        "version": "0.1.0",
        "choices": {"task": "awd_language_model", "data": "ptb", "model": "awd_lm"},
        "config": {
            "model": {"_target_": "src.models.dicenet.DiCENet", "scale": 0.5, "pretrained": None},
            "data": {"_target_": "src.datamodules.word_stream.WordStreamDataModule", "bptt": 70},
            "task": {
                "_target_": "src.tasks.awd_language_model.AWDLanguageModelTask",
                "scheduler": {"_target_": "src.tasks.schedules.warmup_cosine", "_partial_": True},
                "milestones": [1, 2],
            },
        },
    }
    record = record_of({"lightnets": old})
    assert record["choices"] == {"task": "awd_lm", "data": "ptb", "model": "awd_lm"}
    assert record["config"]["model"] == {"_target_": "src.models.dicenet.DiCENet", "scale": 0.5}
    assert record["config"]["data"] == {
        "_target_": "src.datamodules.awd_lm.AWDLMDataModule",
        "bptt": 70,
    }
    task = record["config"]["task"]
    assert task["_target_"] == "src.tasks.awd_lm.AWDLMTask"
    assert task["scheduler"] == {"_target_": "src.optim.schedules.warmup_cosine", "_partial_": True}
    assert task["milestones"] == [1, 2]
    for target in ("src.tasks.awd_lm.AWDLMTask", "src.optim.schedules.warmup_cosine"):
        assert callable(resolve(target))
