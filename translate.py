"""Translate sentences with a trained model: ``python translate.py ckpt_path=... "Ein Satz."``.

Arguments that are not ``key=value`` overrides are source sentences; ``input=<file>`` (``-`` for
stdin) adds one sentence a line. The datamodule, network and task are rebuilt from the
checkpoint's run record (command-line overrides such as ``task.beam_size=5`` win) and its weights
loaded; without ``ckpt_path`` the run is refused unless ``allow_random=true``. Each translation is
written to stdout on its own line, in the order of the sources.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from src.datamodules.translation import TranslationDataModule
from train import build_from_checkpoint, check_config

log = logging.getLogger(__name__)

DECODINGS = ("beam", "greedy")
# a Hydra override: optional +/~/++ prefix, a dotted key, "=" (sentences rarely look like this)
OVERRIDE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w.@/-]*=")
SENTENCES: list[str] = []  # the command line's sentences, taken out before Hydra parses it


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra arguments, source sentences) of a command line (without the program name)."""
    hydra_args, sentences = [], []
    for argument in argv:
        (hydra_args if OVERRIDE.match(argument) or argument.startswith("-") else sentences).append(argument)
    return hydra_args, sentences


def read_sources(cfg: DictConfig, sentences: list[str]) -> list[str]:
    """The command line's sentences, then those of ``cfg.input``."""
    sources = list(sentences)
    if cfg.input is not None:
        if cfg.input == "-":
            sources += sys.stdin.read().splitlines()
        else:
            path = Path(cfg.input)
            if not path.is_file():
                raise FileNotFoundError(f"input={cfg.input}: no such file (one source sentence a line)")
            sources += path.read_text(encoding="utf-8").splitlines()
    if not sources or not all(s.strip() for s in sources):
        raise ValueError(
            'nothing to translate, or an empty line: pass sentences ("Ein Satz.") or input=<file> with '
            "one non-empty sentence a line"
        )
    return sources


def translate(cfg: DictConfig, sentences: list[str]) -> list[str]:
    """Translate ``sentences`` (and ``cfg.input``); prints and returns the translations."""
    if cfg.decoding not in DECODINGS:
        raise ValueError(f"decoding must be one of {DECODINGS}, got {cfg.decoding!r}")
    if cfg.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
    sources = read_sources(cfg, sentences)
    if cfg.ckpt_path is None and not cfg.allow_random:
        raise ValueError(
            "no weights: pass ckpt_path=<a translation run's .ckpt> (its metrics.json names the best one); "
            "allow_random=true translates with the randomly initialised network"
        )
    datamodule, task = build_from_checkpoint(cfg)
    if not isinstance(datamodule, TranslationDataModule):
        raise TypeError(
            f"translate.py needs a translation model; {cfg.ckpt_path or 'the config'} is a "
            f"{type(datamodule).__name__} run"
        )
    limit = datamodule.max_positions["source"]
    encoded = [datamodule.encode_source(s) for s in sources]
    for number, ids in enumerate(encoded, start=1):
        if len(ids) > limit:
            raise ValueError(
                f"source {number} has {len(ids)} tokens (eos included), more than the model's maximum of "
                f"{limit} (data.max_source_positions); split it into shorter sentences"
            )
    device = torch.device(cfg.device)
    task = task.to(device).eval()
    translations: list[str] = []
    with torch.no_grad():
        for start in range(0, len(encoded), cfg.batch_size):
            chunk = encoded[start : start + cfg.batch_size]
            src = torch.nn.utils.rnn.pad_sequence(chunk, batch_first=True, padding_value=datamodule.padding_idx)
            for tokens in task.translate(src.to(device), cfg.decoding):
                translations.append(datamodule.decode(tokens.tolist()))
    sys.stdout.write("".join(f"{t}\n" for t in translations))
    return translations


@hydra.main(version_base="1.3", config_path="conf", config_name="translate")
def main(cfg: DictConfig) -> None:
    check_config(cfg, "translate")
    translate(cfg, SENTENCES)


if __name__ == "__main__":
    sys.argv[1:], SENTENCES[:] = split_arguments(sys.argv[1:])
    main()
