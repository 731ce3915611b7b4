"""Imports go one way: ops -> models -> tasks -> entry points; datamodules stand alone; src has no
Hydra, except the one command that lives there (``python -m src.datamodules.check``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

# package -> src packages it must not import
FORBIDDEN = {
    "ops": {"models", "tasks", "datamodules", "callbacks"},
    "models": {"tasks", "datamodules", "callbacks"},
    "datamodules": {"ops", "models", "tasks", "callbacks"},
    "tasks": {"datamodules"},
    "callbacks": {"models", "tasks", "datamodules"},
    "utils": {"ops", "models", "tasks", "datamodules", "callbacks"},
}

# commands run with ``python -m``: like the root entry points, they compose configs with Hydra
COMMANDS = {ROOT / "src" / "datamodules" / "check.py"}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_direction(package: str) -> None:
    for path in (ROOT / "src" / package).rglob("*.py"):
        for name in imported_modules(path):
            parts = name.split(".")
            assert parts[0] != "hydra" or path in COMMANDS, f"{path} imports Hydra; only the entry points may"
            assert name != "src.datamodules.check", f"{path} imports the check command (and so Hydra)"
            if parts[0] == "src" and len(parts) > 1:
                assert parts[1] not in FORBIDDEN[package], f"{path} imports {name}"
