"""Generate text with a language model: ``python generate.py ckpt_path=... prompt='...'``.

The command line only; what it does is :mod:`src.commands.generate`."""

from __future__ import annotations

from omegaconf import DictConfig

from src.build import check_config, hydra_main
from src.commands.generate import generate
from src.utils.errors import reported_in_one_line


@hydra_main("generate")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "generate")
        generate(cfg)


if __name__ == "__main__":
    main()
