"""Train a network: ``python train.py [model=...] [data=...] [key=value ...]``.

Hydra composes ``conf/train.yaml``; this script only instantiates and wires: seed, datamodule,
network, task, callbacks, loggers and Trainer; fit (or resume with ``ckpt_path=...``); test the
best checkpoint when the data has a test split; write ``metrics.json`` into the run directory.
``eval.py``, ``complexity.py``, ``predict.py`` and ``generate.py`` build their objects with the
functions defined here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from src.utils.complexity import Complexity, measure
from src.utils.files import write_json

log = logging.getLogger(__name__)


def build_task(cfg: DictConfig) -> tuple[L.LightningDataModule, L.LightningModule]:
    """Instantiate the datamodule, the network and the task that wraps it (no dataset is read).

    A vocabulary the config leaves to the data (``data.vocab_size: null``) is the datamodule's
    count, written into ``cfg`` so that ``${data.vocab_size}`` (the model's ``n_token``) is it.
    """
    datamodule = instantiate(cfg.data)
    if "vocab_size" in cfg.data and cfg.data.vocab_size is None:
        cfg.data.vocab_size = datamodule.vocab_size
    net = instantiate(cfg.model)
    task = instantiate(cfg.task, net=net)
    return datamodule, task


def build_trainer(cfg: DictConfig) -> L.Trainer:
    """Instantiate callbacks and loggers (each a dict of named configs) and the Trainer."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)


def complexity_of(task: L.LightningModule, datamodule: L.LightningDataModule) -> Complexity:
    """Parameters and MACs of the task's network for one example of the datamodule's input."""
    return measure(task.net, datamodule.example_input())


def load_checkpoint(task: L.LightningModule, path: str | Path) -> None:
    """Load the weights of a Lightning checkpoint of this project (tensors only) into ``task``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; pass ckpt_path=/path/to/file.ckpt")
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise KeyError(f"{path} is not a Lightning checkpoint (no 'state_dict')")
    task.load_state_dict(checkpoint["state_dict"])


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """Plain floats of logged metrics (tensors, numbers), sorted by name."""
    return {name: float(value) for name, value in sorted(metrics.items())}


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fit, test and summarise one run; returns what is written to ``metrics.json``."""
    start = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True)
    datamodule, task = build_task(cfg)
    complexity = complexity_of(task, datamodule)
    trainer = build_trainer(cfg)
    for logger in trainer.loggers:
        logger.log_hyperparams(
            {"config": OmegaConf.to_container(cfg, resolve=True), "params": complexity.params, "macs": complexity.macs}
        )

    trainer.fit(task, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=True)
    metrics = scalars({k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")})

    checkpoint = trainer.checkpoint_callback
    best_path = checkpoint.best_model_path if checkpoint is not None else ""
    if checkpoint is not None and checkpoint.best_model_score is not None:
        metrics[f"best_{checkpoint.monitor}"] = float(checkpoint.best_model_score)
    if cfg.test and datamodule.has_test:
        # the best checkpoint when one was written (not under fast_dev_run), else the final weights
        results = trainer.test(task, datamodule=datamodule, ckpt_path=best_path or None, weights_only=True)
        metrics.update(scalars(results[0]))

    output_dir = Path(cfg.paths.output_dir)
    summary = {
        "metrics": metrics,
        **complexity.as_dict(),
        "wall_time_s": round(time.perf_counter() - start, 2),
        "best_checkpoint": best_path or None,
        "output_dir": str(output_dir),
    }
    if trainer.is_global_zero:
        write_json(output_dir / "metrics.json", summary)
        log.info("metrics: %s", metrics)
        log.info("run directory: %s", output_dir)
    return summary


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    summary = train(cfg)
    # the monitored value, for Hydra sweepers that optimise it
    checkpoint = (cfg.get("callbacks") or {}).get("model_checkpoint") or {}
    return summary["metrics"].get(f"best_{checkpoint.get('monitor')}")


if __name__ == "__main__":
    main()
