"""``+callbacks/early_stopping=default``: a run stops once val/loss stops improving, and still
finishes like any run (best checkpoint tested, ``metrics.json`` status finished)."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.utils import instantiate
from lightning.pytorch.callbacks import EarlyStopping

from src.commands.train import train

# the default job (DiCENet on the digits), 2 batches an epoch, validated every epoch
TINY = [
    "trainer.max_epochs=10",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "data.batch_size=32",
    "logger=csv",
]


def test_the_option_builds_lightnings_early_stopping_on_val_loss(make_cfg) -> None:
    cfg = make_cfg("+callbacks/early_stopping=default", "callbacks.early_stopping.patience=5")
    callback = instantiate(cfg.callbacks.early_stopping)
    assert isinstance(callback, EarlyStopping)
    assert (callback.monitor, callback.mode, callback.patience) == ("val/loss", "min", 5)
    assert callback.min_delta == 0.0
    assert "model_checkpoint" in cfg.callbacks  # added to the callbacks, not in their place


def test_a_plateau_stops_the_run_before_max_epochs(make_cfg) -> None:
    """No val/loss falls by min_delta 1,000, so the first validation is the best and the next
    two exhaust patience 2: 3 of the 10 epochs run."""
    cfg = make_cfg(
        *TINY,
        "+callbacks/early_stopping=default",
        "callbacks.early_stopping.patience=2",
        "callbacks.early_stopping.min_delta=1000",
    )
    summary = train(cfg)
    written = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())
    assert written["status"] == summary["status"] == "finished"
    assert written["updates"] == 3 * 2  # 3 epochs of 2 batches, not 10
    assert written["best_checkpoint"] and "test/loss" in written["metrics"]
