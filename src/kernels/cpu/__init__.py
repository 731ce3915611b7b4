"""Fused C++ kernels for the CPU, built on first use by PyTorch's extension builder.

At batch 1 on a CPU, the eager forward of the thesis's units is bound by per-call costs, not
arithmetic: a DiCE unit makes about twenty ATen calls, four of them oneDNN convolutions at 40-130 us
each on maps of 7x7 to 28x28, and an EESP unit's pyramid K convolutions and K + 2 more calls. The
C++ kernels (each in its op's folder of :mod:`src.kernels`) compute such a part in one call:
``dice.cpp`` the DiCE unit, ``eesp.cpp`` the EESP pyramid (its 1x1 convolutions are GEMMs, which
PyTorch already runs well); both for inference. ``per_group_layer_norm.cpp`` is Group-Transformer's
per-group layer norm, forward and backward, for training: eagerly about twenty-two element-wise ATen
passes over each normalised tensor. ``prelu.cpp`` and ``batch_norm.cpp`` are PReLU's backward in one
pass and BatchNorm's (channels-last) in two (training; see :mod:`src.kernels.prelu` and
:mod:`src.kernels.batch_norm`); ``batch_norm_prelu.cpp`` the two fused, forward and backward, for
channels-last training (:mod:`src.kernels.batch_norm_prelu`). ``relative_softmax.cpp`` is the
attention probabilities of relative-position attention, forward and backward, in one pass each (see
:mod:`src.kernels.relative_softmax`).

The sources are compiled once per machine and PyTorch version with
``torch.utils.cpp_extension.load`` (a C++ compiler and ninja are needed; about 50 s) into
``lightnets/`` under PyTorch's extension cache (``$TORCH_EXTENSIONS_DIR``, default
``$XDG_CACHE_HOME/torch_extensions``, ``~/.cache`` without it), and rebuilt only when a source
or the shared header changes. The build compiles copies of the sources kept in its folder
(:func:`stage_sources`), so every checkout of the same sources shares one build.
Where they cannot be built, :func:`cpu_kernels` warns once and the callers keep their eager
PyTorch path.

``LIGHTNETS_CPU_KERNELS`` (:func:`src.kernels.environment.cpu_path_mode`) says which CPU paths run:

- ``auto`` (the default): the kernels, except where the winner depends on the machine and the
  shape (BatchNorm's backward, DimConv, the point-wise convolution's row products, the one-node
  relative attention): those ops time
  their path against ATen's on the first call of each shape and keep the faster
  (:func:`src.kernels.choose`);
- ``1``: the project's paths wherever they apply, nothing timed (the same path on every machine);
- ``0``: ATen's eager paths everywhere, nothing built (e.g. to time both).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import time
import warnings
from pathlib import Path

import torch
from filelock import FileLock
from torch.utils._python_dispatch import _get_current_dispatch_mode

from src.kernels.dispatch import exporting
from src.kernels.environment import CPU_KERNELS_ENV, cpu_kernels_disabled, cpu_path_mode
from src.utils.files import atomic_write_bytes

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
# each op's C++ source sits in its folder of src/kernels, beside its contract and its other paths
SOURCES = tuple(sorted(HERE.parent.glob("*/*.cpp")))
HEADERS = (HERE / "common.h",)


def _compiler_flags() -> tuple[list[str], list[str], str]:
    """(compile flags, link flags, build-name suffix) for this CPU and this PyTorch."""
    # no trapping math: a float comparison may then be if-converted into a vector select (PReLU's
    # backward); no code here reads the floating-point exception flags, and no result changes
    cflags, ldflags = ["-O3", "-fno-trapping-math"], []
    capability = torch.backends.cpu.get_cpu_capability()  # "AVX2", "AVX512", "DEFAULT", ...
    if capability in ("AVX2", "AVX512"):
        # the ISA level PyTorch itself dispatches to on this CPU, so the build runs where it was
        # made
        cflags += ["-mavx2", "-mfma"]
    if capability == "AVX512":  # the sources that gain from it switch to AVX-512 themselves
        cflags.append("-DLIGHTNETS_AVX512")
    if torch.backends.openmp.is_available():
        # at::parallel_for is inline OpenMP in OpenMP builds of PyTorch
        cflags.append("-fopenmp")
        ldflags.append("-fopenmp")
    return cflags, ldflags, capability.lower()


def _put_ninja_on_path() -> None:
    """The builder runs ``ninja`` from PATH; the pip package's binary sits in the environment's
    bin folder, which is not on PATH when Python is started without activating the environment."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


def build_name(suffix: str) -> str:
    """The build's name: ``suffix`` (the CPU's ISA level), PyTorch's version, whose ABI the build
    links against, and the digest of the sources' names and contents (the builder rebuilds when a
    source changes, not a header; a renamed source changes the build's command, so it is a new
    build rather than a rebuild of the one that checkouts of the old name share)."""
    named = (p.name.encode() + b"\0" + p.read_bytes() for p in SOURCES + HEADERS)
    digest = hashlib.sha256(b"".join(named)).hexdigest()[:10]
    version = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    return f"lightnets_cpu_{suffix}_{version}_{digest}"


