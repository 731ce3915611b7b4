"""Translate sentences with a trained model: ``python translate.py ckpt_path=... "Ein Satz."``.

Arguments that are not ``key=value`` overrides are source sentences; ``input=<file>`` (``-`` for
stdin) adds one sentence a line, decoded as ``encoding=`` (UTF-8 by default). The datamodule, network and task are rebuilt from the
checkpoint's run record (command-line overrides such as ``task.beam_size=5`` win) and its weights
loaded; without ``ckpt_path`` the run is refused unless ``allow_random=true``. Each translation is
written to stdout on its own line, in the order of the sources; a blank source (empty or white
space only) gives a blank line, so the output stays aligned with the input line for line.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from src.build import check_config
from src.commands.translate import split_arguments, translate
from src.utils.errors import reported_in_one_line

SENTENCES: list[str] = []  # the command line's sentences, taken out before Hydra parses it


@hydra.main(version_base="1.3", config_path="conf", config_name="translate")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "translate")
        translate(cfg, SENTENCES)


if __name__ == "__main__":
    sys.argv[1:], SENTENCES[:] = split_arguments(sys.argv[1:])
    main()
