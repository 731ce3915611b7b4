"""Train a network: ``python train.py [model=...] [data=...] [key=value ...]``.

The command line only; what it does is :mod:`src.commands.train`."""

from __future__ import annotations

from omegaconf import DictConfig

from src.build import hydra_main
from src.commands.train import train
from src.utils.errors import reported_in_one_line


@hydra_main("train")
def main(cfg: DictConfig) -> float | None:
    with reported_in_one_line():
        summary = train(cfg)
    # the monitored value, for Hydra sweepers that optimise it
    checkpoint = (cfg.get("callbacks") or {}).get("model_checkpoint") or {}
    return summary["metrics"].get(f"best_{checkpoint.get('monitor')}")


if __name__ == "__main__":
    main()
