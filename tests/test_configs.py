"""Every option of every config group composes, and what it configures instantiates."""

from __future__ import annotations

import os

import lightning as L
import pytest
import torch
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.conftest import CONF, compose_config
from train import build_task, build_trainer


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


# overrides a data option needs to instantiate without a dataset on disk
DATA_NEEDS = {"image_folder": ["data.root=/nonexistent", "data.num_classes=5"]}
# multi-device and GPU trainers are instantiated on one CPU device here
CPU_ONLY = ["trainer.accelerator=cpu", "trainer.devices=1", "trainer.precision=32-true"]


def test_groups_have_options() -> None:
    for group in ["model", "data", "task", "trainer", "logger", "callbacks", "recipe", "experiment", "debug", "paths", "hydra"]:
        assert options(group), f"conf/{group}/ is empty"


@pytest.mark.parametrize("data", options("data"))
@pytest.mark.parametrize("model", options("model"))
def test_data_model_pairs_build(data: str, model: str, tmp_path) -> None:
    """The network for the task is built and runs forward+backward on the data's input shape."""
    cfg = compose_config("train", [f"data={data}", f"model={model}", *DATA_NEEDS.get(data, [])], tmp_path)
    datamodule, task = build_task(cfg)
    assert isinstance(datamodule, L.LightningDataModule) and isinstance(task, L.LightningModule)
    x = datamodule.example_input(2)
    if x.shape[-1] > 64:  # the ImageNet crop: check shapes on a smaller input of the same layout
        x = x[..., :64, :64]
    logits = task(x)
    assert logits.shape == (2, cfg.data.num_classes)
    logits.sum().backward()
    assert all(p.grad is not None for p in task.net.parameters() if p.requires_grad)


@pytest.mark.parametrize("trainer", options("trainer"))
def test_trainers_instantiate(trainer: str, tmp_path) -> None:
    overrides = [f"trainer={trainer}"]
    if trainer in ("gpu", "ddp", "fsdp") and not torch.cuda.is_available():
        overrides += CPU_ONLY + (["trainer.strategy=auto"] if trainer == "fsdp" else [])
    cfg = compose_config("train", overrides, tmp_path)
    assert isinstance(build_trainer(cfg), L.Trainer)


def test_distributed_trainers_compose(tmp_path) -> None:
    cfg = compose_config("train", ["trainer=ddp", "trainer.devices=8", "trainer.num_nodes=4"], tmp_path)
    assert (cfg.trainer.strategy, cfg.trainer.devices, cfg.trainer.num_nodes) == ("ddp", 8, 4)
    cfg = compose_config("train", ["trainer=fsdp"], tmp_path)
    assert isinstance(instantiate(cfg.trainer.strategy), L.pytorch.strategies.FSDPStrategy)
    cfg = compose_config("train", ["trainer=ddp_cpu"], tmp_path)
    assert (cfg.trainer.accelerator, cfg.trainer.devices, cfg.trainer.strategy) == ("cpu", 2, "ddp")


@pytest.mark.parametrize("logger", options("logger"))
def test_loggers_instantiate(logger: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cfg = compose_config("train", [f"logger={logger}"], tmp_path)
    (instance,) = [instantiate(c) for c in cfg.logger.values()]
    assert isinstance(instance, L.pytorch.loggers.Logger)


@pytest.mark.parametrize("callbacks", options("callbacks"))
def test_callbacks_instantiate(callbacks: str, tmp_path) -> None:
    cfg = compose_config("train", [f"callbacks={callbacks}"], tmp_path)
    built = [instantiate(c) for c in cfg.callbacks.values()]
    assert built and all(isinstance(c, L.Callback) for c in built)
    names = {type(c).__name__ for c in built}
    assert {"ModelCheckpoint", "LearningRateMonitor", "RichProgressBar", "FiniteLossGuard"} <= names
    if callbacks == "ema":
        assert "EMAWeightAveraging" in names


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiments_build(experiment: str, tmp_path) -> None:
    cfg = compose_config("train", [f"experiment={experiment}"], tmp_path)
    _, task = build_task(cfg)
    build_trainer(cfg)
    assert task(torch.zeros(2, cfg.data.in_chans, cfg.data.image_size, cfg.data.image_size)).shape == (2, 10)


@pytest.mark.parametrize("debug", options("debug"))
def test_debug_options_compose(debug: str, tmp_path) -> None:
    cfg = compose_config("train", [f"debug={debug}"], tmp_path)
    assert isinstance(build_trainer(cfg), L.Trainer)


@pytest.mark.parametrize("recipe", options("recipe"))
def test_recipe_applies_to_its_pair(recipe: str, tmp_path) -> None:
    """conf/recipe/<data>_<model>.yaml is picked up by that pairing without naming it."""
    data, model = recipe.split("_", 1)
    assert data in options("data") and model in options("model"), f"recipe {recipe} names no data/model pair"
    applied = compose_config("train", [f"data={data}", f"model={model}"], tmp_path)
    values = OmegaConf.load(CONF / "recipe" / f"{recipe}.yaml")
    leaves = {k: v for k, v in leaf_items(OmegaConf.to_container(values)) if not k.startswith("defaults")}
    assert leaves, f"recipe {recipe} sets nothing"
    for key, value in leaves.items():
        assert OmegaConf.select(applied, key) == value, f"{key} not applied from recipe {recipe}"


def leaf_items(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    items = []
    for key, value in tree.items():
        if isinstance(value, dict):
            items += leaf_items(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def test_recipe_then_command_line(tmp_path) -> None:
    default = compose_config("train", [], tmp_path)
    assert default.trainer.max_epochs == 30  # recipe/digits_timm.yaml over trainer/default.yaml's 10
    assert compose_config("train", ["trainer.max_epochs=3"], tmp_path).trainer.max_epochs == 3


def test_data_selects_task(tmp_path) -> None:
    cfg = compose_config("train", ["data=imagenet", "model=torchvision"], tmp_path)
    assert cfg.task._target_ == "src.tasks.classification.ImageClassification"
    assert cfg.task.num_classes == 1000 and cfg.model.num_classes == 1000


def test_unknown_option_lists_available(tmp_path) -> None:
    with pytest.raises(MissingConfigException) as error:
        compose_config("train", ["model=no_such_model"], tmp_path)
    message = str(error.value)
    assert "no_such_model" in message and "timm" in message and "torchvision" in message


def test_typo_in_key_is_rejected(tmp_path) -> None:
    with pytest.raises(Exception, match="trainer.max_epoch"):
        compose_config("train", ["trainer.max_epoch=3"], tmp_path)


def test_slurm_launcher_composes(tmp_path) -> None:
    cfg = compose_config(
        "train",
        ["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=8", "trainer.num_nodes=2"],
        tmp_path,
        keep_hydra=True,
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 8, 8)
    plain = compose_config("train", ["hydra/launcher=submitit_slurm"], tmp_path, keep_hydra=True)
    assert plain.hydra.launcher._target_.endswith("SlurmLauncher")


@pytest.mark.parametrize("config_name", ["train", "eval", "complexity"])
def test_entry_point_configs_compose(config_name: str, tmp_path) -> None:
    overrides = ["ckpt_path=/some.ckpt"] if config_name == "eval" else []
    cfg = compose_config(config_name, overrides, tmp_path)
    assert cfg.task_name == config_name and os.path.isabs(cfg.paths.output_dir)
