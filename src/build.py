"""Building a run's objects from a composed config: what every entry point shares.

``train.py``, ``eval.py``, ``complexity.py``, ``predict.py``, ``generate.py`` and ``translate.py``
check a composed config (:func:`check_config`), build the datamodule, network and task
(:func:`build_task`, or :func:`build_from_checkpoint` for a run's checkpoint) and the Trainer
(:func:`build_trainer`) with these functions, and do only their own work besides.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from src.utils.complexity import Complexity, measure
from src.utils.config_checks import (
    check_config_values,
    check_pairing,
    known_top_level_keys,
    reject_unknown_keys,
)
from src.utils.errors import UsageError
from src.utils.extras import require
from src.utils.model_sizes import size_error
from src.utils.run_record import (
    config_from_checkpoint,
    describe_data,
    describe_model,
    load_task_weights,
    override_key,
    read_checkpoint,
    record_of,
    renamed,
)

log = logging.getLogger(__name__)

# data keys a datamodule can count itself when the config leaves them null
VOCABULARY_KEYS = ("vocab_size", "src_vocab_size", "tgt_vocab_size")


def build_task(cfg: DictConfig) -> tuple[L.LightningDataModule, L.LightningModule]:
    """Instantiate the datamodule, the network and the task that wraps it (no dataset is read).

    A vocabulary the config leaves to the data (``data.vocab_size: null``, and a translation
    corpus's ``src_vocab_size``/``tgt_vocab_size``) is the datamodule's count, written into ``cfg``
    so that ``${data.vocab_size}`` (the model's ``n_token``) is it.
    """
    datamodule = instantiate(cfg.data)
    for key in VOCABULARY_KEYS:
        if key in cfg.data and cfg.data[key] is None:
            cfg.data[key] = getattr(datamodule, key)
    try:
        net = instantiate(cfg.model)
    except InstantiationException as error:
        model = OmegaConf.to_container(cfg.model, resolve=True)
        explained = size_error(model, error.__cause__, hydra_choices().get("model"), instantiate)
        if explained is None:
            raise
        raise explained from error
    task = instantiate(cfg.task, net=net)
    return datamodule, task


def compile_network(net: nn.Module, options: DictConfig | None) -> None:
    """``net.compile(...)`` in place when ``options.enabled`` (the other keys are torch.compile's
    arguments): forward and backward then run compiled, while ``net.state_dict()`` keeps its keys,
    so checkpoints, resume and ``eval.py`` work as with the eager network."""
    if options is None or not options.get("enabled", False):
        return
    kwargs = {k: v for k, v in OmegaConf.to_container(options).items() if k != "enabled"}
    net.compile(**kwargs)
    log.info("compiled the network with torch.compile(%s)", kwargs)


def build_trainer(cfg: DictConfig, extra_callbacks: tuple = ()) -> L.Trainer:
    """Instantiate callbacks and loggers (each a dict of named configs) and the Trainer.

    A ``callbacks.<name>`` entry without ``_target_`` is a setting of a callback the entry point
    does not build (a recipe's ``callbacks.model_checkpoint.monitor`` under ``eval.py``, which
    composes no callbacks) and is skipped."""
    callbacks = [
        instantiate(c)
        for c in (cfg.get("callbacks") or {}).values()
        if c is not None and "_target_" in c
    ]
    chosen = [c for c in (cfg.get("logger") or {}).values() if c is not None]
    if any(str(c.get("_target_", "")).endswith("WandbLogger") for c in chosen):
        require("wandb", "wandb", "logger=wandb")
    loggers = [instantiate(c) for c in chosen]
    return instantiate(
        cfg.trainer, callbacks=[*callbacks, *extra_callbacks], logger=loggers or False
    )


def hydra_choices() -> dict[str, Any]:
    """The config-group choices of the running Hydra job (empty outside one)."""
    if not HydraConfig.initialized():
        return {}
    return dict(HydraConfig.get().runtime.choices)


def hydra_overrides() -> list[str]:
    """The command-line overrides of the running Hydra job (empty outside one)."""
    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def check_config(cfg: DictConfig, config_name: str) -> None:
    """Before anything is built: no top-level key nobody reads, a model that fits the data, and
    ``model.*`` / ``data.*`` / ``task.*`` keys and values their constructors take."""
    reject_unknown_keys(cfg, known_top_level_keys(config_name))
    check_pairing(hydra_choices())
    check_config_values(cfg)


def complexity_of(task: L.LightningModule, datamodule: L.LightningDataModule) -> Complexity:
    """Parameters and MACs of the task's network for one example of the datamodule's input."""
    return measure(task.net, datamodule.example_input())


def build_from_checkpoint(cfg: DictConfig) -> tuple[L.LightningDataModule, L.LightningModule]:
    """``build_task`` for a run's checkpoint (``eval.py``, ``predict.py``, ``generate.py``) or an
    exported file (``onnx=``).

    With ``cfg.ckpt_path`` the ``model``, ``data`` and ``task`` sections come from the checkpoint's
    run record, except those the command line chose (``model=...``, ``data.batch_size=...``:
    reported in the log), and the weights are loaded, with a short message when they do not fit.
    With ``cfg.onnx`` they come from the run record ``export.py`` wrote into the file; the network
    keeps its random weights, for the caller to replace by the file's runtime.
    """
    onnx = cfg.get("onnx")
    if cfg.get("ckpt_path") is None and onnx is None:
        return build_task(cfg)
    if cfg.get("ckpt_path") is not None and onnx is not None:
        raise UsageError("pass ckpt_path=<a run's .ckpt> or onnx=<an exported file>, not both")
    if onnx is not None:
        from src.export.metadata import exported_record

        checkpoint, record, source = None, renamed(exported_record(onnx)), f"onnx={onnx}"
    else:
        checkpoint = read_checkpoint(cfg.ckpt_path)
        record, source = record_of(checkpoint), str(cfg.ckpt_path)
    overrides = hydra_overrides()
    chosen = {override_key(o) for o in overrides}
    choices = {k: v for k, v in hydra_choices().items() if k in chosen}
    if record is not None:
        for line in config_from_checkpoint(cfg, record, overrides):
            log.info("%s", line)
        choices = {**record.get("choices", {}), **choices}
    else:
        log.warning(
            "%s carries no run record: the network is the one the command line composes", source
        )
    datamodule, task = build_task(cfg)
    if checkpoint is None:
        return datamodule, task
    model = OmegaConf.to_container(cfg.model, resolve=True)
    data = OmegaConf.to_container(cfg.data, resolve=True)
    asked = (
        f"{describe_model(model, choices.get('model'))}, {describe_data(data, choices.get('data'))}"
    )
    load_task_weights(task, checkpoint, cfg.ckpt_path, asked)
    return datamodule, task


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """Plain floats of logged metrics (tensors, numbers), sorted by name."""
    return {name: float(value) for name, value in sorted(metrics.items())}
