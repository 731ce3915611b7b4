"""The rules every back-end of the ops follows: which path an ``impl`` takes, autocast's rule for
the ops with their own autograd Functions, the custom ops that ``torch.compile`` sees as one
node, and the choice of a path (:func:`choose`: the rules in order, the package's docstring).

Each op takes ``impl="auto" | "reference" | "triton"``. ``auto`` runs the kernel on CUDA tensors
when Triton is importable and the PyTorch reference everywhere else (on the CPU, the ops' C++
kernels where they apply); ``triton`` forces the kernel (on CPU tensors it needs
``TRITON_INTERPRET=1``, which the tests use); ``reference`` forces PyTorch. Triton is optional:
nothing here imports it, and the ops import their Triton modules (:mod:`src.kernels.triton`) only
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

from src.kernels import choices, environment
from src.kernels.timing import MARGIN, Measure, Timer, cpu_times, cuda_time

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
    :func:`src.kernels.cpu.cpu_kernels_loaded`, :func:`choose` and
    :func:`src.kernels.inference_folding.folded_inference`, which all ask this."""
    if _EXPORT_CAPTURES or torch.compiler.is_exporting():
        return True
    if torch.compiler.is_compiling():  # strict torch.export traces with Dynamo's flag set too
        return False
    return torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


def static_size(x: Tensor) -> tuple[int, int] | None:
    """The (H, W) of ``x`` when the graph being built holds it as plain ints, else None:
    ``torch.export`` gives a dynamic size as a symbol, and ``torch.jit.trace`` gives ints even for
    the sizes it leaves dynamic, so nothing it traces counts as static."""
    size = tuple(x.shape[-2:])
    if torch.jit.is_tracing() or not all(isinstance(n, int) for n in size):
        return None
    return size  # type: ignore[return-value]


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
    ``schema`` and ``fake`` are the op's contract, taken from ``src/kernels/<op>/contract.py``: a
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


def size_bucket(n: int) -> int:
    """The power of two at or above ``n``: measured choices are kept per bucket of a varying size
    (tokens per batch, batch size), so that variable-length batches are not each timed anew.
    While ``torch.compile`` traces, a size left dynamic is found by comparisons, each a guard of
    the graph: the bucket is then a constant of a graph per bucket, as :func:`choose` needs."""
    if torch.compiler.is_compiling():
        bucket = 1
        while bucket < n:
            bucket *= 2
        return bucket
    return 1 << max(n - 1, 0).bit_length()


# the names of the CPU flavour's candidates: the project's path (the default) and ATen's
OURS = "ours"
ATEN = "aten"

Candidates = Callable[[], Mapping[str, Callable[[], object]]]
_DECLARED: dict[tuple[str, str], tuple[str, ...]] = {}  # (op, device) -> its candidates' names
_CHOSEN: dict[tuple[str, str], dict[Hashable, str]] = {}  # (op, device) -> {key: choice}
_TIMINGS = [0]  # measurements since the process started (or since forget())


