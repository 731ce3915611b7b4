"""The default job under DDP on two CPU processes (gloo): metrics are synchronised.

Each process sees half of the validation and test images. If the torchmetrics states were not
reduced across processes, rank 0 would report the accuracy of its half only; the test requires
the DDP numbers to equal a single-process evaluation of the same checkpoint on all images.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate

from src.commands.eval import evaluate
from tests.conftest import ROOT, compose_config
from tests.datamodules.test_text_classification import tweets_file

QUIET = ["logger=csv", "data.num_workers=0"]


def train(log_dir: Path, *overrides: str) -> dict:
    """Run ``train.py`` in a fresh process; return the metrics.json of its run."""
    command = [sys.executable, "train.py", f"paths.log_dir={log_dir}", *QUIET, *overrides]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (metrics,) = log_dir.glob("*/runs/*/metrics.json")
    return json.loads(metrics.read_text())


@pytest.mark.slow
def test_ddp_cpu_metrics_equal_single_process(tmp_path) -> None:
    ddp = train(
        tmp_path / "ddp",
        "trainer=ddp_cpu",
        "callbacks.progress_bar=null",
        "trainer.max_epochs=3",
        "model=timm",  # learns digits within 3 epochs; DiCENet's BN statistics need a few more
    )
    best = ddp["best_checkpoint"]
    assert best and Path(best).is_file()
    # the single-process evaluation (eval.py's, in this process) on the CPU too, where the DDP
    # run's numbers were computed; the network (timm) comes from the checkpoint
    single = [*QUIET, "trainer=cpu", f"ckpt_path={best}"]
    val = evaluate(compose_config("eval", [*single, "split=val"], tmp_path / "val"))["metrics"]
    test = evaluate(compose_config("eval", [*single, "split=test"], tmp_path / "test"))["metrics"]

    assert ddp["metrics"]["best_val/acc"] == pytest.approx(val["val/acc"], abs=1e-6)
    assert ddp["metrics"]["test/acc"] == pytest.approx(test["test/acc"], abs=1e-6)
    assert ddp["metrics"]["test/loss"] == pytest.approx(test["test/loss"], rel=1e-5)
    assert 0.5 < test["test/acc"] < 1.0  # a model that has learnt something, not one class


@pytest.mark.slow
def test_ddp_test_outputs_hold_every_text_once_in_the_split_order(tmp_path) -> None:
    """Each process classifies every other test text, and the sampler repeats one of the 13 to
    give both processes 7: ``test_outputs.json`` holds the 13 once each, in the split's order."""
    summary = train(
        tmp_path / "ddp",
        "trainer=ddp_cpu",
        "callbacks.progress_bar=null",
        "data=sentiment_tweets",
        f"data.root={tmp_path / 'spm'}",
        f"data.csv_path={tweets_file(tmp_path / 't.csv', rows=130)}",
        "data.vocab_size=48",
        "data.max_length=8",
        "data.eval_batch_size=3",
        "model.d_model=32",
        "model.num_blocks=1",
        "trainer.max_epochs=1",
        "trainer.num_sanity_val_steps=0",
    )
    outputs = json.loads((Path(summary["output_dir"]) / "test_outputs.json").read_text())
    data = instantiate(compose_config("train", ["data=sentiment_tweets"]).data,
                       root=str(tmp_path / "spm"), csv_path=str(tmp_path / "t.csv"),
                       vocab_size=48, max_length=8)  # fmt: skip
    data.setup("test")
    assert outputs["ids"] == list(range(13))
    assert outputs["labels"] == [label for _, label in data.encoded["test"]]
