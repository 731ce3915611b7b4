"""Finding the official-implementation fixtures: ``$REFERENCE_DIR`` (default ../shared/reference).

Parity tests parametrize over :func:`fixtures`, which globs a family's folder, so any further
fixture of the same kind is checked too. Without the folder the tests skip, saying where they
looked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import ROOT


def reference_dir() -> Path:
    return Path(os.environ.get("REFERENCE_DIR", ROOT.parent / "shared" / "reference")).resolve()


def fixtures(family: str, pattern: str) -> list:
    """pytest params, one per ``<REFERENCE_DIR>/<family>/<pattern>`` file, or one skipped param."""
    folder = reference_dir() / family
    paths = sorted(folder.glob(pattern)) if folder.is_dir() else []
    if not paths:
        reason = (
            f"no reference fixtures {family}/{pattern} under {reference_dir()}; "
            "set REFERENCE_DIR to the folder holding the official-implementation fixtures"
        )
        return [pytest.param(None, id=f"{family}-absent", marks=pytest.mark.skip(reason=reason))]
    return [pytest.param(path, id=path.stem) for path in paths]


def load(path: Path) -> dict[str, Any]:
    """A fixture file: tensors and Python primitives only."""
    return torch.load(path, map_location="cpu", weights_only=True)
