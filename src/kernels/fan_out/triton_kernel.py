"""The sum of a few same-shape tensors in one pass: the gradients of a tensor that feeds several
layers (DExTra's x0, :mod:`src.kernels.fan_out`), which autograd would sum one ``add`` launch at a
time.

One program per block of ``BLOCK`` elements loads the block of every term, sums in float32 and
writes the result once in the terms' dtype: k reads and one write, where k - 1 adds read 2(k - 1)
and write k - 1 times. Up to :data:`TERMS` terms a launch; more are summed in runs of
:data:`TERMS`, each run's sum the first term of the next.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.triton.launch import gpu_launch

TERMS = 8  # pointer arguments of the kernel
BLOCK_GPU = 1024
BLOCK_INTERPRETER = 4096  # the interpreter's cost is per program


@triton.jit
def _sum_kernel(out_ptr, t0, t1, t2, t3, t4, t5, t6, t7, numel,
                COUNT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    total = tl.load(t0 + offsets, mask=inside, other=0.0).to(tl.float32)
    if COUNT > 1:
        total += tl.load(t1 + offsets, mask=inside, other=0.0).to(tl.float32)
    if COUNT > 2:
        total += tl.load(t2 + offsets, mask=inside, other=0.0).to(tl.float32)
    if COUNT > 3:
        total += tl.load(t3 + offsets, mask=inside, other=0.0).to(tl.float32)
    if COUNT > 4:
        total += tl.load(t4 + offsets, mask=inside, other=0.0).to(tl.float32)
    if COUNT > 5:
        total += tl.load(t5 + offsets, mask=inside, other=0.0).to(tl.float32)
    if COUNT > 6:
        total += tl.load(t6 + offsets, mask=inside, other=0.0).to(tl.float32)
    if COUNT > 7:
        total += tl.load(t7 + offsets, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=inside)


def gradient_sum_triton(terms: Sequence[Tensor]) -> Tensor:
    """``terms[0] + terms[1] + ...`` in one launch per :data:`TERMS` terms.

    Shape:
        terms: same shape, dtype and device -> that shape, dtype
    """
    first = terms[0]
    if any(t.shape != first.shape or t.dtype != first.dtype for t in terms):
        raise ValueError("the terms of a gradient sum must share their shape and dtype")
    terms = [t.contiguous() for t in terms]
    block = BLOCK_GPU if gpu_launch(first) else BLOCK_INTERPRETER
    numel = first.numel()
    total = terms[0]
    for start in range(1, len(terms), TERMS - 1):
        run = [total, *terms[start : start + TERMS - 1]]
        out = torch.empty_like(first)
        padded = run + [run[0]] * (TERMS - len(run))  # unused pointers: never read
        grid = (triton.cdiv(numel, block),)
        _sum_kernel[grid](out, *padded, numel, COUNT=len(run), BLOCK=block)
        total = out
    return total
