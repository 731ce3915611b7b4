"""Generate text with a language model: ``python generate.py ckpt_path=... prompt='...'``.

The command line only; what it does is :mod:`src.commands.generate`."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from src.build import check_config
from src.commands.generate import generate
from src.utils.errors import reported_in_one_line


@hydra.main(version_base="1.3", config_path="conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "generate")
        generate(cfg)


if __name__ == "__main__":
    main()
