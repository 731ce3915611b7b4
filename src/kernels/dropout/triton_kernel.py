"""The dropout mask the fused kernels draw: Philox, keyed by a seed, counting the element's offset
and the dropout site's index.

A kernel that drops out keeps element i when Philox's draw for (seed; i, 0, site, 0), as a float
in [0, 1), is at or above p, and its backward draws the same mask again from the same seed and
site instead of storing it. The seed is a one-element int64 tensor on the kernel's device, drawn
by :func:`src.kernels.dropout.contract.draw_seed` (``torch.manual_seed`` fixes it) and read by the
kernel itself: no host read, so a traced graph or a replayed CUDA graph draws a new mask on every
call. The sites of one forward may share a seed
(:class:`src.kernels.dropout.contract.DropoutSeeds`): their indices keep their counters, and so
their masks, apart. Site 0 draws what ``tl.rand(seed, i)`` draws. The masks differ from
``F.dropout``'s, their distribution does not.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kept(seed_ptr, site, offsets, p):
    """Whether the elements at ``offsets`` are kept, for the seed at ``seed_ptr`` and the site
    index ``site``; the int32 counter wraps above 2^31 elements, which only repeats draws."""
    counter = offsets.to(tl.int32).to(tl.uint32)
    zero = counter * 0
    draw, _, _, _ = tl.philox(tl.load(seed_ptr), counter, zero, zero + site, zero)
    return tl.uint_to_uniform_float(draw) >= p
