"""``benchmarks/text.py``: every text system beside its baseline, at the ``--quick`` sizes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PAIRS = {
    ("pru_ptb", "train"), ("pru_ptb", "infer"), ("pru_wt2", "train"), ("pru_wt2", "infer"),
    ("awd_ptb", "train"), ("awd_ptb", "dynamic_eval"), ("mt_iwslt", "train"),
    ("mt_iwslt", "beam4"), ("mt_demo", "train"), ("lm_pydoc", "train"), ("charlm_g2", "train"),
    ("charlm_g2", "infer"), ("charlm_g4", "train"), ("charlm_g4", "infer"),
}  # fmt: skip
TARGETS = {
    ("pru_ptb", "train"): ">= 1.0", ("pru_ptb", "infer"): ">= 1.2",
    ("mt_iwslt", "train"): ">= 1.0", ("mt_iwslt", "beam4"): ">= 1.2",
    ("mt_demo", "train"): "<= 1.1", ("charlm_g2", "train"): ">= 1.0",
    ("charlm_g4", "train"): ">= 1.2",
}  # fmt: skip


def test_every_pair_and_metric_has_a_ratio(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    command = [sys.executable, "benchmarks/text.py", "--quick", "--repeats", "1", "--threads", "1",
               "--json", str(out)]  # fmt: skip
    # the quick run's measured path choices are not the machine's; ATen's CPU paths, since the
    # script is under test here, not the C++ kernels (whose build can take minutes)
    env = {**os.environ, "LIGHTNETS_CHOICES": str(tmp_path / "choices.json"),
           "LIGHTNETS_CPU_KERNELS": "0"}  # fmt: skip
    done = subprocess.run(
        command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert rows == [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["pair"], r["metric"]) for r in rows} == PAIRS
    assert len(rows) == len(PAIRS)
    for r in rows:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r
        assert r["a_value"] > 0 and r["b_value"] > 0 and r["a_params"] > 0 and r["b_params"] > 0
        assert r["target"] == TARGETS.get((r["pair"], r["metric"])), r
        assert r["threads"] == 1 and r["torch"] and r["date"] and r["cpu"]
    demo = next(r for r in rows if r["pair"] == "mt_demo")
    assert demo["unit"] == "ms/step" and demo["ratio_of"] == "step time"
    assert "| pair | metric |" in done.stdout
