"""The rules every back-end of the ops follows: which path an ``impl`` takes, autocast's rule for
the ops with their own autograd Functions, the custom ops that ``torch.compile`` sees as one
node, and the measured choice of ``impl="auto"``.

Each op takes ``impl="auto" | "reference" | "triton"``. ``auto`` runs the kernel on CUDA tensors
when Triton is importable and the PyTorch reference everywhere else (on the CPU, the ops' C++
kernels where they apply); ``triton`` forces the kernel (on CPU tensors it needs
``TRITON_INTERPRET=1``, which the tests use); ``reference`` forces PyTorch. Triton is optional:
nothing here imports it, and the ops import their Triton modules (:mod:`src.ops.triton`) only
where they launch a kernel.

The ops with their own autograd Functions (the GLT and DimConv) are opaque to ``torch.autocast``,
so they apply its rule themselves (:func:`autocast_operands`) before entering the Function, and the
Function bodies run with autocast off.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar, cast

import torch
from torch import Tensor
from torch.amp import is_autocast_available

from src.kernels.choices import ChoiceCache

IMPLS = ("auto", "reference", "triton")
F = TypeVar("F", bound=Callable[..., Any])
# looked up once: find_spec on every call would cost a filesystem probe and break torch.compile
_TRITON = importlib.util.find_spec("triton") is not None
log = logging.getLogger(__name__)


def triton_available() -> bool:
    """Whether the ``triton`` package can be imported."""
    return _TRITON


def exporting() -> bool:
    """Whether a graph is being captured for export: ``torch.export`` (and the dynamo exporter of
    ``torch.onnx.export`` over it), the TorchScript exporter, ``torch.jit.trace``.

    The one rule of export: every op then takes its plain PyTorch reference path, so the graph
    holds only ATen operators (no custom op, no C++ or Triton kernel, no measured choice, no
    folded inference path) and no branch on a size that the graph leaves dynamic. The fast-path
    conditions of the ops ask :func:`use_triton`, :func:`opaque_op`'s call,
    :func:`src.ops.cpu.cpu_kernels_loaded`, :func:`src.kernels.timing.cpu_path` and
    :func:`src.ops.inference_folding.folded_inference`, which all ask this."""
    if _EXPORT_CAPTURES or torch.compiler.is_exporting():
        return True
    if torch.compiler.is_compiling():  # strict torch.export traces with Dynamo's flag set too
        return False
    return torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


_EXPORT_CAPTURES: list[None] = []  # one entry per open capture_for_export block


@contextlib.contextmanager
def capture_for_export() -> Iterator[None]:
    """Inside the block :func:`exporting` is true: wrap a non-strict ``torch.export.export`` (as
    ExecuTorch lowering uses it), which sets none of the flags :func:`exporting` reads."""
    _EXPORT_CAPTURES.append(None)
    try:
        yield
    finally:
        _EXPORT_CAPTURES.pop()


def check_impl(impl: str) -> str:
    """Validate an ``impl`` argument; returns it."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl


def use_triton(impl: str, x: Tensor) -> bool:
    """Resolve ``impl`` for input ``x``: True to run the Triton kernel, False for the reference
    (always while :func:`exporting`)."""
    if check_impl(impl) == "reference" or exporting():
        return False
    if impl == "triton":
        if not triton_available():
            raise RuntimeError("impl='triton' but the triton package is not installed")
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("impl='triton' on a CPU tensor needs TRITON_INTERPRET=1")
        return True
    return x.is_cuda and triton_available()


