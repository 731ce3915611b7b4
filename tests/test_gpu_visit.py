"""The GPU visit command (``benchmarks/gpu_visit.py``) in its CPU dry run: every part runs at toy
sizes and leaves its rows and its section, so the command works when a GPU window comes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = Path(os.environ.get("REFERENCE_DIR", ROOT.parent / "shared" / "reference"))
SIDE_BY_SIDE = REFERENCE_DIR.parent / "bench" / "side_by_side.py"


@pytest.fixture(scope="module")
def visit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("visit") / "out"
    command = [sys.executable, "benchmarks/gpu_visit.py", "--dry", "--out", str(out)]
    if SIDE_BY_SIDE.exists():  # the official yardsticks, beside the project where it was cloned
        command += ["--side-by-side", str(SIDE_BY_SIDE)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return out, done


def test_every_part_leaves_rows_and_a_section(visit) -> None:
    out, done = visit
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # auto_choices.json where an op measured a choice (the CPU's, on this machine)
    assert sorted(p.name for p in out.iterdir() if p.name != "auto_choices.json") == [
        "logs.tar.gz", "results.json", "summary.md", "trace.json.gz"
    ]  # fmt: skip
    rows = json.loads((out / "results.json").read_text())
    summary = (out / "summary.md").read_text()
    for part in ("env", "pytest", "compile", "train", "cpu_check", "vision", "warm", "bench",
                 "pairs", "profile", "tune"):  # fmt: skip
        assert rows.get(part), f"no rows from {part}: {summary}"
        assert not any("error" in r and r["error"] for r in rows[part]), rows[part]
    for title in (
        "## Machine",
        "## pytest",
        "## torch.compile",
        "## Short",
        "## The PRU recurrence's C++ kernel on this CPU",
        "## Vision beside",
        "## First steps",
        "## benchmarks/gpu.py",
        "## Training steps",
        "## Profiles",
        "## Launch-configuration",
    ):
        assert title in summary


def test_the_parts_measure(visit) -> None:
    out, _ = visit
    rows = json.loads((out / "results.json").read_text())
    assert " passed" in rows["pytest"][0]["summary"] and not rows["pytest"][0]["failed"]
    (run,) = rows["train"]
    assert run["logged_steps"] >= 3 and math.isfinite(run["loss_first"]) and run["loss_last"] > 0
    (compiled,) = rows["compile"]
    assert compiled["graphs"] >= 1 and compiled["compiled_ms"] > 0
    pairs = {r["name"]: r for r in rows["pairs"]}
    assert pairs["gt4"]["baseline"] == "txl" and pairs["gt4"]["speedup"] > 0
    assert pairs["gt4"]["params"] < pairs["txl"]["params"]
    # each text system and its baseline also replayed as a CUDA graph (on the CPU: the same
    # compiled step, the capture skipped), compared with the baseline both ways
    graphed = pairs["gt4+graphed"]
    assert graphed["mode"] == "graphed" and graphed["capture_s"] > 0
    assert graphed["speedup"] > 0 and graphed["speedup_same_way"] > 0
    assert pairs["txl+graphed"]["baseline"] is None
    vision = {r["name"]: r for r in rows["vision"]}
    assert {"dicenet", "espnetv2", "shufflenet"} <= set(vision)
    for name in ("dicenet", "espnetv2"):
        assert vision[name]["baseline"] == "shufflenet" and vision[name]["speedup"] > 0
        assert vision[name]["infer_per_s"] > 0 and vision[name]["first_step_s"] > 0
        assert vision[name]["timed_choices"] >= 0
    *profiled, trace = rows["profile"]
    assert [p["name"] for p in profiled] == ["gt4", "txl", "gt4+graphed", "txl+graphed"]
    for p in profiled:
        assert len(p["top"]) == 15 and 0 < sum(k["share"] for k in p["top"]) <= 1.0 + 1e-6
        assert p["top"][0]["us"] >= p["top"][-1]["us"] > 0
    assert (
        trace["trace_of"] in [p["name"] for p in profiled]
        and (out / "trace.json.gz").stat().st_size > 1000
    )
    checks = rows["cpu_check"]
    assert [r["mode"] for r in checks] == ["plain", "packed"]
    for r in checks:  # a verdict either way: which mode runs is the CPU's to say
        assert r["verdict"].startswith(("exit 0", "exit 1", "died of")), r
        assert r["ok"] == r["verdict"].startswith("exit 0")
    assert [r["name"] for r in rows["warm"]] == ["dicenet", "espnetv2", "ssd"]
    assert all(r["first_train_step_s"] > 0 and r["second_inference_s"] > 0 for r in rows["warm"])
    assert any(r.get("part") == "dextra" and r.get("ms") for r in rows["bench"])
    assert any(r.get("layer", "").startswith("PRU") for r in rows["pru_lm"])
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("_pytest.log") for n in names) and len(names) >= 8
