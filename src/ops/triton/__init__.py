"""Fused Triton kernels of the ops, and the rule that picks them.

Each op takes ``impl="auto" | "reference" | "triton"``. ``auto`` runs the kernel on CUDA tensors
when Triton is importable and the PyTorch reference everywhere else; ``triton`` forces the kernel
(on CPU tensors it needs ``TRITON_INTERPRET=1``, which the tests use); ``reference`` forces PyTorch.
"""

from __future__ import annotations

import importlib.util
import os

from torch import Tensor

IMPLS = ("auto", "reference", "triton")


def triton_available() -> bool:
    """Whether the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def check_impl(impl: str) -> str:
    """Validate an ``impl`` argument; returns it."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl


def use_triton(impl: str, x: Tensor) -> bool:
    """Resolve ``impl`` for input ``x``: True to run the Triton kernel, False for the reference."""
    if check_impl(impl) == "reference":
        return False
    if impl == "triton":
        if not triton_available():
            raise RuntimeError("impl='triton' but the triton package is not installed")
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("impl='triton' on a CPU tensor needs TRITON_INTERPRET=1")
        return True
    return x.is_cuda and triton_available()
