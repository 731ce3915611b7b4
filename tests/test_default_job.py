"""``python train.py`` with no arguments but the CPU: the embedded default, DiCENet on digits,
reaches 97% validation and 95% test accuracy. The default ``accelerator: auto`` would take a GPU
where there is one; the CPU is where the job is measured.

The trajectory depends on the CPU's rounding (vector width, FMA contraction in ATen's and the
project's kernels), and the test split holds 270 images: seed 42 reached 98.9% test accuracy where
the README's figures were measured, 96.3% on an AMD EPYC with AVX-512, 97.8% on the same machine
with its kernels built for AVX2 and 98.1% on PyTorch's own paths; validation 98.5% on all three.
So the test asks 95% (at most 13 errors), a bar every CPU clears, not one machine's figure."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_default_job_reaches_97_percent_validation_accuracy(tmp_path) -> None:
    command = [sys.executable, "train.py", "trainer.accelerator=cpu", f"paths.log_dir={tmp_path}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("train/runs/*/metrics.json")
    summary = json.loads(path.read_text())
    assert summary["status"] == "finished"
    assert summary["params"] == 195_698  # DiCENet, the digits recipe
    assert summary["metrics"]["test/acc"] >= 0.95
    assert summary["metrics"]["best_val/acc"] >= 0.97
    assert str(path.parent) in done.stdout  # the run directory is printed at the end
