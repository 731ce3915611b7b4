"""The ``LIGHTNETS_*`` environment variables that steer the ops' paths, read in this one place.

- ``LIGHTNETS_CHOICES``: the file of the measured choices (:func:`choices_file`); ``0``: none.
- ``LIGHTNETS_CPU_KERNELS``: which CPU paths run (:func:`cpu_path_mode`): ``auto`` (unset) the
  faster of the project's path and ATen's, measured per shape where the winner depends on the
  machine; ``1`` the project's paths, nothing timed; ``0`` ATen's, nothing built.
- ``LIGHTNETS_GLT_WGRAD``: the GLT weight gradient's method (:func:`glt_weight_grad`): ``auto``
  (unset), ``splitk`` or ``bmm``.
- ``LIGHTNETS_PRU_GEMM``: the C++ PRU recurrence's products (:func:`pru_gemm`): ``plain`` or
  ``packed`` without the machine's check, ``0`` the PyTorch loop.

Each is checked when read: a value that names nothing raises ``ValueError`` listing the valid ones.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

CHOICES_ENV = "LIGHTNETS_CHOICES"
CPU_KERNELS_ENV = "LIGHTNETS_CPU_KERNELS"
GLT_WEIGHT_GRAD_ENV = "LIGHTNETS_GLT_WGRAD"
PRU_GEMM_ENV = "LIGHTNETS_PRU_GEMM"

PATH_MODES = ("auto", "1", "0")
GLT_WEIGHT_GRAD_METHODS = ("auto", "splitk", "bmm")
PRU_GEMM_MODES = ("plain", "packed", "0")


def choices_file() -> str | None:
    """``LIGHTNETS_CHOICES`` as set (a path, or ``"0"``), None when unset or empty."""
    return os.environ.get(CHOICES_ENV) or None


_mode: str | None = None  # LIGHTNETS_CPU_KERNELS, read once: the ops ask on every call


def cpu_path_mode() -> str:
    """``LIGHTNETS_CPU_KERNELS``: ``"auto"`` (unset), ``"1"`` or ``"0"`` (module docstring), read
    on the first call; :func:`use_cpu_paths` changes it for a while."""
    global _mode
    if _mode is None:
        mode = os.environ.get(CPU_KERNELS_ENV) or "auto"
        if mode not in PATH_MODES:
            raise ValueError(
                f"{CPU_KERNELS_ENV}={mode!r} is not a CPU path mode: use auto (the faster of the "
                f"project's path and ATen's, measured per shape), 1 (the project's paths, nothing "
                f"timed) or 0 (ATen's paths)"
            )
        _mode = mode
    return _mode


def cpu_kernels_disabled() -> bool:
    """Whether ``LIGHTNETS_CPU_KERNELS=0`` is set in the environment now: the C++ kernels are then
    not even built."""
    return os.environ.get(CPU_KERNELS_ENV) == "0"


@contextlib.contextmanager
def use_cpu_paths(mode: str) -> Iterator[None]:
    """Within the context, the CPU paths of ``mode`` (as ``LIGHTNETS_CPU_KERNELS``): to time the
    project's paths against ATen's in one process."""
    global _mode
    if mode not in PATH_MODES:
        raise ValueError(f"mode must be one of {PATH_MODES}, got {mode!r}")
    previous, _mode = _mode, mode
    try:
        yield
    finally:
        _mode = previous


def glt_weight_grad() -> str:
    """``LIGHTNETS_GLT_WGRAD``: ``"auto"`` (unset), ``"splitk"`` or ``"bmm"``."""
    method = os.environ.get(GLT_WEIGHT_GRAD_ENV) or "auto"
    if method not in GLT_WEIGHT_GRAD_METHODS:
        raise ValueError(
            f"{GLT_WEIGHT_GRAD_ENV}={method!r}; choose {', '.join(GLT_WEIGHT_GRAD_METHODS[:-1])} "
            f"or {GLT_WEIGHT_GRAD_METHODS[-1]}"
        )
    return method


def forced_choice(op: str) -> str | None:
    """The candidate a variable forces for the CUDA choice of ``op``
    (:func:`src.kernels.dispatch.choose`), None where none does."""
    if op == "group_linear.weight_grad":
        method = glt_weight_grad()
        return None if method == "auto" else method
    return None


def pru_gemm() -> str | None:
    """``LIGHTNETS_PRU_GEMM``: ``"plain"``, ``"packed"``, ``"0"``, or None when unset."""
    mode = os.environ.get(PRU_GEMM_ENV) or None
    if mode is not None and mode not in PRU_GEMM_MODES:
        raise ValueError(f"{PRU_GEMM_ENV} must be one of {PRU_GEMM_MODES}, got {mode!r}")
    return mode