def declare(op: str, candidates: Sequence[str], *, device: str = "cuda") -> str:
    """Name ``op``'s candidates on ``device`` (``"cuda"`` or ``"cpu"``); returns ``op``. The ops
    declare theirs where they are defined: the committed tables are checked against them, and a
    measurement against the candidates the op builds."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    _DECLARED[op, device] = tuple(candidates)
    return op


def declared() -> Mapping[tuple[str, str], tuple[str, ...]]:
    """{(op, device): candidate names} of every op declared so far (:func:`declare`)."""
    return dict(_DECLARED)


def capturing() -> bool:
    """Whether a graph is being recorded: ``torch.compile`` tracing, or the current CUDA stream
    capturing a CUDA graph. Then nothing may be timed (a timing synchronises the device, and
    its launches would be recorded) and :func:`choose` takes a stored choice or the default."""
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def choose(
    op: str,
    key: Hashable,
    candidates: Candidates,
    *,
    default: str,
    reference: str = "reference",
    device: str = "cuda",
    timer: Timer | None = None,
    measure: Measure | None = None,
) -> str:
    """The name of the path ``op`` takes at ``key`` (its shapes, dtypes, mode): the first of

    1. :func:`exporting`: ``reference`` (an exported graph holds ATen's operators only);
    2. an environment variable that forces the op (:mod:`src.kernels.environment`:
       ``LIGHTNETS_GLT_WGRAD``; on the CPU ``LIGHTNETS_CPU_KERNELS``, 1 for ``default``, 0 for
       ``reference``);
    3. ``torch.use_deterministic_algorithms(True)``: ``default``, a candidate whose result does
       not depend on the run (a timed choice may differ between processes, and a resumed run
       would then round differently);
    4. the process's choice for ``key``;
    5. the committed table of this GPU's architecture (:mod:`src.kernels.choices`);
    6. the choice an earlier process measured on this machine;
    7. while :func:`capturing`: ``default``, nothing timed;
    8. else the fastest of ``candidates()`` (interchangeable computations of one result, each a
       whole call as the caller makes it: :func:`src.kernels.timing.call_with_backward`), timed
       now and kept for the process and on disk, which synchronises the device once per key.

    ``device="cpu"`` is the CPU flavour: the candidates are ``default`` (the project's path) and
    ``reference`` (ATen's), timed by :func:`src.kernels.timing.cpu_times`; the thread count joins
    the key, and ``default`` wins only by :data:`src.kernels.timing.MARGIN`. ``timer`` (seconds of
    one candidate's call) and ``measure`` (seconds of each of them) stand in for the measurement
    in tests; a ``timer``'s choices stay in the process. While ``torch.compile`` traces, rules 1-7
    are taken as a constant of the graph, so ``key`` must be made of Python constants there
    (:func:`size_bucket` gives one for a size the graph leaves dynamic).
    """
    if exporting():
        return reference
    if torch.compiler.is_compiling():
        return _traced_choice(op, key, default, reference, device)
    key = _keyed(key, device)
    known = _known(op, key, default, reference, device, timer is None)
    if known is not None:
        return known
    if capturing():
        return default
    return _measured(op, key, candidates, default, reference, device, timer, measure)


def _known(
    op: str, key: Hashable, default: str, reference: str, device: str, machine: bool
) -> str | None:
    """Rules 2-6 of :func:`choose`; None when none applies. ``machine``: look in the store."""
    forced = _forced(op, default, reference, device)
    if forced is not None:
        return forced
    if torch.are_deterministic_algorithms_enabled():
        return default
    chosen = _CHOSEN.setdefault((op, device), {})
    known = chosen.get(key)
    if known is None and device == "cuda":
        known = choices.committed(op, key, choices.architecture())
    if known is None and machine:
        known = choices.stored(op, key, device)
    if known is not None:
        chosen[key] = known
    return known


@torch.compiler.assume_constant_result
def _traced_choice(op: str, key: Hashable, default: str, reference: str, device: str) -> str:
    """Rules 2-7 of :func:`choose` as ``torch.compile`` takes them: a constant of the graph."""
    return _known(op, _keyed(key, device), default, reference, device, True) or default


def _keyed(key: Hashable, device: str) -> Hashable:
    """The key a choice is kept under: on the CPU with the thread count, as fewer threads favour
    other paths."""
    if device != "cpu":
        return key
    threads = torch.get_num_threads()
    return (*key, threads) if isinstance(key, tuple) else (key, threads)


def _forced(op: str, default: str, reference: str, device: str) -> str | None:
    if device == "cpu":
        mode = environment.cpu_path_mode()
        return default if mode == "1" else reference if mode == "0" else None
    return environment.forced_choice(op)


def _measured(
    op: str,
    key: Hashable,
    candidates: Candidates,
    default: str,
    reference: str,
    device: str,
    timer: Timer | None,
    measure: Measure | None,
) -> str:
    """Rule 8 of :func:`choose`: time the candidates, keep the fastest."""
    built = candidates()
    names = _DECLARED.get((op, device))
    if names is not None and set(built) != set(names):
        raise ValueError(f"{op} on {device} declared the candidates {names}, built {tuple(built)}")
    if timer is not None:
        times = {name: timer(fn) for name, fn in built.items()}
    elif measure is not None:
        times = dict(measure(built))
    elif device == "cpu":
        _say_first_timing(cuda=False)
        times = cpu_times(built)
        for name in times:  # the reference is the path to be no slower than
            if name != reference:
                times[name] *= 1 + MARGIN
    else:
        _say_first_timing(cuda=True)
        times = {name: cuda_time(fn) for name, fn in built.items()}
    _TIMINGS[0] += 1
    choice = min(times, key=times.__getitem__)
    _CHOSEN.setdefault((op, device), {})[key] = choice
    if timer is None:
        choices.remember(op, key, choice, device)
    return choice


def timings() -> int:
    """How many times :func:`choose` has timed candidates (one key each) since the process
    started or :func:`forget` was called: a test asserts that a warmed-up step times nothing."""
    return _TIMINGS[0]


def chosen(op: str, device: str = "cuda") -> Mapping[Hashable, str]:
    """The process's choices of ``op`` on ``device``: {key: candidate name} (a copy)."""
    return dict(_CHOSEN.get((op, device), {}))


def forget() -> None:
    """Forget the process's choices and measurements and read the store and the committed tables
    anew: each test of a choice starts from nothing."""
    _CHOSEN.clear()
    _TIMINGS[0] = 0
    choices.forget()
    _say_first_timing.cache_clear()


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
