"""Every W&B sweep in sweeps/ is valid for W&B and every run of its grid composes with Hydra."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
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
        cfg = compose_config(
            "train", [f"{k}={v}" for k, v in run.items()], tmp_path, keep_hydra=True
        )
        choices = cfg.hydra.runtime.choices
        for key, value in run.items():
            actual = choices[key] if key in choices else OmegaConf.select(cfg, key)
            assert actual == value, f"{path.name}: {key}={value} composed as {actual}"


def test_sweep_is_invalid_without_method() -> None:
    from sweeps import schema_violations_from_proposed_config

    config = load(SWEEPS[0])
    del config["method"]
    assert schema_violations_from_proposed_config(config)


HYDRA_APPS = ("train", "eval", "export", "predict", "generate", "translate", "complexity")


@pytest.mark.parametrize("config_name", HYDRA_APPS)
def test_sweep_dir_resolves_before_any_job(config_name: str, monkeypatch) -> None:
    """Hydra resolves ``hydra.sweep.dir`` before it sets HydraConfig (the first job does), so the
    paths it interpolates must not need ``${hydra:...}``; a user's shell has no ``PROJECT_ROOT``."""
    monkeypatch.delenv("PROJECT_ROOT", raising=False)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name, return_hydra_config=True)
    GlobalHydra.instance().clear()
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # as before the first job
    assert cfg.hydra.sweep.dir.startswith(f"./logs/{config_name}/multiruns/")
    assert cfg.hydra.run.dir.startswith(f"./logs/{config_name}/runs/")
    monkeypatch.setenv("PROJECT_ROOT", "/data/project")
    assert cfg.hydra.sweep.dir.startswith(f"/data/project/logs/{config_name}/multiruns/")


def user_env(**extra: str) -> dict[str, str]:
    """A user's environment: without the tests' per-worker ``PROJECT_ROOT`` (tests/conftest.py),
    so ``paths.root_dir`` is the folder the command runs from."""
    return {**{k: v for k, v in os.environ.items() if k != "PROJECT_ROOT"}, **extra}


def agent_command(path: Path, values: dict[str, object]) -> list[str]:
    """The command line ``wandb agent`` starts for the run ``values`` of the sweep in ``path``: the
    sweep's ``command`` with its macros expanded by W&B's own functions, as
    ``wandb_agent.Agent`` does, the program taken from the checkout the agent runs in and the
    interpreter (``python`` on the agent's PATH) this one."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command, create_sweep_command_args

    config = load(path)
    macros = {
        **create_sweep_command_args({"args": {k: {"value": v} for k, v in values.items()}}),
        "env": ["/usr/bin/env"],
        "interpreter": [sys.executable],
        "program": [str(ROOT / config["program"])],
    }
    command: list[str] = []
    for word in map(str, create_sweep_command(config["command"])):
        is_macro = word.startswith("${") and word.endswith("}")
        command += (macros.get(word[2:-1]) or []) if is_macro else [word]
    return command


def test_agent_command_passes_overrides_without_hyphens() -> None:
    command = agent_command(ROOT / "sweeps" / "digits_lr_wd.yaml", {"task.optimizer.lr": 0.05})
    program = str(ROOT / "train.py")
    assert command == ["/usr/bin/env", sys.executable, program, "task.optimizer.lr=0.05"]


@pytest.mark.slow
def test_multirun_runs_as_documented(tmp_path) -> None:
    """``python train.py -m key=a,b`` as docs/training.md writes it, from another folder, with no
    ``hydra.sweep.dir`` and no ``PROJECT_ROOT``: Hydra resolves the sweep directory before any job
    has started (``paths.root_dir`` needs no ``${hydra:...}``), each job its own subdirectory."""
    command = [sys.executable, str(ROOT / "train.py"), "-m", "task.optimizer.lr=0.01,0.05"]
    command += ["debug=fdr", "data.num_workers=0"]
    done = subprocess.run(
        command, cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    for job, lr in (("0", 0.01), ("1", 0.05)):
        summary = json.loads((sweep_dir / job / "metrics.json").read_text())
        assert summary["status"] == "finished"
        assert OmegaConf.load(sweep_dir / job / ".hydra" / "config.yaml").task.optimizer.lr == lr


@pytest.mark.slow
def test_wandb_agent_command_runs_offline(tmp_path) -> None:
    """One run of sweeps/digits_lr_wd.yaml, started as ``wandb agent`` starts it (its ``logger:
    wandb`` offline), a few batches long."""
    path = ROOT / "sweeps" / "digits_lr_wd.yaml"
    parameters = load(path)["parameters"]
    values = {key: spec.get("values", [spec.get("value")])[0] for key, spec in parameters.items()}
    assert values["logger"] == "wandb"
    command = agent_command(path, values)
    command += ["debug=limit", "trainer.max_epochs=1", "data.num_workers=0"]
    env = user_env(WANDB_MODE="offline", WANDB_SILENT="true")
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "finished"
    assert list((run_dir / "wandb").glob("offline-run-*")), "the W&B logger wrote no offline run"
