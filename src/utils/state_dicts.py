"""State dicts in files: loading one with a clear error, telling how one differs from a network's,
and the network entries of a Lightning checkpoint of this project."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

NET_PREFIX = "net."  # a task checkpoint's network entries (the task holds the network as ``net``)


def mismatch_summary(expected: Mapping[str, Tensor], state: Mapping[str, Tensor]) -> str | None:
    """A few lines on how ``state`` differs from ``expected`` (counts and the first of each
    kind), or None when keys and shapes agree. Never a dump of every key."""
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    mismatched = [
        f"{key}: file {tuple(state[key].shape)} vs network {tuple(value.shape)}"
        for key, value in expected.items()
        if key in state and getattr(state[key], "shape", None) != value.shape
    ]
    lines = []
    if mismatched:
        lines.append(f"{len(mismatched)} tensors differ in shape (first: {mismatched[0]})")
    if missing:
        lines.append(
            f"{len(missing)} of the network's tensors are not in the file (first: {missing[0]})"
        )
    if unexpected:
        lines.append(
            f"{len(unexpected)} of the file's tensors are not in the network "
            f"(first: {unexpected[0]})"
        )
    return "; ".join(lines) if lines else None


def project_network_state(checkpoint: object) -> dict[str, Tensor] | None:
    """The network entries (``net.*``, prefix removed) of a Lightning checkpoint of this project,
    or None when ``checkpoint`` is not one."""
    if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("state_dict"), Mapping):
        return None
    state = checkpoint["state_dict"]
    if not any(key.startswith(NET_PREFIX) for key in state):
        return None
    return {k.removeprefix(NET_PREFIX): v for k, v in state.items() if k.startswith(NET_PREFIX)}


def first_sentences(text: str, limit: int = 240) -> str:
    """The whole sentences of ``text``'s first line that fit in ``limit`` characters (at least the
    first, cut at a word with "..." only when it alone is longer): a reason quoted in a message
    never stops mid-sentence."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    sentences = line.replace(". ", ".\n").split("\n")
    kept = sentences[0]
    for sentence in sentences[1:]:
        if len(kept) + 1 + len(sentence) > limit:
            break
        kept += " " + sentence
    if len(kept) > limit:
        kept = kept[:limit].rsplit(" ", 1)[0] + "..."
    return kept


def torch_load(path: str | Path, what: str) -> object:
    """``torch.load(path, weights_only=True)`` on the CPU; a file that is missing or that torch
    cannot read (a text file, a truncated download) raises ``ValueError`` naming ``what`` (the
    setting the path came from) and the path, never a bare unpickling error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what}={path}: no such file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (
        Exception
    ) as error:  # unpickling a text file fails in many ways (KeyError, EOFError, ...)
        reason = first_sentences(str(error))
        raise ValueError(
            f"{what}={path} is not a weights file or checkpoint: torch.load cannot read it "
            f"({type(error).__name__}{': ' + reason if reason else ''})"
        ) from None
