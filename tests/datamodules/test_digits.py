from __future__ import annotations

import pytest
import torch

from src.datamodules.digits import DigitsDataModule


def test_split_is_fixed_disjoint_and_stratified() -> None:
    first, second = DigitsDataModule(), DigitsDataModule()
    first.setup(), second.setup()
    sizes = {name: len(split) for name, split in first.splits.items()}
    assert sizes == {"train": 1257, "val": 270, "test": 270}
    for name in sizes:
        assert torch.equal(first.splits[name].images, second.splits[name].images)
    train, test = first.splits["train"].images.flatten(1), first.splits["test"].images.flatten(1)
    # no test image appears in training (distances to every training image are positive)
    assert torch.cdist(test, train).min() > 0
    counts = torch.bincount(first.splits["test"].labels, minlength=10)
    assert counts.min() >= 26 and counts.max() <= 28


def test_batches_have_the_documented_shape() -> None:
    dm = DigitsDataModule(image_size=24, batch_size=16, in_chans=3)
    dm.setup()
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (16, 3, 24, 24) and images.dtype == torch.float32
    assert labels.shape == (16,) and labels.dtype == torch.int64
    assert dm.example_input(2).shape == (2, 3, 24, 24)
    val_images, _ = next(iter(dm.val_dataloader()))
    # normalised with the set's statistics: roughly zero mean, unit spread
    assert abs(val_images.mean().item()) < 0.1 and 0.8 < val_images.std().item() < 1.1


def test_fewer_classes() -> None:
    dm = DigitsDataModule(num_classes=3, val_size=30, test_size=30)
    dm.setup()
    assert set(dm.splits["train"].labels.tolist()) == {0, 1, 2}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_classes": 11}, "num_classes"),
        ({"in_chans": 2}, "in_chans"),
        ({"image_size": 4}, "image_size"),
        ({"val_size": 0}, "val_size"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DigitsDataModule(**kwargs)
