"""Optional parts of the install: the embedded demo corpora and plots (``[demos]``), Weights &
Biases (``[wandb]``) and ONNX export (``[export]``) are extras, so the core install holds only what
the library and the default job need; ``[dev]`` includes them all. A missing extra stops with one
line naming the command that adds it."""

from __future__ import annotations

import importlib.metadata

from src.utils.errors import UserError


class MissingExtraError(UserError, ModuleNotFoundError):
    """An optional distribution that the requested feature needs is not installed."""


def require(distribution: str, extra: str, purpose: str) -> None:
    """Raise :class:`MissingExtraError` unless ``distribution`` (its name on the package index, e.g.
    ``scikit-image``) is installed. Checked through its metadata, so nothing is imported."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise MissingExtraError(
            f"{purpose} needs {distribution}, which the [{extra}] extra installs: "
            f"pip install -e '.[{extra}]' (or pip install {distribution})"
        ) from None
