"""The choices kept beyond the process: the committed table of each GPU architecture, and the
choices measured on this machine.

**The committed table** (``committed/<arch>.json``, ``arch`` as ``sm_90`` for compute capability
9.0: the H100 and H200) holds the choices a visit to such a GPU measured, so that ``impl="auto"``
times only what the table lacks. It maps an op's name to a list of entries::

    {"group_linear.weight_grad": [
        {"key": "(16384, 8, 64, 128, torch.bfloat16)", "choice": "bmm",
         "source": "docs/gpu.md, Visit 1: ..."},
        {"choice": "bmm", "source": "..."}]}

An entry with a ``key`` (the ``repr`` of the op's key, as :func:`src.kernels.dispatch.choose`
gets it) holds for that key; one without holds for every key of the op the entries with keys do
not name. ``choice`` names one of the op's candidates; ``source`` says which measurement it comes
from (a page of ``docs/`` and the visit). Only what a visit measured goes in. The CPU has no
committed table: its winner depends on the model of CPU, not an architecture.

**The machine's store**: on CUDA, the first call of an op with a new shape compiles every
candidate's kernels and times them; for DiCENet s=1.0 at batch 256 that first training step took
over a minute on an H100 and an H200 (docs/gpu.md), in every process again. So what was timed is
also kept in one JSON file (``LIGHTNETS_CHOICES``, default ``auto_choices.json`` under
:func:`cache_root`; ``0`` turns it off), and a later process on the same machine takes it without
timing, and compiles only the kernels it runs. Entries are filed under a signature: the GPU's
name, the PyTorch and Triton versions and a hash of the Triton kernels' sources, so a new card,
release or kernel is measured afresh. Writers (DDP ranks, parallel jobs) merge under a file lock
and replace the file atomically. The CPU's choices (the project's CPU path or ATen's) are kept the
same way under the CPU's signature (:func:`cpu_signature`): its model name, the instruction sets
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

HERE = Path(__file__).parent
# the Triton kernels' sources, each op's ``triton_*.py`` and the shared launch rules: a change to
# any of them re-measures
KERNELS = (*sorted(HERE.glob("*/triton_*.py")), *sorted((HERE / "triton").glob("*.py")))
# the CPU paths' sources: each op's C++ kernel, the build and its header, and the point-wise
# convolution's row products (read as files, never imported)
CPU_SOURCES = (
    *sorted(HERE.glob("*/*.cpp")),
    *sorted((HERE / "cpu").glob("*.*")),
    HERE / "pointwise_conv.py",
)


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
    for path in KERNELS:
        sources.update(path.read_bytes())
    kernels = sources.hexdigest()[:16]
    return f"{gpu} | torch {torch.__version__} | triton {triton_version} | {kernels}"


@functools.cache
def cpu_signature() -> str:
    """What the CPU choices hold for: this CPU model, the instruction sets ATen and oneDNN use on
    it (``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA`` can lower them), this PyTorch, these
    kernels. The thread count is part of each choice's key."""
    sources = hashlib.sha256()
    for path in CPU_SOURCES:
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
    (every op looks there) and kept up to date by :func:`remember`."""
    return {op: dict(entries) for op, entries in _read(path).get(machine, {}).items()}


def machine_signature(device: str) -> str:
    """The signature the choices of ``device`` (``"cuda"`` or ``"cpu"``) are filed under."""
    return cpu_signature() if device == "cpu" else signature()


def stored(op: str, key: Hashable, device: str = "cuda") -> str | None:
    """The choice an earlier process on this machine measured for ``op`` at ``key``, if any."""
    path = store_path()
    if path is None:
        return None
    return _machine_choices(path, machine_signature(device)).get(op, {}).get(repr(key))


def remember(op: str, key: Hashable, choice: str, device: str = "cuda") -> None:
    """Keep ``choice`` for ``op`` at ``key`` on disk for later processes on this machine."""
    path = store_path()
    if path is None:
        return
    machine = machine_signature(device)
    _machine_choices(path, machine).setdefault(op, {})[repr(key)] = choice
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):  # merged with what other processes wrote
            everything = _read(path)
            everything.setdefault(machine, {}).setdefault(op, {})[repr(key)] = choice
            write_json(path, everything)
    except OSError:  # a read-only home, say: the choice still holds for this process
        pass


COMMITTED = Path(__file__).parent / "committed"


def architecture() -> str | None:
    """The current CUDA device's architecture as the committed tables are named (``"sm_90"`` for
    compute capability 9.0), None without CUDA."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@functools.cache
def committed_table(arch: str) -> dict[str, tuple[dict[str, str], str | None]]:
    """``committed/<arch>.json`` as {op: ({repr(key): choice}, the op-wide choice or None)}; empty
    for an architecture without a table."""
    path = COMMITTED / f"{arch}.json"
    if not path.is_file():
        return {}
    table = {}
    for op, entries in json.loads(path.read_text()).items():
        keyed = {entry["key"]: entry["choice"] for entry in entries if "key" in entry}
        wide = [entry["choice"] for entry in entries if "key" not in entry]
        if len(wide) > 1:
            raise ValueError(f"{path}: {op} has {len(wide)} entries without a key; one at most")
        table[op] = (keyed, wide[0] if wide else None)
    return table


def committed(op: str, key: Hashable, arch: str | None) -> str | None:
    """The committed choice of ``op`` at ``key`` on ``arch`` (module docstring), if any."""
    if arch is None:
        return None
    keyed, wide = committed_table(arch).get(op, ({}, None))
    return keyed.get(repr(key), wide)


def forget() -> None:
    """Read the store and the committed tables anew on their next use."""
    _machine_choices.cache_clear()
    committed_table.cache_clear()
