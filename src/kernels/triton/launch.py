"""Which GPU a Triton launch is configured for: the launching tensor's, or the one that launches
on CPU tensors are recorded for (:mod:`benchmarks.cross_compile`).

Every Triton kernel asks :func:`gpu_launch` for its tile sizes, grid splits and 16-bit ``tl.dot``
operands, and :func:`multi_processor_count` for the grids sized by the SMs. It imports no Triton:
:mod:`benchmarks.cross_compile` imports it, and without Triton still says why it cannot
compile (:func:`benchmarks.cross_compile.toolchain_missing`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class LaunchTarget:
    """The GPU that launches on CPU tensors are configured for while they are recorded to be
    compiled for it (:mod:`benchmarks.cross_compile`)."""

    arch: int  # compute capability x 10: 80 A100, 90 H100
    multi_processor_count: int


_launch_target: LaunchTarget | None = None


@contextlib.contextmanager
def launches_for(target: LaunchTarget) -> Iterator[None]:
    """Within the context, launches on CPU tensors take ``target``'s configuration: to record them
    for compiling (:func:`benchmarks.cross_compile.recorded_launches`), or to run the GPU's
    tiles, grid splits and reductions in the interpreter."""
    global _launch_target
    previous, _launch_target = _launch_target, target
    try:
        yield
    finally:
        _launch_target = previous


def gpu_launch(x: Tensor) -> bool:
    """Whether a launch on ``x`` takes a GPU's configuration (tile sizes, grid splits, 16-bit
    ``tl.dot`` operands) rather than the interpreter's: ``x`` is a CUDA tensor, or launches are
    being recorded for a GPU."""
    return x.is_cuda or _launch_target is not None


def multi_processor_count(device: torch.device) -> int:
    """SMs of ``device``, or of the :class:`LaunchTarget` being recorded for; 0 in the
    interpreter."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_multi_processors(index)
    return _launch_target.multi_processor_count if _launch_target is not None else 0


@functools.cache
def _cuda_multi_processors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
