"""Translate sentences with a trained model: ``python translate.py ckpt_path=... "Ein Satz."``.

Arguments that are not ``key=value`` overrides are source sentences; ``input=<file>`` (``-`` for
stdin) adds one sentence a line, decoded as ``encoding=`` (UTF-8 by default). The datamodule,
network and task are rebuilt from the checkpoint's run record (command-line overrides such as
``task.beam_size=5`` win) and its weights loaded; without ``ckpt_path`` the run is refused unless
``allow_random=true``. Each translation is written to stdout on its own line, in the order of the
sources; a blank source (empty or white space only) gives a blank line, so the output stays
aligned with the input line for line.

A source longer than the model's maximum (``data.max_source_positions`` tokens, eos included) is
split after sentence ends into pieces that fit, and a sentence still too long is truncated
(:mod:`src.decoding.source_pieces`); the pieces are translated apart and their translations joined
by spaces on the source's one output line. Characters (SentencePiece corpora) or tokens (BPE
corpora) outside the source vocabulary are read as ``<unk>``. Both are warned about with the
source's place (``sentence 2``, ``<file>:<line>``) and counted in a closing log line.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import torch
from omegaconf import DictConfig

from src.build import build_from_checkpoint, check_served
from src.datamodules.text_files import decode_text, read_text
from src.decoding.source_pieces import FittedSource, fit_source
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
            f"nothing to translate ({where}): "
            'pass sentences ("Ein Satz.") or input=<file> with one sentence a line'
        )
    return sources


def source_label(cfg: DictConfig, number: int, num_arguments: int) -> str:
    """Where source ``number`` (1-based, the command line's sentences first) comes from:
    ``sentence 2`` or ``<input file>:<line>``."""
    if number <= num_arguments:
        return f"sentence {number}"
    return f"{'<stdin>' if cfg.input == '-' else cfg.input}:{number - num_arguments}"


def check_vocabulary(where: str, unknown: list[str]) -> bool:
    """Warn about what of a source the vocabulary lacks: it is read as ``<unk>``, which the model
    never saw in training, so that part of the sentence is lost or mistranslated. Returns whether
    there was any."""
    if unknown:
        shown = ", ".join(
            f"{u!r} (U+{ord(u):04X})" if len(u) == 1 else repr(u) for u in unknown[:10]
        )
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        log.warning(
            "%s: not in the model's source vocabulary, read as <unk> (their words will be missing "
            "or wrong in the translation): %s%s",
            where,
            shown,
            more,
        )
    return bool(unknown)


def report_length(where: str, fitted: FittedSource, limit: int) -> None:
    """Warn about a source longer than the model's maximum (``data.max_source_positions``)."""
    if len(fitted.pieces) == 1 and not fitted.truncated:
        return
    how = []
    if fitted.split:
        how.append(f"translated in {len(fitted.pieces)} pieces split at sentence ends")
    if fitted.truncated:
        how.append(
            f"{fitted.truncated} token(s) cut off the end of over-long sentences and not translated"
        )
    log.warning(
        "%s: %d tokens (eos included), more than the model's maximum of %d "
        "(data.max_source_positions): %s",
        where,
        fitted.num_tokens,
        limit,
        "; ".join(how),
    )


def summarise(fitted: list[FittedSource], limit: int, num_unknown: int) -> None:
    """Log lines counting the sources over the maximum length (split, truncated) and those with
    characters or tokens outside the vocabulary."""
    if num_unknown:
        log.warning(
            "%d of %d source(s) have characters or tokens outside the vocabulary (read as <unk>)",
            num_unknown,
            len(fitted),
        )
    long = [f for f in fitted if f.split or f.truncated]
    if long:
        log.warning(
            "%d of %d source(s) longer than %d tokens: %d split at sentence ends, %d truncated "
            "(their end not translated)",
            len(long),
            len(fitted),
            limit,
            sum(f.split and not f.truncated for f in long),
            sum(bool(f.truncated) for f in long),
        )


def exported_translator(path: str) -> torch.nn.Module:
    """The encoder and decoder-step graphs of an exported translation model, run by onnxruntime
    behind the interface the searches take (:class:`src.export.translate_onnx.OnnxTranslator`)."""
    from src.export.metadata import exported_file
    from src.export.runtime import kind_of
    from src.export.translate_onnx import OnnxTranslator

    kind = kind_of(exported_file(path))
    if kind != "translation":
        raise WrongRunError(
            f"translate.py runs exported translation models; onnx={path} holds a {kind} graph"
        )
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
            "no weights: pass ckpt_path=<a translation run's .ckpt> (its metrics.json names the "
            "best one); allow_random=true translates with the randomly initialised network"
        )
    datamodule, task = build_from_checkpoint(cfg)
    check_served("translate.py", cfg, datamodule, task)
    if cfg.get("onnx") is not None:  # the vocabulary the file carries: no corpus is read
        from src.export.vocabulary import use_exported_vocabulary

        use_exported_vocabulary(datamodule, cfg.onnx)
    # blank sources are not translated: their output lines stay blank
    numbered = [(number, s) for number, s in enumerate(sources, start=1) if s.strip()]
    if len(numbered) < len(sources):
        log.info(
            "%d blank line(s) passed through as blank output lines", len(sources) - len(numbered)
        )
    limit = datamodule.max_positions["source"]
    fitted, num_unknown = [], 0
    for number, source in numbered:
        where = source_label(cfg, number, len(sentences))
        num_unknown += check_vocabulary(where, datamodule.unknown_source(source))
        fitted.append(fit_source(source, datamodule.encode_source, limit))
        report_length(where, fitted[-1], limit)
    # every piece is translated on its own; a line's translation joins its pieces' in order
    pieces = [(number, ids) for (number, _), f in zip(numbered, fitted) for ids in f.pieces]
    device = torch.device(cfg.device)
    if cfg.get("onnx") is not None:
        task.net = exported_translator(cfg.onnx)
        device = torch.device("cpu")  # onnxruntime's CPU session reads and writes host memory
    task = task.to(device).eval()
    parts: list[list[str]] = [[] for _ in sources]
    progress = Progress(f"translating ({cfg.decoding})", len(pieces))
    with torch.no_grad():
        for start in range(0, len(pieces), cfg.batch_size):
            chunk = pieces[start : start + cfg.batch_size]
            src = torch.nn.utils.rnn.pad_sequence(
                [ids for _, ids in chunk], batch_first=True, padding_value=datamodule.padding_idx
            )
            for (number, _), tokens in zip(chunk, task.translate(src.to(device), cfg.decoding)):
                parts[number - 1].append(datamodule.decode(tokens.tolist()))
            progress.step(len(chunk))
    progress.done()
    summarise(fitted, limit, num_unknown)
    translations = [" ".join(p for p in line if p) for line in parts]
    sys.stdout.write("".join(f"{t}\n" for t in translations))
    return translations
