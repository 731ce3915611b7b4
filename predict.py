"""Predict on one image: ``python predict.py image=/path/to.jpg ckpt_path=... [overrides]``.

The command line only; what it does is :mod:`src.commands.predict`."""

from __future__ import annotations

from omegaconf import DictConfig

from src.build import check_config, hydra_main
from src.commands.predict import predict
from src.utils.errors import reported_in_one_line


@hydra_main("predict")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "predict")
        predict(cfg)


if __name__ == "__main__":
    main()
