"""Check a dataset before training: ``python -m src.datamodules.check data=... [data.root=...]``.

The train config is composed with the given overrides, as ``train.py`` composes it, and the data
module's ``prepare_data`` and ``setup`` run with the time cap off (``--max-seconds`` sets one):
image datasets decode every file (:mod:`src.datamodules.bad_files`), the character corpora check
their archives and caches. Exits 1 naming every bad file, 2 when the config lacks a value, 0 when
the data is usable. The one command under ``src/``, so the one module there that imports Hydra
(``tests/test_imports.py`` allows it); the datamodules import :mod:`src.datamodules.bad_files`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

CONF = Path(__file__).resolve().parents[2] / "conf"


def compose_data_config(overrides: Sequence[str]) -> DictConfig:
    """``cfg.data`` of ``conf/train.yaml`` composed with ``overrides``, as ``train.py`` sees it."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # hydra.runtime.* as a run sees it (paths.output_dir)
    return cfg.data


def main(argv: Sequence[str] | None = None) -> int:
    """Check the dataset the overrides select; 0 when no bad file was found (or they are skipped:
    ``data.on_bad_file=skip``), 1 naming what is bad, 2 for an incomplete config."""
    parser = argparse.ArgumentParser(
        prog="python -m src.datamodules.check",
        description="Decode every file of a dataset before training; name every bad one.",
    )
    parser.add_argument(
        "overrides", nargs="*", help="train config overrides: data=image_folder data.root=/path"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        help="stop decoding after this long (default: never; data.check_max_seconds is not used)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    data = compose_data_config(args.overrides)
    if "check_max_seconds" in data:
        data.check_max_seconds = args.max_seconds
    if "num_classes" in data.keys() and OmegaConf.is_missing(
        data, "num_classes"
    ):  # `in` skips ??? values
        data.num_classes = None  # the check needs no class count; the folders give it
    missing = [key for key in data if OmegaConf.is_missing(data, key)]
    if missing:
        log.error("the data config needs %s", " ".join(f"data.{key}=..." for key in missing))
        return 2
    datamodule = instantiate(data)
    try:
        datamodule.prepare_data()
        datamodule.setup()
    except (OSError, ValueError, zipfile.BadZipFile) as error:  # BadFilesError is a ValueError
        log.error("%s: %s", type(error).__name__, error)
        return 1
    log.info("%s at %s: no bad files found", type(datamodule).__name__, data.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
