"""The DataLoader every datamodule serves, set up so that resumed runs see the same batches."""

from __future__ import annotations

from torch.utils.data import DataLoader, Dataset


def resumable_loader(
    dataset: Dataset, batch_size: int, num_workers: int, *, shuffle: bool, pin_memory: bool = True
) -> DataLoader:
    """A DataLoader whose order and augmentation depend only on the global RNG state.

    Workers are re-created every epoch (not persistent), so they draw their seeds from the main
    process's RNG, which checkpoints carry: a resumed run augments exactly as an uninterrupted one.
    Training loaders shuffle and drop the last incomplete batch; evaluation loaders keep it.
    """
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        persistent_workers=False,
        pin_memory=pin_memory,
        drop_last=shuffle,
    )
