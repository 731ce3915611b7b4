"""The project's CPU path of an op or ATen's, whichever this machine runs faster at this shape.

The CPU paths (the C++ kernels of this folder, the point-wise convolution's row products) were
each written to beat ATen and oneDNN at the paper models' shapes, but for three of them the winner
depends on the machine as well as the shape. On an AMD EPYC, 2 cores, batch 8 of DiCENet s=1.0
(``benchmarks/ops.py``), natively (AVX-512) and as an AVX2 CPU (``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2``), forward+backward against ATen's:

- BatchNorm's two-pass backward: 1.27-1.31x at 24 x 112², 0.84-0.87x at 464 x 7²;
- DimConv's kernels (channels-last): 1.63-2.12x at 116-464 channels, 0.69-0.71x at 24 x 56²;
- the point-wise convolution as row products: 1.09x at 58 x 28² (a split half) as AVX2, 0.82x
  natively; 116 -> 116 at 28²: 0.94x natively, 0.82x as AVX2.

So these ops time both paths on their first call with each shape (forward and backward when
autograd will need the backward; the median of interleaved samples of a millisecond or more,
:func:`cpu_times`) and keep the faster for the process and, in a
:class:`~src.kernels.choices.ChoiceCache`, on disk for later processes on this machine, as
``impl="auto"`` does on CUDA (:func:`src.kernels.dispatch.fastest`). The key holds the thread count:
fewer threads favour other paths. The project's path must win by :data:`MARGIN` (5%): closer
than that, the measurement goes either way between runs, and ATen's is the path to be no slower
than.
``LIGHTNETS_CPU_KERNELS=1`` takes the project's path without timing (the suite does, for numbers
that hold on every machine), ``0`` ATen's; under ``torch.use_deterministic_algorithms(True)`` and
while ``torch.compile`` traces, the project's path runs, as it always has.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from src.kernels.choices import ChoiceCache
from src.kernels.dispatch import Timer, exporting, fastest
from src.kernels.environment import cpu_path_mode

OURS = "ours"
ATEN = "aten"


# a sample lasts at least this long (a call repeated), so that the timer's resolution and the
# scheduler's jitter do not decide between two paths of a ~20 us op
MIN_SAMPLE_S = 1e-3


def cpu_times(candidates: Mapping[str, Callable[[], object]], rounds: int = 9) -> dict[str, float]:
    """Seconds of one call of each candidate on the CPU: after a warm-up call of each, ``rounds``
    samples of each, interleaved in alternating order (so none always runs first or after the
    same neighbour), each sample as many calls as make :data:`MIN_SAMPLE_S` for the fastest; the
    median sample of each. (On a shared machine the best sample of two identical paths differed
    by up to 12%, the medians by 1-3%.)"""
    order = list(candidates.items())
    warm = {}
    for name, fn in order:
        start = time.perf_counter()
        fn()
        warm[name] = time.perf_counter() - start
    calls = max(1, math.ceil(MIN_SAMPLE_S / max(min(warm.values()), 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for round_ in range(rounds):
        for name, fn in order if round_ % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


def cpu_path(
    cache: ChoiceCache,
    key: tuple,
    candidates: Callable[[], Mapping[str, Callable[[], object]]],
    timer: Timer | None = None,
) -> str:
    """:data:`OURS` or :data:`ATEN` for an op's call with ``key`` (its shape, dtypes and whether
    autograd needs the backward; the thread count is added here): by ``LIGHTNETS_CPU_KERNELS``,
    else measured once (module docstring). ``candidates()`` builds the two paths as zero-argument
    callables, each a whole call (see :func:`call_with_backward`); ``timer`` is a test's stand-in
    for :func:`cpu_times` (one candidate at a time)."""
    if exporting():  # an exported graph holds ATen's operators only
        return ATEN
    if torch.compiler.is_compiling():  # nothing is timed while tracing
        return ATEN if _aten_only() else OURS
    mode = cpu_path_mode()
    if mode == "1":
        return OURS
    if mode == "0":
        return ATEN
    key = (*key, torch.get_num_threads())
    return fastest(cache, key, candidates, timer, deterministic=OURS, measure=_with_margin)


# ATen's path unless the project's is at least this much faster: closer than that, timings on a
# busy machine go either way (in one run two identical paths' medians differed by 10%)
MARGIN = 0.05


def _with_margin(candidates: Mapping[str, Callable[[], object]]) -> dict[str, float]:
    times = cpu_times(candidates)
    times[OURS] *= 1 + MARGIN
    return times


@torch.compiler.assume_constant_result
def _aten_only() -> bool:
    """``LIGHTNETS_CPU_KERNELS=0``, taken by ``torch.compile`` as a constant while tracing."""
    return cpu_path_mode() == "0"


def call_with_backward(fn: Callable[[], Tensor], inputs: Sequence[Tensor]) -> Callable[[], object]:
    """A call of ``fn`` as the caller makes it: with autograd on (training), the forward and the
    backward of a gradient of ones into those of ``inputs`` that require grad, without
    accumulating ``.grad``; with it off (``torch.no_grad``, inference), the forward alone."""
    wanted = [t for t in inputs if t.requires_grad] if torch.is_grad_enabled() else []

    def call() -> object:
        with torch.enable_grad() if wanted else torch.no_grad():
            out = fn()
            if wanted:
                torch.autograd.grad(out, wanted, torch.ones_like(out))
        return out

    return call


def detached(*tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """Each tensor detached (same storage and strides), requiring grad as it did: the operands the
    candidates are timed on, whose graphs never reach the caller's."""
    return tuple(None if t is None else t.detach().requires_grad_(t.requires_grad) for t in tensors)
