"""Finding the dataset files a run cannot read before it starts.

A file is bad when it is missing, unreadable, empty (0 bytes) or does not decode in full: each
image is decoded (``Image.load``), because ``Image.verify`` passes a JPEG cut short after its
header. The file-based image datamodules call :func:`screen_files` in ``setup()`` with their
``on_bad_file`` setting:

- ``"error"``: one :class:`BadFilesError` names every bad file (the first ``SHOWN`` in the message,
  all of them in ``<root>/bad_files.txt``) and the fix.
- ``"skip"``: the bad files are left out of the dataset, the count is logged and the list written
  to the same file.

The check may be capped in time (``max_seconds``); it then says how many files it decoded.
``python -m src.datamodules.check`` (:mod:`src.datamodules.check`) runs it alone, uncapped.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from time import monotonic

from PIL import Image, UnidentifiedImageError

from src.utils.errors import UserError
from src.utils.files import atomic_write_text

log = logging.getLogger(__name__)

ON_BAD_FILE = ("error", "skip")
LIST_NAME = "bad_files.txt"
SHOWN = 20  # bad files named in a message; the list file holds all of them

Reader = Callable[[Path], object]


class BadFilesError(UserError, ValueError):
    """Dataset files that are missing, unreadable, empty or do not decode."""


def check_on_bad_file(value: str) -> str:
    """``value`` if it is one of ``ON_BAD_FILE``, else ``ValueError`` naming the choices."""
    if value not in ON_BAD_FILE:
        raise ValueError(
            "on_bad_file must be 'error' (stop and name the bad files) or 'skip' (leave them "
            f"out), got {value!r}"
        )
    return value


def decode_image(path: Path) -> None:
    """Decode every pixel of ``path``; raises what PIL raises for a file it cannot decode."""
    with Image.open(path) as image:
        image.load()
        if min(image.size) < 1:
            raise ValueError(f"the image has {image.width}x{image.height} pixels")


def _reason(error: Exception) -> str:
    if isinstance(error, UnidentifiedImageError):  # its text repeats the path
        return "not an image file PIL can identify"
    return " ".join(f"{type(error).__name__}: {error}".split())  # one line, for the list file


def file_problem(path: Path, read: Reader = decode_image) -> str | None:
    """Why ``path`` cannot be used (missing, unreadable, empty, does not decode), or None."""
    try:
        size = path.stat().st_size
        with path.open("rb"):
            pass
    except OSError as error:
        return f"unreadable ({error.strerror or _reason(error)})"
    if size == 0:
        return "empty (0 bytes)"
    try:
        read(path)
    except (
        Exception
    ) as error:  # any decoder failure marks the file; the type name keeps a bug visible
        return f"does not decode ({_reason(error)})"
    return None


@dataclass(frozen=True)
class FileCheck:
    """The outcome of :func:`check_files`.

    Args:
        bad: path -> why it cannot be used, sorted by path.
        checked: files checked (the first ``checked`` of the sequence given).
        total: files given.
        seconds: time the check took.
        max_seconds: the time limit it ran under (None: none).
    """

    bad: dict[Path, str]
    checked: int
    total: int
    seconds: float
    max_seconds: float | None = None

    @property
    def complete(self) -> bool:
        return self.checked == self.total

    @property
    def scope(self) -> str:
        """ "the 6 files" or "the first 500 of 1000 files"."""
        return (
            f"the {self.total} files"
            if self.complete
            else f"the first {self.checked} of {self.total} files"
        )

    @property
    def stopped(self) -> str:
        """What an incomplete check left out and how to check it all."""
        return (
            f"the check stopped at its {self.max_seconds:g} s limit (data.check_max_seconds): "
            f"{self.total - self.checked} files were not decoded; "
            "python -m src.datamodules.check <the same data overrides> decodes them all"
        )


def check_files(
    paths: Sequence[Path],
    read: Reader = decode_image,
    *,
    max_seconds: float | None = None,
    workers: int = 1,
) -> FileCheck:
    """Check ``paths`` in order with ``read`` on ``workers`` threads, stopping once ``max_seconds``
    have passed (None: check all; 0: check none)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    start = monotonic()
    bad: dict[Path, str] = {}
    checked = 0
    chunk = 32 * workers  # the time limit is looked at between chunks
    with ThreadPoolExecutor(workers) as pool:  # PIL releases the GIL while it decodes
        while checked < len(paths):
            if max_seconds is not None and monotonic() - start >= max_seconds:
                break
            batch = paths[checked : checked + chunk]
            for path, problem in zip(batch, pool.map(partial(file_problem, read=read), batch)):
                if problem is not None:
                    bad[path] = problem
            checked += len(batch)
    return FileCheck(
        dict(sorted(bad.items())), checked, len(paths), monotonic() - start, max_seconds
    )


def write_bad_list(bad: Mapping[Path, str], root: Path) -> Path:
    """Write one ``path<TAB>why`` line per bad file to ``root/bad_files.txt``, or, where ``root``
    is read-only (shared dataset storage), to ``<tmp>/bad_files-<hash of root>.txt``; returns it."""
    text = "".join(f"{path}\t{why}\n" for path, why in bad.items())
    digest = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:12]
    targets = [Path(root) / LIST_NAME, Path(tempfile.gettempdir()) / f"bad_files-{digest}.txt"]
    for target in targets:
        try:
            atomic_write_text(target, text)  # whole or absent, also when several ranks write it
        except OSError:
            continue
        return target
    raise OSError(f"could not write the list of bad files to any of {[str(t) for t in targets]}")


def bad_files_message(report: FileCheck, root: Path, listing: Path) -> str:
    """The one error message naming the first ``SHOWN`` bad files, the list file and the fix."""
    lines = [f"{len(report.bad)} of {report.scope} under {root} cannot be used:"]
    lines += [f"    {path}: {why}" for path, why in list(report.bad.items())[:SHOWN]]
    if len(report.bad) > SHOWN:
        lines.append(f"    ... and {len(report.bad) - SHOWN} more")
    lines.append(f"All {len(report.bad)} are listed in {listing}.")
    lines.append(
        "Remove or replace these files, or set data.on_bad_file=skip to leave them out of the "
        "dataset."
    )
    if not report.complete:
        lines.append(f"Note: {report.stopped}.")
    return "\n".join(lines)


def screen_files(
    paths: Iterable[Path],
    root: Path,
    *,
    on_bad_file: str,
    read: Reader = decode_image,
    max_seconds: float | None = None,
    workers: int = 1,
) -> frozenset[Path]:
    """Check ``paths`` (files of the dataset at ``root``) and act on the bad ones: raise
    :class:`BadFilesError` naming them all (``on_bad_file="error"``) or return them, to be left
    out of the dataset (``"skip"``). The list is written to a file either way
    (:func:`write_bad_list`).
    """
    check_on_bad_file(on_bad_file)
    report = check_files(list(paths), read, max_seconds=max_seconds, workers=workers)
    if not report.complete:
        log.warning("%s: decoded %s; %s", root, report.scope, report.stopped)
    if not report.bad:
        log.info("%s: %d files decoded in %.1f s, none bad", root, report.checked, report.seconds)
        return frozenset()
    listing = write_bad_list(report.bad, root)
    if on_bad_file == "error":
        raise BadFilesError(bad_files_message(report, root, listing))
    log.warning(
        "%s: leaving out %d bad files of %s (data.on_bad_file=skip); they are listed in %s",
        root, len(report.bad), report.scope, listing,
    )  # fmt: skip
    return frozenset(report.bad)
