"""The model summary at the start of training lists parameters and modules, and no FLOPs column
or total: Lightning counts FLOPs only for a module with an ``example_input_array`` (the tasks have
none), so they read 0 beside the MACs the run reports."""

from __future__ import annotations

from pathlib import Path

from src.commands.train import train
from tests.conftest import compose_config

ONE_STEP = ["model=timm", "trainer.accelerator=cpu", "trainer.max_epochs=1",
            "trainer.limit_train_batches=1", "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1", "trainer.num_sanity_val_steps=0", "data.batch_size=8",
            "data.num_workers=0", "logger=csv", "callbacks.progress_bar=null"]  # fmt: skip


def test_a_training_run_prints_its_summary_without_flops(tmp_path: Path, capfd) -> None:
    summary = train(compose_config("train", ONE_STEP, tmp_path / "run"))
    out = capfd.readouterr().out
    assert "Total params: 4.9 M" in out and "Modules in train mode: " in out
    assert "FLOPs" not in out and "Flops" not in out
    assert summary["macs"] > 0  # what the run reports instead
