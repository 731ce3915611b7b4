"""``benchmarks/cpu_paths.py``: training steps under the three CPU path settings, at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_times_each_setting_and_reports_ratios_to_aten(tmp_path) -> None:
    command = [
        sys.executable, "benchmarks/cpu_paths.py", "--threads", "1", "--batch", "2", "--size", "32",
        "--scale", "0.5", "--repeats", "1", "--warmup", "1", "--networks", "dicenet",
    ]  # fmt: skip
    # its own store: the measured choices of this run are not the machine's
    env = {**os.environ, "LIGHTNETS_CHOICES": str(tmp_path / "choices.json")}
    done = subprocess.run(
        command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert row["network"] == "dicenet" and row["batch"] == 2 and row["size"] == 32
    for mode in ("auto", "1", "0"):
        assert row[f"ms_{mode}"] > 0
    # the ratio is of the unrounded times; the row's times are rounded to 0.01 ms
    ms_0, ms_auto = row["ms_0"], row["ms_auto"]
    bound = ms_0 / ms_auto * (0.005 / ms_0 + 0.005 / ms_auto) + 0.0005
    assert abs(row["auto_vs_aten"] - ms_0 / ms_auto) <= bound
    # auto measured its choices and kept them in the store given
    stored = json.loads((tmp_path / "choices.json").read_text())
    assert any("pointwise_conv" in ops or "batch_norm" in ops for ops in stored.values())
