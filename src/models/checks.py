"""Checks of the networks' constructor arguments, raising ``ValueError`` with the bad values."""

from __future__ import annotations


def check_dropout(**values: float) -> None:
    """Raise ``ValueError`` at the first dropout probability (passed as ``name=p``) outside
    [0, 1)."""
    for name, p in values.items():
        if not 0.0 <= p < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {p}")
