"""How the candidates of a choice are timed: on CUDA a call's device time (:func:`cuda_time`), on
the CPU interleaved samples (:func:`cpu_times`), each candidate a whole call as the caller makes it
(:func:`call_with_backward`: forward and backward when autograd needs the backward) on operands
detached from the caller's graph (:func:`detached`).

On the CPU the winner depends on the machine as well as the shape. On an AMD EPYC, 2 cores, batch 8
of DiCENet s=1.0 (``benchmarks/ops.py``), natively (AVX-512) and as an AVX2 CPU
(``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``), forward+backward against ATen's:

- BatchNorm's two-pass backward: 1.27-1.31x at 24 x 112², 0.84-0.87x at 464 x 7²;
- DimConv's kernels (channels-last): 1.63-2.12x at 116-464 channels, 0.69-0.71x at 24 x 56²;
- the point-wise convolution as row products: 1.09x at 58 x 28² (a split half) as AVX2, 0.82x
  natively; 116 -> 116 at 28²: 0.94x natively, 0.82x as AVX2.

So those ops time both paths on their first call with each shape. The project's path must win by
:data:`MARGIN` (5%): closer than that, the measurement goes either way between runs, and ATen's is
the path to be no slower than.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

Timer = Callable[[Callable[[], object]], float]
Measure = Callable[[Mapping[str, Callable[[], object]]], Mapping[str, float]]

# ATen's path unless the project's is at least this much faster: closer than that, timings on a
# busy machine go either way (in one run two identical paths' medians differed by 10%)
MARGIN = 0.05


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


def candidate_steps(
    run: Callable[..., Tensor], names: Sequence[str], *operands: Tensor | None
) -> dict[str, Callable[[], object]]:
    """The candidates of a choice: for each name, ``run(name, *operands)`` on copies of the
    operands detached from the caller's graph (:func:`detached`), as a whole call
    (:func:`call_with_backward`). Each is ``functools.partial(step, name)``."""
    inputs = detached(*operands)
    wanted = [t for t in inputs if t is not None]

    def step(name: str) -> object:
        return call_with_backward(functools.partial(run, name, *inputs), wanted)()

    return {name: functools.partial(step, name) for name in names}


def needs_backward(*tensors: Tensor | None) -> bool:
    """Whether autograd will want the backward of a call on ``tensors``: grad mode is on and one
    of them requires grad. Part of a choice's key: training and inference are timed apart."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