def build_directory(name: str) -> Path:
    """The folder a build named ``name`` is made in, created if missing:
    ``$TORCH_EXTENSIONS_DIR`` (default ``$XDG_CACHE_HOME/torch_extensions``, ``~/.cache`` without
    it) ``/lightnets/<name>``."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path(cache) / "torch_extensions"
    directory = Path(root) / "lightnets" / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def current_build_directory() -> Path:
    """The folder of this machine's build of the current sources (:func:`cpu_kernels`), where
    verdicts about the build are kept beside it."""
    return build_directory(build_name(_compiler_flags()[2]))


def stage_sources(
    directory: Path, sources: tuple[Path, ...] = SOURCES, headers: tuple[Path, ...] = HEADERS
) -> list[Path]:
    """Copies of the sources and headers in ``directory``/``src``, the ones the build compiles.

    The build folder is named by the sources' digest, so every checkout of the same sources (a
    second clone, a CI checkout, a worktree) builds from the same paths with the same command:
    the builder, which rebuilds whenever its command changes, builds once per content instead of
    at every switch between checkouts (3 minutes each on 2 cores). A copy is rewritten only when
    its bytes differ (an interrupted copy). Returns the staged sources' paths.
    """
    staged = directory / "src"
    staged.mkdir(parents=True, exist_ok=True)
    for path in sources + headers:
        target = staged / path.name
        data = path.read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            atomic_write_bytes(target, data)  # a reader never sees half a file
    return [staged / path.name for path in sources]


@functools.cache
def cpu_kernels() -> bool:
    """Whether ``torch.ops.lightnets_cpu`` is loaded, building it on the first call."""
    if cpu_kernels_disabled():  # not built at all
        return False
    # importing the builder logs where it found CUDA, which a CPU-only build does not use
    builder_log = logging.getLogger("torch.utils.cpp_extension")
    level = builder_log.level
    builder_log.setLevel(logging.ERROR)
    try:
        from torch.utils.cpp_extension import load
    finally:
        builder_log.setLevel(level)

    _put_ninja_on_path()
    cflags, ldflags, suffix = _compiler_flags()
    log.info("loading the fused CPU kernels")
    name = build_name(suffix)
    try:
        directory = build_directory(name)
        # PyTorch before 2.14 marks a build in progress by the file `lock` in its folder and waits
        # while that file exists: forever, once a build was killed. Our own lock, which the OS
        # drops with its holder, serialises the builds, so a marker found under it is stale.
        with FileLock(directory.with_suffix(".lock")):
            (directory / "lock").unlink(missing_ok=True)
            sources = stage_sources(directory)
            library = directory / f"{name}.so"
            before = library.stat().st_mtime_ns if library.is_file() else None
            if before is None:
                log.warning(
                    "building the fused CPU kernels for these sources (once per machine, PyTorch "
                    "version and kernel sources: 1.5-3.5 min on 2 cores) in %s",
                    directory,
                )
            start = time.perf_counter()
            load(
                name,
                sources=[str(path) for path in sources],
                extra_cflags=cflags,
                extra_ldflags=ldflags,
                build_directory=str(directory),
                is_python_module=False,
            )
            if not library.is_file() or library.stat().st_mtime_ns != before:  # it was (re)built
                log.warning("built the fused CPU kernels in %.0f s", time.perf_counter() - start)
    except Exception as error:  # no compiler, no ninja, a failed build: keep the eager path
        warnings.warn(
            f"the fused CPU kernels could not be built ({type(error).__name__}: "
            f"{str(error).strip().splitlines()[-1] if str(error).strip() else error!r}); the "
            f"CPU uses the eager PyTorch paths. A C++ compiler and ninja "
            f"(`pip install ninja`) are needed; {CPU_KERNELS_ENV}=0 silences this.",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


def dispatch_mode_active() -> bool:
    """Whether a ``TorchDispatchMode`` (``FlopCounterMode``, fake tensors) is active outside
    ``torch.compile``'s tracing. The kernels are opaque to such a mode (a flop counter would count
    nothing), so the ops that call them run their ATen path under one."""
    return not torch.compiler.is_compiling() and _get_current_dispatch_mode() is not None


@torch.compiler.assume_constant_result
def cpu_kernels_loaded() -> bool:
    """:func:`cpu_kernels`, taken by ``torch.compile`` as a constant while tracing: for the ops
    whose compiled graphs call the kernels (PReLU's and BatchNorm's backward, the relative softmax).
    False under ``LIGHTNETS_CPU_KERNELS=0`` set after they were built, and while a graph is
    exported (:func:`src.kernels.dispatch.exporting`)."""
    return cpu_path_mode() != "0" and not exporting() and cpu_kernels()
