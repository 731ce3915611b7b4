"""Export a checkpoint for devices: ``python export.py ckpt_path=... [format=onnx|executorch]``.

The command line only; what it does is :mod:`src.commands.export`."""

from __future__ import annotations

from omegaconf import DictConfig

from src.build import check_config, hydra_main
from src.commands.export import export
from src.utils.errors import reported_in_one_line


@hydra_main("export")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "export")
        export(cfg)


if __name__ == "__main__":
    main()
