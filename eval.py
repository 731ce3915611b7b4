"""Evaluate a checkpoint: ``python eval.py ckpt_path=/path/to.ckpt [overrides]``.

The network, data and task are rebuilt from the checkpoint's run record (the config it was trained
with); an override on the command line (``data.root=...``, ``split=val``) still wins and is
reported. Writes ``metrics.json`` (metrics, params, MACs, checkpoint) into the run directory.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
import lightning as L
from omegaconf import DictConfig

from src.utils.files import write_json
from train import build_from_checkpoint, build_trainer, check_config, complexity_of, scalars

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict:
    """Run the chosen split (``split=test|val``) on the checkpoint; returns the summary."""
    start = time.perf_counter()
    ckpt_path = Path(cfg.ckpt_path)
    if cfg.split not in ("test", "val"):
        raise ValueError(f"split must be 'test' or 'val', got {cfg.split!r}")
    L.seed_everything(cfg.seed, workers=True)
    datamodule, task = build_from_checkpoint(cfg)  # the weights are loaded
    complexity = complexity_of(task, datamodule)
    trainer = build_trainer(cfg)
    run = trainer.test if cfg.split == "test" else trainer.validate
    results = run(task, datamodule=datamodule)
    output_dir = Path(cfg.paths.output_dir)
    summary = {
        "metrics": scalars(results[0]),
        **complexity.as_dict(),
        "checkpoint": str(ckpt_path),
        "wall_time_s": round(time.perf_counter() - start, 2),
        "output_dir": str(output_dir),
    }
    if trainer.is_global_zero:
        write_json(output_dir / "metrics.json", summary)
        log.info("metrics: %s", summary["metrics"])
        log.info("run directory: %s", output_dir)
    return summary


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    check_config(cfg, "eval")
    evaluate(cfg)


if __name__ == "__main__":
    main()