@torch.compiler.assume_constant_result
def autocast_known(device_type: str) -> bool:
    """Whether ``torch.autocast`` knows ``device_type`` (``meta`` it does not). A constant of the
    device type, which ``torch.compile`` takes while tracing: Dynamo in PyTorch 2.11 cannot trace
    the check itself and would break the graph at every op that asks."""
    return is_autocast_available(device_type)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype ``torch.autocast`` casts to on ``device_type``, None when it is off there: part of
    the measured choices' keys."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def autocast_operands(device_type: str, *tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """The operands of a low-precision op as ``torch.autocast`` would pass them.

    When autocast is enabled for ``device_type``, float32/float16/bfloat16 tensors are cast to its
    dtype (``torch.get_autocast_dtype``) by differentiable casts, so float32 parameters still get
    float32 gradients; float64 tensors and None pass unchanged, as autocast leaves them. Outside
    autocast, and on device types autocast does not know (``meta``), every operand passes unchanged.
    """
    if not (autocast_known(device_type) and torch.is_autocast_enabled(device_type)):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(
        t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
        for t in tensors
    )


def autocast_off(device_type: str) -> AbstractContextManager:
    """A context with autocast disabled for ``device_type``: the bodies of the ops' autograd
    Functions run in it. A no-op when autocast is off already (entering ``torch.autocast`` costs
    ~10 us a call) or does not know the device type (``meta``)."""
    if autocast_known(device_type) and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return nullcontext()


def opaque_op(name: str, schema: str, fake: Callable[..., Any]) -> Callable[[F], F]:
    """Register the decorated function as the custom op ``name`` that ``torch.compile`` and
    ``torch.export`` see as one opaque node (``fake`` gives its outputs' metadata when tracing).
    ``schema`` and ``fake`` are the op's contract, taken from :mod:`src.ops.contracts`: a
    reference and its kernels that compute the same thing register under one contract.

    The function returned calls the op while ``torch.compile`` traces and the function itself
    otherwise, under export too (:func:`exporting`: the graph then holds its ATen ops): eager
    calls skip the dispatcher round trip of a Python custom op (tens of us a call, more than the
    kernels of a small layer take). ``schema`` is spelled out: older torch versions cannot infer it
    from postponed annotations.
    """

    def register(fn: F) -> F:
        op = torch.library.custom_op(name, fn, mutates_args=(), schema=schema)
        op.register_fake(fake)

        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            return op(*args) if torch.compiler.is_compiling() and not exporting() else fn(*args)

        return cast(F, call)

    return register


Timer = Callable[[Callable[[], object]], float]


def cuda_time(fn: Callable[[], object], repeats: int = 5) -> float:
    """Seconds of one ``fn()`` on the current CUDA stream: the best of ``repeats`` after a warm-up
    call (which compiles a kernel or lets cuBLAS pick its algorithm)."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def size_bucket(n: int) -> int:
    """The power of two at or above ``n``: measured choices are kept per bucket of a varying size
    (tokens per batch, batch size), so that variable-length batches are not each timed anew."""
    return 1 << max(n - 1, 0).bit_length()


def fastest(
    cache: dict,
    key: Hashable,
    candidates: Callable[[], Mapping[str, Callable[[], object]]],
    timer: Timer | None,
    *,
    deterministic: str,
    measure: Callable[[Mapping[str, Callable[[], object]]], Mapping[str, float]] | None = None,
) -> str:
    """The name of the fastest of ``candidates()`` (interchangeable computations of one result,
    built only to be timed) for ``key``: timed on first use and kept in ``cache`` for the process.
    ``timer`` is a test's stand-in; without one the device's measurement runs (:func:`cuda_time`
    of each candidate, or ``measure`` of them all: the CPU's
    :func:`src.kernels.timing.cpu_times`), and a
    :class:`~src.kernels.choices.ChoiceCache` also keeps what it measured on disk, and takes an
    earlier process's choice on this machine without timing. The measurement synchronises the
    device once per key: take one eager step before capturing CUDA graphs.

    With ``torch.use_deterministic_algorithms(True)`` nothing is timed and ``deterministic`` is
    the answer: a timed choice may differ between processes (a resumed run would then round
    differently), and ``deterministic`` names a candidate whose result does not depend on the run.
    """
    if timer is None and torch.are_deterministic_algorithms_enabled():
        return deterministic
    if key in cache:
        return cache[key]
    # timed on CUDA: a ChoiceCache also keeps the choice on disk for later processes
    persistent = timer is None and isinstance(cache, ChoiceCache)
    stored = cache.stored(key) if persistent else None
    if stored is not None:
        cache[key] = stored
        return stored
    if timer is None:
        _say_first_timing(measure is None)
    built = candidates()
    if timer is None and measure is not None:
        times = measure(built)
    else:
        times = {name: (timer or cuda_time)(fn) for name, fn in built.items()}
    choice = min(times, key=times.__getitem__)
    if persistent:
        cache.remember(key, choice)
    else:
        cache[key] = choice
    return choice


@functools.cache
def _say_first_timing(cuda: bool = True) -> None:
    # the first training steps compile every candidate's kernels for each new shape and time them:
    # over a minute for DiCENet s=1.0 at batch 256 on an H100 (docs/gpu.md), silent otherwise
    if cuda:
        log.info(
            "impl='auto': timing the fused Triton paths against PyTorch's on the first call of "
            "each shape (once per machine and version; the first steps are slow, "
            "model.impl=triton|reference skips it)"
        )
    else:
        log.info(
            "timing the project's CPU paths against ATen's on the first call of each shape (once "
            "per machine, thread count and version; LIGHTNETS_CPU_KERNELS=1 takes the project's "
            "without timing)"
        )


def check_same_dtype(op: str, **operands: Tensor | Sequence[Tensor] | None) -> torch.dtype:
    """The one dtype of the operands (tensors or sequences of them; None skipped); ``TypeError``
    naming each operand's dtype otherwise."""
    tensors = [
        t for value in operands.values() if value is not None
        for t in ((value,) if isinstance(value, Tensor) else value)
    ]  # fmt: skip
    dtype = tensors[0].dtype
    if any(t.dtype != dtype for t in tensors):
        given = {
            name: value.dtype if isinstance(value, Tensor) else [t.dtype for t in value]
            for name, value in operands.items()
            if value is not None
        }
        raise TypeError(
            f"{op} needs operands of one dtype (or torch.autocast to pick one), got "
            + ", ".join(f"{name} {dtypes}" for name, dtypes in given.items())
        )
    return dtype
