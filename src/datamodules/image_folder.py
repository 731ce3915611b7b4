"""Class-folder image datasets (ImageNet and anything laid out like it).

``setup()`` decodes the images first (:mod:`src.datamodules.bad_files`): bad files stop the run with
one message naming them all (``on_bad_file="error"``) or are left out (``"skip"``).
"""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path

import lightning as L
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from src.datamodules.bad_files import BadFilesError, check_on_bad_file, file_problem, screen_files
from src.datamodules.loading import resumable_loader
from src.utils.errors import UserError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

LAYOUT = """expected layout:
    {root}/
        train/<class_name>/<image>.jpeg   (one folder per class)
        val/<class_name>/<image>.jpeg     (the same class folders)
        test/<class_name>/<image>.jpeg    (optional)"""


class DatasetLayoutError(UserError, FileNotFoundError):
    """The dataset root is missing or not laid out as the datamodule expects."""


def check_split_dir(root: Path, split: str) -> Path:
    """Return ``root/split`` or raise naming the path and the expected layout."""
    layout = LAYOUT.format(root=root)
    if not root.is_dir():
        raise DatasetLayoutError(
            f"dataset root {root} does not exist; set data.root=/path/to/dataset\n{layout}"
        )
    path = root / split
    if not path.is_dir():
        raise DatasetLayoutError(f"dataset root {root} has no '{split}/' folder\n{layout}")
    if not any(child.is_dir() for child in path.iterdir()):
        raise DatasetLayoutError(f"{path} holds no class folders\n{layout}")
    return path


def load_rgb(path: str | Path) -> Image.Image:
    """torchvision's PIL loader (an RGB image), but a file that cannot be used raises naming itself.

    ``setup()`` finds bad files first; this catches those its time limit left unchecked.
    """
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as error:
        why = file_problem(Path(path)) or f"{type(error).__name__}: {error}"
        raise BadFilesError(
            f"{path}: {why}. Remove or replace it, or set data.on_bad_file=skip; "
            "python -m src.datamodules.check <the same data overrides> finds every such file"
        ) from error


def drop_samples(dataset: ImageFolder, files: Set[Path]) -> None:
    """Leave ``files`` out of ``dataset`` (its ``samples``, ``imgs`` and ``targets`` agree
    after)."""
    dataset.samples = [(path, label) for path, label in dataset.samples if Path(path) not in files]
    dataset.imgs = dataset.samples
    dataset.targets = [label for _, label in dataset.samples]


class ImageFolderDataModule(L.LightningDataModule):
    """Train/val(/test) class folders, with the standard ImageNet-style transforms.

    Training: random-resized crop to ``crop_size`` with ``crop_scale``, horizontal flip.
    Evaluation: resize the short side to ``resize_size``, center crop ``crop_size``.

    Args:
        root: folder holding ``train/``, ``val/`` and optionally ``test/``.
        num_classes: number of class folders expected (checked at setup); None takes any number.
        in_chans: 3 (RGB) or 1 (converted to grey).
        crop_size: side of the network input.
        resize_size: short side before the evaluation center crop.
        crop_scale: area range of the random-resized crop.
        mean, std: per-channel normalisation.
        batch_size: per-device batch size.
        num_workers: data-loading worker processes (and the threads of the file check).
        on_bad_file: "error" (``setup`` raises naming every bad image) or "skip" (leave them out,
            listed in ``<root>/bad_files.txt``).
        check_max_seconds: time limit of the file check in ``setup`` (None: none; 0: no check).

    Shape:
        batches are ((B, in_chans, crop_size, crop_size) float, (B,) int64 labels).
    """

    def __init__(
        self,
        root: str,
        num_classes: int | None,
        in_chans: int = 3,
        crop_size: int = 224,
        resize_size: int = 256,
        batch_size: int = 256,
        num_workers: int = 8,
        *,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        mean: tuple[float, ...] = IMAGENET_MEAN,
        std: tuple[float, ...] = IMAGENET_STD,
        on_bad_file: str = "error",
        check_max_seconds: float | None = 300.0,
    ) -> None:
        super().__init__()
        if in_chans not in (1, 3):
            raise ValueError(f"in_chans must be 3 (RGB) or 1 (grey), got {in_chans}")
        if in_chans != len(mean) or in_chans != len(std):
            raise ValueError(f"mean {mean} and std {std} need one value per channel ({in_chans})")
        self.root = Path(root)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.crop_size = crop_size
        self.resize_size = resize_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.crop_scale = tuple(crop_scale)
        self.mean = tuple(mean)
        self.std = tuple(std)
        self.on_bad_file = check_on_bad_file(on_bad_file)
        self.check_max_seconds = check_max_seconds
        self.splits: dict[str, ImageFolder] = {}

    def example_input(self, batch_size: int = 1) -> Tensor:
        """A zero batch with the shape the network receives: (batch_size, in_chans, crop, crop)."""
        return torch.zeros(batch_size, self.in_chans, self.crop_size, self.crop_size)

    def _transform(self, train: bool) -> v2.Compose:
        if train:
            geometry = [
                v2.RandomResizedCrop(self.crop_size, scale=self.crop_scale, antialias=True),
                v2.RandomHorizontalFlip(),
            ]
        else:
            geometry = [v2.Resize(self.resize_size, antialias=True), v2.CenterCrop(self.crop_size)]
        colour = [v2.Grayscale(num_output_channels=1)] if self.in_chans == 1 else []
        return v2.Compose(
            [
                v2.ToImage(),
                *colour,
                *geometry,
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(self.mean, self.std),
            ]
        )

    @property
    def has_test(self) -> bool:
        """Whether a labelled ``test/`` split exists (ImageNet has none: its val is the
        benchmark)."""
        return (self.root / "test").is_dir()

    def setup(self, stage: str | None = None) -> None:
        splits = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"]}.get(
            stage or "", ["train", "val"] + (["test"] if self.has_test else [])
        )
        folders = {
            split: check_split_dir(self.root, split) for split in splits if split not in self.splits
        }
        datasets = {}
        for split, folder in folders.items():
            try:
                dataset = ImageFolder(
                    str(folder), self._transform(split == "train"), loader=load_rgb
                )
            except FileNotFoundError as error:  # class folders without images
                raise DatasetLayoutError(f"{error}\n{LAYOUT.format(root=self.root)}") from error
            if self.num_classes is not None and len(dataset.classes) != self.num_classes:
                raise DatasetLayoutError(
                    f"{folder} has {len(dataset.classes)} class folders but "
                    f"data.num_classes={self.num_classes}\n{LAYOUT.format(root=self.root)}"
                )
            datasets[split] = dataset
        # one check over all splits, so that one message names every bad file
        files = [Path(path) for dataset in datasets.values() for path, _ in dataset.samples]
        bad = screen_files(
            files, self.root, on_bad_file=self.on_bad_file, max_seconds=self.check_max_seconds,
            workers=max(1, self.num_workers),
        )  # fmt: skip
        for split, dataset in datasets.items():
            if bad:
                drop_samples(dataset, bad)
            if not dataset.samples:
                raise DatasetLayoutError(
                    f"{folders[split]} has no usable images: data.on_bad_file=skip left out every "
                    "one"
                )
            self.splits[split] = dataset

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return resumable_loader(
            self.splits[split], self.batch_size, self.num_workers, shuffle=shuffle
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
