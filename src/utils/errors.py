"""Mistakes in what a user asked for, and how the command-line tools report them.

A :class:`UserError` (a config that cannot run, data that cannot be read, a checkpoint that does not
fit) carries a message that names the problem and the fix. The tools (``train.py``, ``eval.py``,
...) print such a message on stderr and exit with status 2, without a traceback, which
only adds frames of the project's plumbing to a message that is already complete;
``HYDRA_FULL_ERROR=1`` (Hydra's own switch for full tracebacks) raises it as it is. Any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

log = logging.getLogger(__name__)

DEBUG_ENV = "HYDRA_FULL_ERROR"
EXIT_STATUS = 2  # as argparse's usage errors


class UserError(Exception):
    """A mistake in the config, the data or a checkpoint; the message names the fix."""


class UsageError(UserError, ValueError):
    """A tool's option (``translate.py``, ``generate.py``, ``predict.py``) that cannot work as
    given."""


class InputFileError(UserError, FileNotFoundError):
    """A tool's input file that is not there."""


class DataNotFoundError(UserError, FileNotFoundError):
    """A dataset's files that are not where ``data.root`` points; the message names the path, the
    expected layout and where to get the data."""


class WrongRunError(UserError, TypeError):
    """A checkpoint of another kind of run than the tool serves (an image classifier given to
    ``generate.py``)."""


def user_error_of(error: BaseException) -> UserError | None:
    """``error`` or the :class:`UserError` that caused it: Hydra's ``instantiate`` wraps what a
    constructor raises in an ``InstantiationException`` (``raise ... from``)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


@contextlib.contextmanager
def reported_in_one_line() -> Iterator[None]:
    """Inside the block, a :class:`UserError` (or an exception it caused) ends the process with
    its message on one line and exit status 2 (module docstring)."""
    try:
        yield
    except Exception as error:
        cause = user_error_of(error)
        if cause is None or os.environ.get(DEBUG_ENV) == "1":
            raise
        print(f"error: {cause}", file=sys.stderr, flush=True)
        log.debug("stopped by %s", type(cause).__name__)
        raise SystemExit(EXIT_STATUS) from None
