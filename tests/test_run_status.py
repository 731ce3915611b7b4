"""A run that stops on an error is marked in its ``metrics.json`` (status ``failed``), so the run
directories under ``logs/`` tell finished, interrupted and failed runs apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from src.commands import train as train_command
from src.utils.config_checks import ConfigError
from tests.conftest import ROOT


def read_status(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def test_a_bad_option_marks_the_run_directory_failed(tmp_path) -> None:
    """The one-line error of ``train.py`` and the same error in the run directory it leaves."""
    env = {k: v for k, v in os.environ.items() if k != "PROJECT_ROOT"}
    command = [sys.executable, str(ROOT / "train.py"), "data.batch_size=0"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    assert done.stderr == "error: data.batch_size=0: must be a positive integer\n"
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    summary = read_status(run_dir)
    assert summary["status"] == "failed"
    assert summary["error"] == "data.batch_size=0: must be a positive integer"
    assert summary["output_dir"] == str(run_dir)


def test_a_bug_marks_the_run_failed_with_its_type(make_cfg, monkeypatch, tmp_path) -> None:
    def broken(cfg):
        raise RuntimeError("no luck")

    monkeypatch.setattr(train_command, "build_task", broken)
    with pytest.raises(RuntimeError):
        train_command.train(make_cfg("debug=fdr"))
    summary = read_status(tmp_path / "run")
    assert (summary["status"], summary["error"]) == ("failed", "RuntimeError: no luck")


def test_a_user_error_is_marked_with_its_message(make_cfg, tmp_path) -> None:
    with pytest.raises(ConfigError):
        train_command.train(make_cfg("data.batch_size=0"))
    assert read_status(tmp_path / "run")["error"] == "data.batch_size=0: must be a positive integer"


@pytest.mark.parametrize(
    ("status", "continued"),
    [(None, True), ("interrupted", True), ("failed", True), ("finished", False)],
)
def test_a_run_that_did_not_finish_is_continued_in_place(tmp_path, status, continued) -> None:
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    if status is not None:
        (run_dir / "metrics.json").write_text(json.dumps({"status": status}))
    found = train_command.unfinished_run_dir(run_dir / "checkpoints" / "last.ckpt")
    assert found == (run_dir.resolve() if continued else None)


def test_every_tool_marks_the_run_directory_it_leaves_on_an_error(tmp_path) -> None:
    """``predict.py`` (any Hydra tool, through ``src.build.hydra_main``) stopping on a user's
    mistake leaves ``metrics.json`` status ``failed`` with the line it printed."""
    env = {k: v for k, v in os.environ.items() if k != "PROJECT_ROOT"}
    missing = tmp_path / "none.png"
    command = [sys.executable, str(ROOT / "predict.py"), f"image={missing}", "allow_random=true"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    message = f"image {missing} does not exist; pass image=/path/to/file.jpg"
    assert done.stderr == f"error: {message}\n"
    (run_dir,) = (tmp_path / "logs" / "predict" / "runs").iterdir()
    assert (read_status(run_dir)["status"], read_status(run_dir)["error"]) == ("failed", message)
