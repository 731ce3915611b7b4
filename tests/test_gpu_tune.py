"""The launch-configuration sweep (``benchmarks/gpu_tune.py``) in its dry mode: in Triton's
interpreter, at tiny shapes, every case runs its configurations, reports a winner, and leaves the
kernel modules' globals as it found them."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

pytest.importorskip("triton")

from benchmarks import gpu_tune

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the dry run needs Triton's interpreter (set without CUDA in tests/conftest.py); with "
    "CUDA the sweep itself runs",
)


def _globals() -> dict[str, object]:
    return {knob.name: knob.current() for knob in gpu_tune.KNOBS}


def _sweep(tmp_path: Path, *args: str) -> dict:
    path = tmp_path / "tune.json"
    assert gpu_tune.main(["--dry", "--json", str(path), *args]) == 0
    return json.loads(path.read_text())


def test_dry_sweep_reports_every_case_and_restores_the_globals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _globals()
    result = _sweep(tmp_path, "--budget", "600", "--md", str(tmp_path / "tune.md"))
    assert _globals() == before
    cases = list(gpu_tune.CASES)
    assert result["finished"] == cases and not result["cut"] and not result["skipped"]
    assert set(result["winners"]) == set(cases)
    rows = result["rows"]
    assert [row["error"] for row in rows] == [None] * len(rows)
    for name in cases:
        ran = [row for row in rows if row["case"] == name]
        # the default and at least one other configuration, in both precisions
        assert {row["precision"] for row in ran} == {"fp32", "bf16"}
        assert any(row["default"] for row in ran) and not all(row["default"] for row in ran)
        summary = [row for row in result["summary"] if row["case"] == name]
        assert summary and len(result["winners"][name]) == len(summary)
        for row in summary:
            assert row["complete"] and math.isfinite(row["best_ms"]) and row["best_ms"] > 0
            assert row["best_ms"] <= row["default_ms"]
    printed = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in printed if line.startswith("{")] == rows
    markdown = (tmp_path / "tune.md").read_text()
    assert all(f"### {name}:" in markdown for name in cases)


def test_no_budget_skips_every_case(tmp_path: Path) -> None:
    result = _sweep(tmp_path, "--budget", "0")
    assert result["skipped"] == list(gpu_tune.CASES)
    assert not result["finished"] and not result["rows"] and not result["winners"]


def test_configurations_compiled_ahead_by_worker_processes(tmp_path: Path) -> None:
    before = _globals()
    result = _sweep(
        tmp_path, "--cases", "grouped_norm", "--precisions", "fp32", "--compile-jobs", "1"
    )
    assert _globals() == before
    assert result["finished"] == ["grouped_norm"] and result["winners"]["grouped_norm"]


def test_a_configuration_that_raises_is_reported_and_the_next_still_runs() -> None:
    s, _, _ = gpu_tune.parse_settings(["--dry"])
    shape = gpu_tune.relative_softmax_shapes(s)[0]
    knob = gpu_tune.SOFTMAX_ELEMENTS
    default = {knob.name: knob.current()}
    with gpu_tune.launch_targets(s):
        rows, stopped = gpu_tune.time_configs(
            "relative_softmax", shape, "fp32", 0, [{knob.name: 0}, default], default, s, math.inf
        )
    assert not stopped and rows[0]["error"].startswith("ZeroDivisionError")
    assert rows[1]["error"] is None and rows[1]["ms"] > 0
    assert knob.current() == default[knob.name]
