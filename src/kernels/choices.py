"""``impl="auto"``'s measured choices, kept on disk per GPU, PyTorch, Triton and kernel sources.

On CUDA, the first call of an op with a new shape compiles every candidate's kernels and times
them (:func:`src.kernels.dispatch.fastest`). For DiCENet s=1.0 at batch 256 that first training step
took over a minute on an H100 and an H200 (docs/gpu.md), in every process again. A
:class:`ChoiceCache` keeps each op's choices in memory as before and, for the choices timed on
CUDA, also in one JSON file (``LIGHTNETS_CHOICES``, default ``auto_choices.json`` under
:func:`cache_root`; ``0`` turns it off), so a later process on the same
machine takes them without timing, and compiles only the kernels it runs. Entries are filed under
a signature: the GPU's name, the PyTorch and Triton versions and a hash of the Triton kernels'
sources, so a new card, release or kernel is measured afresh. Writers (DDP ranks, parallel jobs)
merge under a file lock and replace the file atomically.

The CPU's measured choices (:mod:`src.kernels.timing`: the project's CPU path or ATen's) are kept
the same way under the CPU's signature (:func:`cpu_signature`): its model name, the instruction sets
ATen and oneDNN dispatch to, the PyTorch version and a hash of the CPU kernels' sources.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from collections.abc import Hashable
from pathlib import Path

import torch
from filelock import FileLock

from src.kernels.environment import choices_file
from src.utils.files import write_json

OPS = Path(__file__).parents[1] / "ops"  # read as files, never imported
KERNELS = OPS / "triton"  # the Triton kernels' sources: a change re-measures
# the CPU paths' sources: the C++ kernels and the point-wise convolution's row products
CPU_SOURCES = (OPS / "cpu", OPS / "pointwise_conv.py")


def cache_root() -> Path:
    """The project's folder in the user's cache: ``$XDG_CACHE_HOME/lightnets``,
    ``~/.cache/lightnets`` without it (the XDG base directory rule, as the C++ kernels' build
    folder under ``torch_extensions``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightnets"


def store_path() -> Path | None:
    """The choices file (``LIGHTNETS_CHOICES``, default ``cache_root() / "auto_choices.json"``),
    or None when ``LIGHTNETS_CHOICES=0``."""
    value = choices_file()
    if value == "0":
        return None
    return Path(value) if value else cache_root() / "auto_choices.json"


@functools.cache
def signature() -> str:
    """What the choices hold for: this GPU, these PyTorch and Triton versions, these kernels."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    sources = hashlib.sha256()
    for path in sorted(KERNELS.glob("*.py")):
        sources.update(path.read_bytes())
    kernels = sources.hexdigest()[:16]
    return f"{gpu} | torch {torch.__version__} | triton {triton_version} | {kernels}"


@functools.cache
def cpu_signature() -> str:
    """What the CPU choices hold for: this CPU model, the instruction sets ATen and oneDNN use on
    it (``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA`` can lower them), this PyTorch, these
    kernels. The thread count is part of each choice's key."""
    sources = hashlib.sha256()
    for root in CPU_SOURCES:
        for path in sorted(root.glob("*.*")) if root.is_dir() else [root]:
            if path.suffix in (".cpp", ".h", ".py"):
                sources.update(path.read_bytes())
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "all"
    return (
        f"{cpu_model()} | ATen {torch.backends.cpu.get_cpu_capability()} | oneDNN {onednn} | "
        f"torch {torch.__version__} | {sources.hexdigest()[:16]}"
    )


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or cut short by a crash before the atomic replace
        return {}


@functools.cache
def _machine_choices(path: Path, machine: str) -> dict[str, dict[str, str]]:
    """{op: {repr(key): choice}} of the store under ``machine``'s signature, read once a process
    (every op's cache looks there) and kept up to date by :meth:`ChoiceCache.remember`."""
    return {op: dict(entries) for op, entries in _read(path).get(machine, {}).items()}


class ChoiceCache(dict):
    """One op's choices (``key -> candidate name``) for the process, as a plain dict, plus the
    ones an earlier process measured on this machine (module docstring): the GPU's choices, or
    with ``device="cpu"`` the CPU's."""

    def __init__(self, name: str, device: str = "cuda") -> None:
        super().__init__()
        self.name = name
        self.device = device

    def signature(self) -> str:
        """The machine signature this cache's choices are filed under."""
        return cpu_signature() if self.device == "cpu" else signature()

    def stored(self, key: Hashable) -> str | None:
        """The choice an earlier process measured for ``key``, if any."""
        path = store_path()
        if path is None:
            return None
        return _machine_choices(path, self.signature()).get(self.name, {}).get(repr(key))

    def remember(self, key: Hashable, choice: str) -> None:
        """Keep ``choice`` for ``key`` in this process and on disk."""
        self[key] = choice
        path = store_path()
        if path is None:
            return
        machine = self.signature()
        _machine_choices(path, machine).setdefault(self.name, {})[repr(key)] = choice
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path) + ".lock"):  # merged with what other processes wrote
                everything = _read(path)
                everything.setdefault(machine, {}).setdefault(self.name, {})[repr(key)] = choice
                write_json(path, everything)
        except OSError:  # a read-only home, say: the choice still holds for this process
            pass
