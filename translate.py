"""Translate sentences with a trained model: ``python translate.py ckpt_path=... "Ein Satz."``.

The command line only; what it does is :mod:`src.commands.translate`."""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from src.build import check_config, hydra_main
from src.commands.translate import split_arguments, translate
from src.utils.errors import reported_in_one_line

SENTENCES: list[str] = []  # the command line's sentences, taken out before Hydra parses it


@hydra_main("translate")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "translate")
        translate(cfg, SENTENCES)


if __name__ == "__main__":
    sys.argv[1:], SENTENCES[:] = split_arguments(sys.argv[1:])
    main()
