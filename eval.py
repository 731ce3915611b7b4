"""Evaluate a checkpoint: ``python eval.py ckpt_path=/path/to.ckpt [overrides]``.

The command line only; what it does is :mod:`src.commands.eval`."""

from __future__ import annotations

from omegaconf import DictConfig

from src.build import check_config, hydra_main
from src.commands.eval import evaluate
from src.utils.errors import reported_in_one_line


@hydra_main("eval")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "eval")
        evaluate(cfg)


if __name__ == "__main__":
    main()
