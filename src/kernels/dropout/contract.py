"""The contract of the dropouts whose masks a kernel draws from a seed (:mod:`src.kernels.dropout`
on the CPU, the fused norms' Triton kernels): the seed they take, and the hashed dropout's ops.

A kernel keeps or drops element i by a function of (seed, i), and its backward draws the same mask
again from the same seed instead of storing it. The seed is a one-element int64 tensor drawn on the
input's device (:func:`draw_seed`), never a Python number: ``torch.compile`` would bake a number
into its graph and a replayed CUDA graph would reuse it, so every call would drop the same
elements. Drawn as a tensor, the draw is an op of the graph (on CUDA, replays advance the
generator's Philox offset), and ``torch.manual_seed`` fixes the masks as it fixes
``F.dropout``'s. The backward reads the seed the forward saved.

Several dropouts of one forward may share one draw (:class:`DropoutSeeds`): each is a *site* with
its own index, which the Triton kernels put in a word of Philox's counter that the element's
offset leaves at zero, so sites sharing a seed draw from disjoint counters (independent masks)
and one draw serves the lot: one launch per forward instead of one per dropout, the step's
launches being most of its cost on a GPU (docs/gpu.md).
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


class DropoutSeeds:
    """The seed of the dropout sites of one forward, drawn once (:func:`draw_seed`) by the first
    site that asks, and each site's index.

    Create one per forward and hand it to every site of that forward, which calls :meth:`site`
    once a call: each forward then draws a new seed (also as a traced or replayed graph: the draw
    is an op of the forward), and the indices, Python numbers, are the same from one forward to
    the next as long as its sites are (constants of a traced graph, no retrace). A site that
    drops nothing asks for nothing, so a forward without dropout draws nothing.
    """

    def __init__(self) -> None:
        self._seed: Tensor | None = None
        self._sites = 0

    def site(self, device: torch.device) -> tuple[Tensor, int]:
        """The shared seed (drawn on ``device`` at the first call) and the next site's index.

        Shape:
            -> ((1,) int64 on ``device``, index)
        """
        if self._seed is None:
            self._seed = draw_seed(device)
        elif self._seed.device != device:
            raise ValueError(
                f"the dropout sites of one forward share a seed on {self._seed.device}, "
                f"a site asked for one on {device}"
            )
        index = self._sites
        self._sites += 1
        return self._seed, index


def site_seed(seeds: DropoutSeeds | None, device: torch.device) -> tuple[Tensor, int]:
    """A dropout site's seed and index: from ``seeds`` when given, else a seed of its own (index
    0).

    Shape:
        -> ((1,) int64 on ``device``, index)
    """
    return (draw_seed(device), 0) if seeds is None else seeds.site(device)


def forward_fake(x: Tensor, seed: Tensor, p: float) -> Tensor:
    """The hashed dropout's output metadata: like the contiguous x."""
    return torch.empty_like(x)


def backward_fake(grad_y: Tensor, seed: Tensor, p: float) -> Tensor:
    """The hashed dropout's input gradient metadata: like the contiguous output gradient."""
    return torch.empty_like(grad_y)
