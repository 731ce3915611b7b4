"""The card of an exported file: a JSON record of what was exported and how well it matches."""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
from pathlib import Path
from typing import Any

import torch

from src.utils.files import write_json


def versions() -> dict[str, str]:
    """Versions of the libraries that wrote and checked the file."""
    found = {"torch": torch.__version__, "python": platform.python_version()}
    for name in ("onnx", "onnxruntime", "onnxscript"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def write_card(path: str | Path, card: dict[str, Any]) -> Path:
    """Write ``card`` with the date and the library versions to ``path`` (whole or not at all)."""
    stamped = {
        **card,
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
    }
    return write_json(path, stamped)
