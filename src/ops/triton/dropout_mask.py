"""The dropout mask the fused kernels draw: Philox, keyed by a seed and the element's offset.

A kernel that drops out keeps element i when ``tl.rand(seed, i)`` is at or above p, the seed drawn
once per call from PyTorch's default CPU generator (``torch.manual_seed`` fixes it; drawing it on
the host costs no launch), and its backward draws the same mask again from the seed instead of
storing it. The masks differ from ``F.dropout``'s, their distribution does not.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kept(seed, offsets, p):
    """Whether the elements at ``offsets`` are kept; the int32 counter wraps above 2^31 elements,
    which only repeats draws."""
    return tl.rand(seed, offsets.to(tl.int32)) >= p
