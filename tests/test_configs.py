"""Every option of every config group composes, and what it configures instantiates."""

from __future__ import annotations

import os

import lightning as L
import pytest
import torch
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from src.build import build_task, build_trainer
from src.datamodules.detection import DetectionDataModule
from src.utils.config_checks import MODEL_TASKS
from tests.conftest import CONF, compose_config


@pytest.fixture(autouse=True)
def no_onednn(monkeypatch) -> None:
    """oneDNN spends seconds building kernels for each new small grouped-conv shape (DiCE
    layers)."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def options(group: str) -> list[str]:
    """The options of a config group, those in sub-folders as ``<folder>/<name>`` (experiments)."""
    return sorted(
        p.relative_to(CONF / group).with_suffix("").as_posix()
        for p in (CONF / group).rglob("*.yaml")
    )


# overrides a data option needs to instantiate without a dataset on disk
DATA_NEEDS = {"image_folder": ["data.root=/nonexistent", "data.num_classes=5"]}
# overrides an experiment needs without files on disk (weights-only inits are read when fitting
# starts)
EXPERIMENT_NEEDS = {
    name: ["task.init_checkpoint=/nonexistent.ckpt"]
    for name in [
        "segmentation/voc_seg_stage2",
        "segmentation/cityscapes_stage2",
        "vision_classification/coco_multilabel_finetune",
        "pru_lm/table4_1_awd_pru_g4_m1400_finetune",
        "detection/ssd_espnetv2_512",
    ]
}
# multi-device and GPU trainers are instantiated on one CPU device here
CPU_ONLY = ["trainer.accelerator=cpu", "trainer.devices=1", "trainer.precision=32-true"]


def data_task(data: str) -> str:
    """The task a data option selects (``override /task@_global_.task: <task>`` in its defaults)."""
    for entry in OmegaConf.load(CONF / "data" / f"{data}.yaml").get("defaults", []):
        for key, value in dict(entry).items():
            if key.endswith("/task@_global_.task"):
                return value
    return "classification"  # conf/train.yaml's default task


def same_kind_pairs() -> list[tuple[str, str]]:
    """(data, model) pairs where the model serves the data's task (``MODEL_TASKS``)."""
    return [
        (data, model)
        for data in options("data")
        for model in options("model")
        if data_task(data) in MODEL_TASKS.get(model, ())
    ]


def small_input(datamodule: L.LightningDataModule) -> torch.Tensor | tuple:
    """The datamodule's example batch of 2, cut to at most 64 pixels or 32 tokens per side."""
    x = datamodule.example_input(2)
    if isinstance(datamodule, DetectionDataModule):  # SSD's priors fix its input size: keep it
        return x[:1]
    if isinstance(x, tuple):  # (src_tokens, src_padding_mask, prev_output_tokens) of translation
        src, mask, prev = x
        return src[:, :32], None if mask is None else mask[:, :32], prev[:, :32]
    if x.is_floating_point():
        return x[..., :64, :64]
    return x[:, :32]


def run_task(task: L.LightningModule, x: torch.Tensor | tuple) -> torch.Tensor:
    output = task(*x) if isinstance(x, tuple) else task(x)
    return output[0] if isinstance(output, tuple) else output


def check_output(output: torch.Tensor, x: torch.Tensor | tuple, cfg) -> None:
    if isinstance(x, tuple):  # translation: next-target-token logits
        assert output.shape == (*x[2].shape, cfg.data.tgt_vocab_size)
    elif output.dim() == 3 and output.shape[-1] == 4:  # SSD: encoded offsets, one per prior
        assert output.shape == (x.shape[0], task_priors(cfg), 4)
    elif x.is_floating_point() or "num_classes" in cfg.data:
        # classifiers (of images or token sequences) give (2, classes), segmentation networks
        # (2, classes, H, W)
        assert output.shape[:2] == (2, cfg.data.num_classes)
    else:
        assert output.shape == (*x.shape, cfg.data.vocab_size)  # next-token logits


def task_priors(cfg) -> int:
    """SSD's prior count at the data's image size (thesis/official: 11,640 at 300)."""
    return {300: 11_640, 512: 32_742}[cfg.data.image_size]


def test_groups_have_options() -> None:
    groups = ["model", "data", "task", "trainer", "logger", "callbacks", "monitor", "recipe"]
    for group in groups + ["experiment", "debug", "paths", "hydra"]:
        assert options(group), f"conf/{group}/ is empty"


@pytest.mark.parametrize(("data", "model"), same_kind_pairs())
def test_data_model_pairs_build(data: str, model: str, tmp_path) -> None:
    """Every data option instantiates with every model option of its modality."""
    cfg = compose_config(
        "train", [f"data={data}", f"model={model}", *DATA_NEEDS.get(data, [])], tmp_path
    )
    datamodule, task = build_task(cfg)
    assert isinstance(datamodule, L.LightningDataModule) and isinstance(task, L.LightningModule)
    assert sum(p.numel() for p in task.parameters()) > 0


