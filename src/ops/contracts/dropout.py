"""The contract of the dropouts whose masks a kernel draws from a seed (:mod:`src.ops.dropout` on
the CPU, the fused norms' Triton kernels): the seed they take, and the hashed dropout's ops.

A kernel keeps or drops element i by a function of (seed, i), and its backward draws the same mask
again from the same seed instead of storing it. The seed is a one-element int64 tensor drawn on the
input's device (:func:`draw_seed`), never a Python number: ``torch.compile`` would bake a number
into its graph and a replayed CUDA graph would reuse it, so every call would drop the same
elements. Drawn as a tensor, the draw is an op of the graph (on CUDA, replays advance the
generator's Philox offset), and ``torch.manual_seed`` fixes the masks as it fixes
``F.dropout``'s. The backward reads the seed the forward saved.
"""

from __future__ import annotations

import torch
from torch import Tensor

FORWARD_SCHEMA = "(Tensor x, Tensor seed, float p) -> Tensor"
BACKWARD_SCHEMA = "(Tensor grad_y, Tensor seed, float p) -> Tensor"


def draw_seed(device: torch.device) -> Tensor:
    """A mask's seed: one int64 drawn uniformly (all but the largest value) by ``device``'s default
    generator, without reading it on the host.

    Shape:
        -> (1,) int64 on ``device``
    """
    return torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=device)


def forward_fake(x: Tensor, seed: Tensor, p: float) -> Tensor:
    """The hashed dropout's output metadata: like the contiguous x."""
    return torch.empty_like(x)


def backward_fake(grad_y: Tensor, seed: Tensor, p: float) -> Tensor:
    """The hashed dropout's input gradient metadata: like the contiguous output gradient."""
    return torch.empty_like(grad_y)
