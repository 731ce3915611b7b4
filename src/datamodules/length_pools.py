"""Shuffled batches of texts of similar length: a sampler that sorts within pools.

A batch of texts is padded to its longest; drawn at random, a batch of short texts holds one long
one and most of its positions are padding. :class:`LengthPoolSampler` shuffles the texts, cuts the
order into pools of ``pool`` batches, sorts each pool by length and cuts it into batches, then
shuffles the batches: each batch holds texts of about one length, and both the batches' contents
and their order stay random from epoch to epoch (the pools are redrawn). It yields indices, so a
``DataLoader(batch_size=B, sampler=...)`` takes them ``B`` at a time, and Lightning can split the
stream between processes as it splits any sampler's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler


class LengthPoolSampler(Sampler[int]):
    """Indices of ``lengths`` in an order whose consecutive runs of ``batch_size`` have similar
    lengths (see the module docstring). A new order every epoch, drawn from torch's global
    generator as ``RandomSampler`` draws its own, so a seeded run repeats it. The one smaller batch
    (when ``batch_size`` does not divide the count) comes last, so that every batch the loader
    cuts is one of the sorted ones.

    Shape:
        lengths (N,) -> N indices, each once
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, pool: int) -> None:
        if batch_size < 1 or pool < 1:
            raise ValueError(f"batch_size and pool must be positive, got {batch_size}, {pool}")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.pool = pool

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        size = self.batch_size * self.pool
        batches: list[list[int]] = []
        for start in range(0, len(order), size):
            chunk = sorted(order[start : start + size], key=self.lengths.__getitem__)
            batches += [
                chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)
            ]
        last = batches.pop() if batches and len(batches[-1]) < self.batch_size else []
        for index in torch.randperm(len(batches), generator=generator).tolist():
            yield from batches[index]
        yield from last
