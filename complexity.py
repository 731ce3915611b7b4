"""Parameters and MACs of a network: ``python complexity.py model=... [data=...] [model.x=...]``.

The command line only; what it does is :mod:`src.commands.complexity`."""

from __future__ import annotations

import json
import sys

from omegaconf import DictConfig

from src.build import check_config, hydra_main
from src.commands.complexity import report, table
from src.utils.errors import reported_in_one_line


@hydra_main("complexity")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "complexity")
        result = report(cfg)
    sys.stdout.write(table(result) + "\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
