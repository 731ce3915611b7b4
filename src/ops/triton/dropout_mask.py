"""The dropout mask the fused kernels draw: Philox, keyed by a seed and the element's offset.

A kernel that drops out keeps element i when ``tl.rand(seed, i)`` is at or above p, and its
backward draws the same mask again from the same seed instead of storing it. The seed is a
one-element int64 tensor on the kernel's device, drawn per call by
:func:`src.ops.contracts.dropout.draw_seed` (``torch.manual_seed`` fixes it) and read by the
kernel itself: no host read, so a traced graph or a replayed CUDA graph draws a new mask on every
call. The masks differ from ``F.dropout``'s, their distribution does not.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kept(seed_ptr, offsets, p):
    """Whether the elements at ``offsets`` are kept, for the seed at ``seed_ptr``; the int32
    counter wraps above 2^31 elements, which only repeats draws."""
    return tl.rand(tl.load(seed_ptr), offsets.to(tl.int32)) >= p
