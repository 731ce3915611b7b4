"""Every W&B sweep in sweeps/ is valid for W&B and every run of its grid composes with Hydra."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from tests.conftest import ROOT, compose_config

SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def grid(parameters: dict) -> list[dict[str, object]]:
    """Every combination a sweep can produce: ``values`` lists, fixed ``value``s, and the
    ``min``/``max`` ends of distributions."""
    axes = {}
    for key, spec in parameters.items():
        if "values" in spec:
            axes[key] = list(spec["values"])
        elif "value" in spec:
            axes[key] = [spec["value"]]
        elif "min" in spec and "max" in spec:
            axes[key] = [spec["min"], spec["max"]]
        else:
            raise ValueError(f"parameter {key}: unsupported specification {spec}")
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def test_there_are_sweeps() -> None:
    assert SWEEPS, "sweeps/ holds no sweep YAML"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_sweep_is_valid_for_wandb(path: Path) -> None:
    from sweeps import schema_violations_from_proposed_config  # W&B's own sweep-config schema

    config = load(path)
    assert schema_violations_from_proposed_config(config) == []
    assert "${args_no_hyphens}" in config["command"], "overrides must reach Hydra without '--'"
    assert (ROOT / config["program"]).is_file()


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_sweep_run_composes(path: Path, tmp_path) -> None:
    runs = grid(load(path)["parameters"])
    assert runs
    for run in runs:
        cfg = compose_config("train", [f"{k}={v}" for k, v in run.items()], tmp_path, keep_hydra=True)
        choices = cfg.hydra.runtime.choices
        for key, value in run.items():
            actual = choices[key] if key in choices else OmegaConf.select(cfg, key)
            assert actual == value, f"{path.name}: {key}={value} composed as {actual}"


def test_sweep_is_invalid_without_method() -> None:
    from sweeps import schema_violations_from_proposed_config

    config = load(SWEEPS[0])
    del config["method"]
    assert schema_violations_from_proposed_config(config)


@pytest.mark.slow
def test_default_sweep_runs_offline_as_multirun(tmp_path) -> None:
    """The W&B grid of digits_lr_wd as a Hydra multirun (fast_dev_run per job, CSV logger)."""
    parameters = load(ROOT / "sweeps" / "digits_lr_wd.yaml")["parameters"]
    overrides = [
        f"{key}={','.join(str(v) for v in spec['values'])}" for key, spec in parameters.items() if "values" in spec
    ]
    command = [sys.executable, "train.py", "-m", *overrides, "debug=fdr", f"paths.log_dir={tmp_path}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(tmp_path.glob("train/multiruns/*/*/metrics.json"))) == len(grid(parameters))