def home_data(model: str) -> str:
    """The first data option of the model's modality, for the forward+backward check."""
    return next(data for data, other in same_kind_pairs() if other == model)


@pytest.mark.parametrize("model", options("model"))
def test_models_forward_backward(model: str, tmp_path) -> None:
    """Each network runs forward+backward through its task on a small input of its data."""
    data = home_data(model)
    cfg = compose_config(
        "train", [f"data={data}", f"model={model}", *DATA_NEEDS.get(data, [])], tmp_path
    )
    datamodule, task = build_task(cfg)
    x = small_input(datamodule)
    output = run_task(task, x)
    check_output(output, x, cfg)
    output.float().sum().backward()
    assert any(p.grad is not None for p in task.net.parameters())


@pytest.mark.parametrize("trainer", options("trainer"))
def test_trainers_instantiate(trainer: str, tmp_path) -> None:
    overrides = [f"trainer={trainer}"]
    if trainer in ("gpu", "ddp", "fsdp") and not torch.cuda.is_available():
        overrides += CPU_ONLY + (["trainer.strategy=auto"] if trainer == "fsdp" else [])
    cfg = compose_config("train", overrides, tmp_path)
    assert isinstance(build_trainer(cfg), L.Trainer)


def test_distributed_trainers_compose(tmp_path) -> None:
    cfg = compose_config(
        "train", ["trainer=ddp", "trainer.devices=8", "trainer.num_nodes=4"], tmp_path
    )
    assert (cfg.trainer.strategy, cfg.trainer.devices, cfg.trainer.num_nodes) == ("ddp", 8, 4)
    cfg = compose_config("train", ["trainer=fsdp"], tmp_path)
    assert isinstance(instantiate(cfg.trainer.strategy), L.pytorch.strategies.FSDPStrategy)
    # the GPU data-parallel configs take every GPU of the machine unless given a count
    for trainer in ("ddp", "fsdp"):
        assert compose_config("train", [f"trainer={trainer}"], tmp_path).trainer.devices == "auto"
    cfg = compose_config("train", ["trainer=ddp_cpu"], tmp_path)
    assert (cfg.trainer.accelerator, cfg.trainer.devices, cfg.trainer.strategy) == ("cpu", 2, "ddp")


