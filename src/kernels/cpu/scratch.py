"""Scratch buffers for the CPU kernels' large temporaries, kept from one call to the next.

glibc's malloc serves a block above its mmap threshold (at most 32 MiB) with a fresh ``mmap``, and
the kernel then faults each 4 KiB page in on its first write: 7.5 ms to first write a 32 MiB
float32 tensor, against 2.0 ms to write it again (2 cores). Relative attention at Transformer-XL's
enwik8 sizes (8 heads, 512 queries, 1,024 keys, 2 sequences) forms tensors of exactly that size,
about six a layer per training step. The ones that live within a single call (the scores before the
softmax, their gradients after it) are taken from here: one flat byte buffer per role and thread,
grown when a larger view is asked for, reused otherwise. What a view holds is valid until the next
:func:`scratch` of the same role on the same thread, so a view must never escape the call that
took it (not returned, not saved for backward). :func:`release_scratch` frees the buffers.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor

_local = threading.local()


def scratch(role: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """A contiguous CPU tensor of ``shape`` and ``dtype`` over this thread's buffer for ``role``;
    its values are whatever the last user left.

    Shape:
        -> shape
    """
    buffers: dict[str, Tensor] = _local.__dict__.setdefault("buffers", {})
    nbytes = math.prod(shape) * dtype.itemsize
    buffer = buffers.get(role)
    if buffer is None or buffer.numel() < nbytes:
        buffer = buffers[role] = torch.empty(nbytes, dtype=torch.uint8)
    return buffer[:nbytes].view(dtype).view(shape)


def release_scratch() -> None:
    """Free this thread's scratch buffers (the next :func:`scratch` allocates afresh)."""
    _local.__dict__.pop("buffers", None)
