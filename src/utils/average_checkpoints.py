"""Average the weights of several checkpoints of one run (fairseq's ``average_checkpoints.py``).

Wu et al. (2019) evaluate IWSLT'14 with the mean of the last 10 epoch checkpoints (spec Sec. 6.5;
the official DeLighT README evaluates ``checkpoint_best.pt`` without averaging)::

    python -m src.utils.average_checkpoints OUT.ckpt IN1.ckpt IN2.ckpt ...
    python -m src.utils.average_checkpoints OUT.ckpt --last 10 RUN/checkpoints [--by epoch]

The output is the newest input (its run record, epoch and step: ``eval.py`` and ``translate.py``
rebuild the network from it) with the averaged ``state_dict``, without optimiser and scheduler
states, and with the averaged files' names under ``"averaged_from"``. It is written to a temporary
file and renamed, so an interrupted run never leaves half a checkpoint.

Keeping epoch checkpoints to average needs a ModelCheckpoint that keeps them (``save_top_k``).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from src.utils.checkpoint_io import AtomicCheckpointIO
from src.utils.state_dicts import torch_load

log = logging.getLogger(__name__)

DROPPED = ("optimizer_states", "lr_schedulers")  # training state that does not fit an average
EPOCH_IN_NAME = re.compile(r"epoch[=_-]?(\d+)")  # epoch003.ckpt, epoch=3-step=120.ckpt


def _load(path: Path) -> dict[str, Any]:
    """A Lightning checkpoint with its tensors on the CPU; its optimiser and scheduler states are
    dropped at once (they can be twice the weights)."""
    checkpoint = torch_load(path, "checkpoint")
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), Mapping):
        raise ValueError(f"{path} is not a Lightning checkpoint (no 'state_dict')")
    for key in DROPPED:
        checkpoint.pop(key, None)
    for key, value in checkpoint["state_dict"].items():
        if not isinstance(value, Tensor):
            raise ValueError(
                f"{path}: state_dict[{key!r}] is a {type(value).__name__}, not a tensor"
            )
    return checkpoint


def _age(checkpoint: Mapping[str, Any], path: Path) -> tuple[int, int, float]:
    """Sort key of the newest input: Lightning's ``global_step``, then ``epoch``, then the file's
    modification time."""
    return (
        int(checkpoint.get("global_step", -1)),
        int(checkpoint.get("epoch", -1)),
        path.stat().st_mtime,
    )


def _check_layout(
    first: Path,
    layout: Mapping[str, tuple[torch.Size, torch.dtype]],
    path: Path,
    state: Mapping[str, Tensor],
) -> None:
    """Raise naming both files when ``state`` has other keys, shapes or dtypes than ``layout``."""
    missing = sorted(layout.keys() - state.keys())
    extra = sorted(state.keys() - layout.keys())
    if missing or extra:
        raise ValueError(
            f"{first} and {path} hold different tensors: {len(missing)} only in {first.name} "
            f"{missing[:3]}, {len(extra)} only in {path.name} {extra[:3]}"
        )
    for key, (shape, dtype) in layout.items():
        if (state[key].shape, state[key].dtype) != (shape, dtype):
            raise ValueError(
                f"{key}: {tuple(shape)} {dtype} in {first} but {tuple(state[key].shape)} "
                f"{state[key].dtype} in {path}"
            )


def _aliases(state: Mapping[str, Tensor]) -> dict[str, str]:
    """Each key whose tensor is a view of the same memory as an earlier key's (tied weights) ->
    that earlier key."""
    seen: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    aliases = {}
    for key, value in state.items():
        signature = (
            value.untyped_storage().data_ptr(),
            value.storage_offset(),
            tuple(value.shape),
            value.stride(),
        )
        if signature in seen:
            aliases[key] = seen[signature]
        else:
            seen[signature] = key
    return aliases


def _average(paths: Sequence[str | Path]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The averaged state dict and the newest checkpoint's other entries."""
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint, got none")
    paths = [Path(p) for p in paths]
    first = paths[0]
    sums: dict[str, Tensor] = {}
    layout: dict[str, tuple[torch.Size, torch.dtype]] = {}
    fixed: dict[str, Tensor] = {}  # integer and bool tensors, which must agree
    aliases: dict[str, str] = {}
    newest: dict[str, Any] = {}
    newest_age: tuple[int, int, float] | None = None
    for path in paths:
        checkpoint = _load(path)
        state = checkpoint.pop("state_dict")
        if not layout:
            layout = {key: (value.shape, value.dtype) for key, value in state.items()}
            aliases = _aliases(state)
        else:
            _check_layout(first, layout, path, state)
        for key, value in state.items():
            if key in aliases:
                continue
            if value.is_floating_point():
                # float64 sums: float16 weights would overflow and float32 ones lose the low bits
                if key in sums:
                    sums[key] += value.double()
                else:
                    sums[key] = value.to(torch.float64, copy=True)
            elif key not in fixed:
                fixed[key] = value
            elif not torch.equal(fixed[key], value):
                raise ValueError(
                    f"{key} is an integer tensor and differs between {first} and {path}; only "
                    "floating-point tensors are averaged"
                )
        age = _age(checkpoint, path)
        if newest_age is None or age >= newest_age:
            newest, newest_age = checkpoint, age
    averaged = {key: (total / len(paths)).to(layout[key][1]) for key, total in sums.items()}
    averaged.update(fixed)
    for key, target in aliases.items():
        averaged[key] = averaged[target]  # tied weights stay one tensor
    return {key: averaged[key] for key in layout}, newest


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Tensor]:
    """The mean of the checkpoints' ``state_dict`` entries.

    Floating-point tensors are summed in float64 and cast back to their dtype; integer and bool
    tensors (step counters) must be equal in every file and are kept. Files must hold the same
    keys with the same shapes and dtypes, or a ``ValueError`` names both files and the key.
    Tensors tied in the first file (one memory) are one tensor in the result.

    Shape:
        every entry keeps its shape and dtype
    """
    return _average(paths)[0]


