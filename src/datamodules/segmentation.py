"""What the semantic-segmentation datamodules share: joint image/mask transforms, layout checks,
a dataset of (image, mask) files and the loaders.

Images and masks travel together through torchvision's v2 transforms as ``tv_tensors.Image`` and
``tv_tensors.Mask``, so every random crop and flip is applied to both and masks are always resampled
with nearest-neighbour interpolation (class ids are never blended). ``setup()`` decodes every image
and mask first (:mod:`src.datamodules.bad_files`); a pair with a bad file stops the run or is left
out (``on_bad_file``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import lightning as L
import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from src.datamodules.bad_files import Reader, check_on_bad_file, decode_image, screen_files
from src.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD, DatasetLayoutError, load_rgb
from src.datamodules.loading import resumable_loader

MaskReader = Callable[[Path], np.ndarray]
Pairs = list[tuple[Path, Path]]  # (image file, mask file)


def require_dir(path: Path, layout: str, what: str = "folder") -> Path:
    """Return ``path`` or raise ``DatasetLayoutError`` naming it and the expected layout."""
    if not path.is_dir():
        raise DatasetLayoutError(f"{what} {path} does not exist\n{layout}")
    return path


def require_file(path: Path, layout: str, what: str = "file") -> Path:
    """Return ``path`` or raise ``DatasetLayoutError`` naming it and the expected layout."""
    if not path.is_file():
        raise DatasetLayoutError(f"{what} {path} does not exist\n{layout}")
    return path


def require_files(paths: Sequence[Path], layout: str, what: str) -> None:
    """Raise ``DatasetLayoutError`` with the count and the first few of ``paths`` that are
    missing."""
    missing = [p for p in paths if not p.is_file()]
    if missing:
        first = "\n    ".join(str(p) for p in missing[:5])
        raise DatasetLayoutError(
            f"{len(missing)} of {len(paths)} {what} are missing, e.g.\n    {first}\n{layout}"
        )


def check_crop_size(crop_size: Sequence[int]) -> tuple[int, int]:
    """``crop_size`` as an (H, W) pair of positive ints, or ``ValueError``."""
    size = tuple(int(s) for s in crop_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"crop_size must be (H, W) with positive sides, got {crop_size}")
    return size  # type: ignore[return-value]


def read_rgb(path: Path) -> tv_tensors.Image:
    """A (3, H, W) uint8 image."""
    return tv_tensors.Image(v2.functional.pil_to_tensor(load_rgb(path)))


def mask_values(mask: Image.Image, source: object) -> np.ndarray:
    """The stored values of an opened single-channel mask (palette indices or label ids)."""
    if mask.mode not in ("P", "L", "I", "I;16"):
        raise DatasetLayoutError(
            f"mask {source} has PIL mode {mask.mode}; expected one channel of class ids"
        )
    return np.array(mask)


def read_png_mask(path: Path) -> np.ndarray:
    """The class ids of a single-channel PNG (VOC palette indices, Cityscapes label ids)."""
    with Image.open(path) as mask:
        return mask_values(mask, path)


def segmentation_transform(
    train: bool,
    crop_size: tuple[int, int],
    *,
    crop_scale: tuple[float, float],
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
) -> v2.Compose:
    """Joint transform of (``tv_tensors.Image``, ``tv_tensors.Mask``).

    Training: random-resized crop to ``crop_size`` covering ``crop_scale`` of the image area, with
    aspect ratios within 3/4..4/3 of the crop's own (so 512x256 crops stay near 2:1), then a
    horizontal flip. Evaluation: resize to ``crop_size`` (aspect not kept, as the official EdgeNets
    evaluation does). Masks are resampled with nearest neighbour; the image is scaled to [0, 1]
    and normalised.
    """
    height, width = crop_size
    aspect = width / height
    if train:
        geometry = [
            v2.RandomResizedCrop(
                crop_size, scale=crop_scale, ratio=(aspect * 3 / 4, aspect * 4 / 3), antialias=True
            ),
            v2.RandomHorizontalFlip(),
        ]
    else:
        geometry = [v2.Resize(crop_size, antialias=True)]
    return v2.Compose(
        [
            *geometry,
            # a bare dtype converts images only; masks keep their integer ids
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ]
    )


class SegmentationFiles(Dataset):
    """(image file, mask file) pairs read into aligned tensors.

    Args:
        samples: (image path, mask path) pairs.
        read_mask: turns a mask file into an (H, W) integer array of class ids (ignore = 255).
        transform: joint v2 transform of the image and its mask.

    Shape:
        an item is ((3, H, W) float32, (H, W) int64).
    """

    def __init__(
        self, samples: Sequence[tuple[Path, Path]], read_mask: MaskReader, transform: v2.Transform
    ) -> None:
        self.samples = list(samples)
        self.read_mask = read_mask
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image_path, mask_path = self.samples[index]
        image = read_rgb(image_path)
        mask = tv_tensors.Mask(torch.from_numpy(self.read_mask(mask_path).astype(np.int64)))
        if image.shape[-2:] != mask.shape[-2:]:
            raise DatasetLayoutError(
                f"image {image_path} is {tuple(image.shape[-2:])} but its mask {mask_path} is "
                f"{tuple(mask.shape)}"
            )
        image, mask = self.transform(image, mask)
        return image.as_subclass(Tensor), mask.as_subclass(Tensor)


class SegmentationDataModule(L.LightningDataModule):
    """Loaders, example input and the file check shared by the segmentation datamodules;
    subclasses fill ``splits``.

    Args:
        crop_size, batch_size, num_workers, in_chans: see the subclasses.
        on_bad_file: "error" (``setup`` raises naming every bad image or mask) or "skip" (leave
            their pairs out, the files listed in ``<root>/bad_files.txt``).
        check_max_seconds: time limit of the file check in ``setup`` (None: none; 0: no check).

    Shape:
        batches are ((B, 3, H, W) float normalised, (B, H, W) int64 class ids) with
        (H, W) = ``crop_size``.
    """

    has_test = False  # neither VOC 2012 nor Cityscapes publishes test labels

    def __init__(
        self,
        crop_size: Sequence[int],
        batch_size: int,
        num_workers: int,
        in_chans: int = 3,
        *,
        on_bad_file: str = "error",
        check_max_seconds: float | None = 300.0,
    ) -> None:
        super().__init__()
        if in_chans != 3:
            raise ValueError(f"segmentation images are RGB: in_chans must be 3, got {in_chans}")
        self.in_chans = in_chans
        self.crop_size = check_crop_size(crop_size)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.on_bad_file = check_on_bad_file(on_bad_file)
        self.check_max_seconds = check_max_seconds
        self.splits: dict[str, Dataset] = {}

    def usable_pairs(
        self, samples: dict[str, Pairs], root: Path, read: Reader = decode_image
    ) -> dict[str, Pairs]:
        """``samples`` (split -> pairs) without the pairs that hold a bad file, after one check of
        every image and mask with ``read``; with ``on_bad_file="error"`` a bad file raises."""
        files = [path for pairs in samples.values() for pair in pairs for path in pair]
        bad = screen_files(
            files, root, on_bad_file=self.on_bad_file, read=read,
            max_seconds=self.check_max_seconds, workers=max(1, self.num_workers),
        )  # fmt: skip
        usable = {
            split: [pair for pair in pairs if bad.isdisjoint(pair)]
            for split, pairs in samples.items()
        }
        for split, pairs in usable.items():
            if not pairs:
                raise DatasetLayoutError(
                    f"no usable {split} pairs under {root}: data.on_bad_file=skip left out every "
                    "one"
                )
        return usable

    def example_input(self, batch_size: int = 1) -> Tensor:
        """A zero batch with the shape the network receives: (batch_size, 3, H, W)."""
        return torch.zeros(batch_size, self.in_chans, *self.crop_size)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return resumable_loader(
            self.splits[split], self.batch_size, self.num_workers, shuffle=shuffle
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)
