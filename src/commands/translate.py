"""Translate sentences with a trained model: ``python translate.py ckpt_path=... "Ein Satz."``.

Arguments that are not ``key=value`` overrides are source sentences; ``input=<file>`` (``-`` for
stdin) adds one sentence a line, decoded as ``encoding=`` (UTF-8 by default). The datamodule, network and task are rebuilt from the
checkpoint's run record (command-line overrides such as ``task.beam_size=5`` win) and its weights
loaded; without ``ckpt_path`` the run is refused unless ``allow_random=true``. Each translation is
written to stdout on its own line, in the order of the sources; a blank source (empty or white
space only) gives a blank line, so the output stays aligned with the input line for line.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import torch
from omegaconf import DictConfig

from src.build import build_from_checkpoint
from src.datamodules.text_files import decode_text, read_text
from src.datamodules.translation import TranslationDataModule
from src.utils.errors import InputFileError, UsageError, WrongRunError
from src.utils.progress import Progress

log = logging.getLogger("translate")  # the command's name in its log lines

DECODINGS = ("beam", "greedy")
# a Hydra override: optional +/~/++ prefix, a dotted key, "=" (sentences rarely look like this)
OVERRIDE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w.@/-]*=")
# only these end a line: str.splitlines also breaks at form feeds, U+2028 and the like, which would
# split a sentence and shift every later output line against its input line
LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra arguments, source sentences) of a command line (without the program name)."""
    hydra_args, sentences = [], []
    for argument in argv:
        (hydra_args if OVERRIDE.match(argument) or argument.startswith("-") else sentences).append(
            argument
        )
    return hydra_args, sentences


def split_lines(text: str) -> list[str]:
    """The lines of ``text``; a line break at the end ends the last line and starts no new one."""
    lines = LINE_BREAK.split(text)
    if lines[-1] == "":
        lines.pop()
    return lines


def read_sources(cfg: DictConfig, sentences: list[str]) -> list[str]:
    """The command line's sentences, then the lines of ``cfg.input`` decoded as ``cfg.encoding``,
    blank ones included."""
    sources = list(sentences)
    if cfg.input is not None:
        if cfg.input == "-":
            # the bytes, not sys.stdin's text: that is decoded in the locale's encoding
            sources += split_lines(
                decode_text(sys.stdin.buffer.read(), cfg.encoding, source="<stdin>", key="encoding")
            )
        else:
            path = Path(cfg.input)
            if not path.is_file():
                raise InputFileError(
                    f"input={cfg.input}: no such file (one source sentence a line)"
                )
            sources += split_lines(read_text(path, cfg.encoding, key="encoding"))
    if not any(s.strip() for s in sources):
        where = f"{len(sources)} source(s), all blank" if sources else "no source"
        if cfg.input is not None:
            where += f"; input={cfg.input} has {len(sources) - len(sentences)} line(s)"
        raise UsageError(
            f'nothing to translate ({where}): pass sentences ("Ein Satz.") or input=<file> with one '
            "sentence a line"
        )
    return sources


def exported_translator(path: str) -> torch.nn.Module:
    """The encoder and decoder-step graphs of an exported translation model, run by onnxruntime
    behind the interface the searches take (:class:`src.export.translate_onnx.OnnxTranslator`)."""
    from src.export.metadata import exported_file
    from src.export.runtime import kind_of
    from src.export.translate_onnx import OnnxTranslator

    kind = kind_of(exported_file(path))
    if kind != "translation":
        raise WrongRunError(f"translate.py runs exported translation models; onnx={path} holds a {kind} graph")
    return OnnxTranslator.from_export(exported_file(path))


def translate(cfg: DictConfig, sentences: list[str]) -> list[str]:
    """Translate ``sentences`` (and ``cfg.input``); prints and returns the translations."""
    if cfg.decoding not in DECODINGS:
        raise UsageError(f"decoding must be one of {DECODINGS}, got {cfg.decoding!r}")
    if cfg.batch_size < 1:
        raise UsageError(f"batch_size must be >= 1, got {cfg.batch_size}")
    sources = read_sources(cfg, sentences)
    if cfg.ckpt_path is None and cfg.get("onnx") is None and not cfg.allow_random:
        raise UsageError(
            "no weights: pass ckpt_path=<a translation run's .ckpt> (its metrics.json names the best one); "
            "allow_random=true translates with the randomly initialised network"
        )
    datamodule, task = build_from_checkpoint(cfg)
    if not isinstance(datamodule, TranslationDataModule):
        raise WrongRunError(
            f"translate.py needs a translation model; {cfg.ckpt_path or 'the config'} is a "
            f"{type(datamodule).__name__} run"
        )
    # blank sources are not translated: their output lines stay blank
    numbered = [(number, s) for number, s in enumerate(sources, start=1) if s.strip()]
    if len(numbered) < len(sources):
        log.info(
            "%d blank line(s) passed through as blank output lines", len(sources) - len(numbered)
        )
    limit = datamodule.max_positions["source"]
    encoded = [datamodule.encode_source(s) for _, s in numbered]
    for (number, _), ids in zip(numbered, encoded):
        if len(ids) > limit:
            raise UsageError(
                f"source {number} has {len(ids)} tokens (eos included), more than the model's maximum of "
                f"{limit} (data.max_source_positions); split it into shorter sentences"
            )
    device = torch.device(cfg.device)
    if cfg.get("onnx") is not None:
        task.net = exported_translator(cfg.onnx)
        device = torch.device("cpu")  # onnxruntime's CPU session reads and writes host memory
    task = task.to(device).eval()
    translations = [""] * len(sources)
    progress = Progress(f"translating ({cfg.decoding})", len(encoded))
    with torch.no_grad():
        for start in range(0, len(encoded), cfg.batch_size):
            chunk = encoded[start : start + cfg.batch_size]
            src = torch.nn.utils.rnn.pad_sequence(
                chunk, batch_first=True, padding_value=datamodule.padding_idx
            )
            for (number, _), tokens in zip(
                numbered[start:], task.translate(src.to(device), cfg.decoding)
            ):
                translations[number - 1] = datamodule.decode(tokens.tolist())
            progress.step(len(chunk))
    progress.done()
    sys.stdout.write("".join(f"{t}\n" for t in translations))
    return translations
