"""``python train.py`` with no arguments but the CPU: the embedded default, DiCENet on digits,
reaches 97% test accuracy. The default ``accelerator: auto`` would take a GPU where there is one; the CPU is where
the job is measured."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_default_job_reaches_97_percent(tmp_path) -> None:
    command = [sys.executable, "train.py", "trainer.accelerator=cpu", f"paths.log_dir={tmp_path}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("train/runs/*/metrics.json")
    summary = json.loads(path.read_text())
    assert summary["status"] == "finished"
    assert summary["params"] == 195_698  # DiCENet, the digits recipe
    assert summary["metrics"]["test/acc"] >= 0.97
    assert summary["metrics"]["best_val/acc"] >= 0.97
    assert str(path.parent) in done.stdout  # the run directory is printed at the end