def write_average(out: str | Path, paths: Sequence[str | Path]) -> dict[str, Any]:
    """Write the averaged checkpoint to ``out`` (atomically) and return it: the newest input
    (largest ``global_step``, then epoch, then modification time) with the averaged
    ``state_dict``, no optimiser or scheduler states, and ``averaged_from``: the inputs' names."""
    state, checkpoint = _average(paths)
    checkpoint["state_dict"] = state
    checkpoint["averaged_from"] = [Path(p).name for p in paths]
    AtomicCheckpointIO().save_checkpoint(checkpoint, out)
    return checkpoint


def last_checkpoints(
    directory: str | Path, count: int, by: str = "mtime", exclude: str | Path | None = None
) -> list[Path]:
    """The ``count`` newest ``*.ckpt`` files of ``directory``, oldest first.

    ``by="mtime"`` orders by modification time and skips Lightning's ``last*.ckpt`` copies (they
    repeat an epoch's weights); ``by="epoch"`` takes the files with an epoch number in the name
    (``epoch003.ckpt``, ``epoch=3-step=120.ckpt``) in epoch order. ``exclude`` (the output file)
    is never picked.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"--last needs a directory of checkpoints, got {directory}")
    if count < 1:
        raise ValueError(f"--last needs a count >= 1, got {count}")
    skip = Path(exclude).resolve() if exclude is not None else None
    files = [
        p for p in directory.glob("*.ckpt") if p.resolve() != skip and not p.name.startswith(".")
    ]
    if by == "mtime":
        ranked = sorted(
            (p for p in files if not p.name.startswith("last")),
            key=lambda p: (p.stat().st_mtime, p.name),
        )
    elif by == "epoch":
        epochs = {p: EPOCH_IN_NAME.search(p.stem) for p in files}
        ranked = sorted(
            (p for p, match in epochs.items() if match),
            key=lambda p: (int(epochs[p].group(1)), p.stat().st_mtime),
        )
    else:
        raise ValueError(f"by must be 'mtime' or 'epoch', got {by!r}")
    if len(ranked) < count:
        raise ValueError(
            f"{directory} has {len(ranked)} checkpoints to choose from by {by} "
            f"({[p.name for p in ranked]}), fewer than the {count} asked for"
        )
    return ranked[-count:]


def main(argv: Sequence[str] | None = None) -> int:
    """Average the given checkpoints (or a directory's last N) into OUT; 0 on success, 1 with
    the reason when the inputs cannot be averaged."""
    parser = argparse.ArgumentParser(
        prog="python -m src.utils.average_checkpoints",
        description="Average the weights of checkpoints of one run into a new checkpoint.",
    )
    parser.add_argument("out", type=Path, help="the averaged checkpoint to write")
    parser.add_argument(
        "inputs", nargs="+", type=Path, help="checkpoints, or with --last one directory"
    )
    parser.add_argument(
        "--last", type=int, metavar="N", help="average the N newest *.ckpt of the directory"
    )
    parser.add_argument(
        "--by",
        choices=("mtime", "epoch"),
        default="mtime",
        help="with --last: newest by modification time or by the epoch number in the name",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        if args.last is not None:
            if len(args.inputs) != 1:
                raise ValueError(f"--last takes one directory, got {len(args.inputs)} inputs")
            paths = last_checkpoints(args.inputs[0], args.last, args.by, exclude=args.out)
        else:
            paths = args.inputs
        write_average(args.out, paths)
    except (OSError, ValueError) as error:
        log.error("%s", error)
        return 1
    log.info("averaged %d checkpoints into %s: %s", len(paths), args.out, [p.name for p in paths])
    return 0


if __name__ == "__main__":
    sys.exit(main())
