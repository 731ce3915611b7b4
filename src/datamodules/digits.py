"""The handwritten digits that ship with scikit-learn, as an image-classification datamodule.

1,797 real 8x8 grey-scale images of the digits 0-9 (the UCI "optdigits" test set), always
available offline. The images are up-sampled to ``image_size`` so that networks designed for
larger inputs (with a stride-2 stem and several down-sampling stages) still see spatial structure.
The split is stratified and fixed by ``split_seed``, independent of the training seed, so every run
is evaluated on the same images.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

# Pixel statistics of the whole set after scaling to [0, 1]; fixed so that the
# normalisation does not depend on the split.
DIGITS_MEAN = 0.3053
DIGITS_STD = 0.3760


class TensorImageDataset(Dataset):
    """Images held in memory as one tensor, with an optional per-sample transform.

    Shape:
        images: (N, C, H, W) float, labels: (N,) int64; an item is ((C, H, W), ()).
    """

    def __init__(
        self, images: Tensor, labels: Tensor, transform: v2.Transform | None = None
    ) -> None:
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels")
        self.images = images
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[index]


class DigitsDataModule(L.LightningDataModule):
    """scikit-learn digits with a fixed stratified train/val/test split.

    Args:
        num_classes: keep the digits 0 .. num_classes-1 (scikit-learn's ``n_class``).
        in_chans: 1 (grey) or 3 (the grey plane repeated, for RGB networks).
        image_size: side of the up-sampled square image (bilinear).
        batch_size: per-device batch size.
        num_workers: data-loading worker processes (0 loads in the main process).
        val_size: number of validation images.
        test_size: number of test images.
        split_seed: seed of the stratified split (not the training seed).
        augment: random affine jitter (rotation, translation, scale) on training images.

    Shape:
        batches are ((B, in_chans, image_size, image_size) float normalised, (B,) int64 labels).
    """

    has_test = True

    def __init__(
        self,
        num_classes: int = 10,
        in_chans: int = 1,
        image_size: int = 32,
        batch_size: int = 64,
        num_workers: int = 0,
        *,
        val_size: int = 270,
        test_size: int = 270,
        split_seed: int = 0,
        augment: bool = True,
    ) -> None:
        super().__init__()
        if not 2 <= num_classes <= 10:
            raise ValueError(f"num_classes must be in 2..10 (the digits 0-9), got {num_classes}")
        if in_chans not in (1, 3):
            raise ValueError(
                f"in_chans must be 1 (grey) or 3 (grey repeated as RGB), got {in_chans}"
            )
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8 (the native size), got {image_size}")
        if val_size <= 0 or test_size <= 0:
            raise ValueError(f"val_size ({val_size}) and test_size ({test_size}) must be positive")
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_size = val_size
        self.test_size = test_size
        self.split_seed = split_seed
        self.augment = augment
        self.splits: dict[str, TensorImageDataset] = {}

    def example_input(self, batch_size: int = 1) -> Tensor:
        """A zero batch with the shape the network receives: (batch_size, in_chans, S, S)."""
        return torch.zeros(batch_size, self.in_chans, self.image_size, self.image_size)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        digits = load_digits(n_class=self.num_classes)
        # (N, 8, 8) in 0..16 -> (N, in_chans, S, S) normalised
        images = torch.from_numpy(digits.images).float().div_(16.0).unsqueeze(1)
        images = F.interpolate(images, size=self.image_size, mode="bilinear", align_corners=False)
        images = (
            ((images - DIGITS_MEAN) / DIGITS_STD).expand(-1, self.in_chans, -1, -1).contiguous()
        )
        labels = torch.from_numpy(digits.target).long()
        if self.val_size + self.test_size >= len(labels):
            raise ValueError(
                f"val_size ({self.val_size}) + test_size ({self.test_size}) leaves no training "
                f"images out of {len(labels)}"
            )

        index = torch.arange(len(labels)).numpy()
        rest, test = train_test_split(
            index, test_size=self.test_size, stratify=labels.numpy(), random_state=self.split_seed
        )
        train, val = train_test_split(
            rest,
            test_size=self.val_size,
            stratify=labels.numpy()[rest],
            random_state=self.split_seed,
        )
        jitter = None
        if self.augment:
            # Background is the normalised zero; fill with it so shifted borders stay blank.
            jitter = v2.RandomAffine(
                degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1), fill=-DIGITS_MEAN / DIGITS_STD
            )
        self.splits = {
            "train": TensorImageDataset(images[train], labels[train], jitter),
            "val": TensorImageDataset(images[val], labels[val]),
            "test": TensorImageDataset(images[test], labels[test]),
        }

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        # Only the augmented training split gains from worker processes.
        workers = self.num_workers if split == "train" else 0
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=workers,
            # fresh workers each epoch draw their seeds from the (checkpointed) main RNG,
            # which keeps augmentation identical when a run is resumed
            persistent_workers=False,
            drop_last=False,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