@pytest.mark.parametrize("logger", options("logger"))
def test_loggers_instantiate(logger: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cfg = compose_config("train", [f"logger={logger}"], tmp_path)
    (instance,) = [instantiate(c) for c in cfg.logger.values()]
    assert isinstance(instance, L.pytorch.loggers.Logger)


@pytest.mark.parametrize("callbacks", [o for o in options("callbacks") if "/" not in o])
def test_callbacks_instantiate(callbacks: str, tmp_path) -> None:
    cfg = compose_config("train", [f"callbacks={callbacks}"], tmp_path)
    built = [instantiate(c) for c in cfg.callbacks.values()]
    assert built and all(isinstance(c, L.Callback) for c in built)
    names = {type(c).__name__ for c in built}
    assert {"ModelCheckpoint", "LearningRateMonitor", "RichProgressBar", "FiniteLossGuard"} <= names
    if callbacks == "ema":
        assert "EMAWeightAveraging" in names


@pytest.mark.parametrize("added", [o for o in options("callbacks") if "/" in o])
def test_callback_groups_add_to_any_callbacks_option(added: str, tmp_path) -> None:
    """``conf/callbacks/<name>/<option>.yaml`` is one more callback, ``callbacks.<name>``, added on
    top of the chosen option (``+callbacks/<name>=<option>``)."""
    name, option = added.split("/")
    for callbacks in ("default", "ema"):
        cfg = compose_config(
            "train", [f"callbacks={callbacks}", f"+callbacks/{name}={option}"], tmp_path
        )
        built = {key: instantiate(c) for key, c in cfg.callbacks.items()}
        assert isinstance(built[name], L.Callback)
        assert {"model_checkpoint", "finite_loss"} <= set(built)
        assert ("ema" in built) == (callbacks == "ema")


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiments_build(experiment: str, tmp_path) -> None:
    cfg = compose_config(
        "train", [f"experiment={experiment}", *EXPERIMENT_NEEDS.get(experiment, [])], tmp_path
    )
    datamodule, task = build_task(cfg)
    build_trainer(cfg)
    x = small_input(datamodule)
    check_output(run_task(task, x), x, cfg)


@pytest.mark.parametrize("debug", options("debug"))
def test_debug_options_compose(debug: str, tmp_path) -> None:
    cfg = compose_config("train", [f"debug={debug}"], tmp_path)
    assert isinstance(build_trainer(cfg), L.Trainer)


@pytest.mark.parametrize("recipe", options("recipe"))
def test_recipe_applies_to_its_pair(recipe: str, tmp_path) -> None:
    """conf/recipe/<data>_<model>.yaml is picked up by that pairing without naming it."""
    # <data>_<model>: the longest data option the name starts with (data names contain "_")
    data = max((d for d in options("data") if recipe.startswith(f"{d}_")), key=len, default="")
    model = recipe[len(data) + 1 :]
    assert data and model in options("model"), f"recipe {recipe} names no data/model pair"
    applied = compose_config("train", [f"data={data}", f"model={model}"], tmp_path)
    values = OmegaConf.load(CONF / "recipe" / f"{recipe}.yaml")
    leaves = {
        k: v for k, v in leaf_items(OmegaConf.to_container(values)) if not k.startswith("defaults")
    }
    if (
        not leaves
    ):  # a statement that no recipe applies (test_every_default_pair_has_a_recipe_or_says_none)
        assert "# recipe: none." in (CONF / "recipe" / f"{recipe}.yaml").read_text(), (
            f"recipe {recipe} sets nothing"
        )
        return
    raw = OmegaConf.to_container(applied, resolve=False)  # interpolations compared as written
    for key, value in leaves.items():
        node = raw
        for part in key.split("."):
            node = node[part]
        assert node == value, f"{key} not applied from recipe {recipe}"


def leaf_items(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    items = []
    for key, value in tree.items():
        if isinstance(value, dict):
            items += leaf_items(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


@pytest.mark.parametrize("data", options("data"))
def test_monitor_follows_the_task(data: str, tmp_path) -> None:
    """Checkpoints keep the best value of the data's task metric (conf/monitor/<task>.yaml)."""
    cfg = compose_config(
        "train", [f"data={data}", *DATA_NEEDS.get(data, [])], tmp_path, keep_hydra=True
    )
    task = cfg.hydra.runtime.choices.task
    expected = OmegaConf.load(CONF / "monitor" / f"{task}.yaml").callbacks.model_checkpoint
    assert cfg.callbacks.model_checkpoint.monitor == expected.monitor
    assert cfg.callbacks.model_checkpoint.mode == expected.mode


def test_recipe_then_command_line(tmp_path) -> None:
    timm = compose_config("train", ["model=timm"], tmp_path)
    assert timm.trainer.max_epochs == 30  # recipe/digits_timm.yaml over trainer/default.yaml's 10
    assert (
        compose_config("train", ["model=timm", "trainer.max_epochs=3"], tmp_path).trainer.max_epochs
        == 3
    )


def test_data_selects_task(tmp_path) -> None:
    cfg = compose_config("train", ["data=imagenet", "model=torchvision"], tmp_path)
    assert cfg.task._target_ == "src.tasks.classification.ClassificationTask"
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
    assert (
        launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    )
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 8, 8)
    plain = compose_config("train", ["hydra/launcher=submitit_slurm"], tmp_path, keep_hydra=True)
    assert plain.hydra.launcher._target_.endswith("SlurmLauncher")


@pytest.mark.parametrize("config_name", ["train", "eval", "complexity"])
def test_entry_point_configs_compose(config_name: str, tmp_path) -> None:
    overrides = ["ckpt_path=/some.ckpt"] if config_name == "eval" else []
    cfg = compose_config(config_name, overrides, tmp_path)
    assert cfg.task_name == config_name and os.path.isabs(cfg.paths.output_dir)


def data_model(data: str) -> str:
    """The model a data option picks (``override /model@_global_.model: <model>`` in its
    defaults)."""
    for entry in OmegaConf.load(CONF / "data" / f"{data}.yaml").get("defaults", []):
        for key, value in dict(entry).items():
            if key.endswith("/model@_global_.model"):
                return value
    return "dicenet"  # conf/train.yaml's default model


@pytest.mark.parametrize("data", options("data"))
def test_every_default_pair_has_a_recipe_or_says_none(data: str) -> None:
    """``python train.py data=<data>`` trains the data's default model on a paper's recipe, or the
    recipe file says in one line why none applies and where the settings are."""
    pair = f"{data}_{data_model(data)}"
    path = CONF / "recipe" / f"{pair}.yaml"
    assert path.is_file(), (
        f"conf/recipe/{pair}.yaml is missing: write the paper's recipe, or '# recipe: none. <why>'"
    )
    settings = OmegaConf.load(path)
    statement = [
        line for line in path.read_text().splitlines() if line.startswith("# recipe: none.")
    ]
    if len(settings) == 0:
        assert statement and len(statement[0]) > len("# recipe: none. ") + 20, (
            f"{path} is empty without a reason"
        )
    else:
        assert not statement, f"{path} sets values yet says no recipe applies"
