"""What the object-detection datamodules share: annotation records, box sanitising with counts,
the SSD augmentation, the dataset, the collate and the loaders.

Boxes are (x1, y1, x2, y2). Records hold them in pixels of the original image; every item leaves
the dataset with them normalised to [0, 1] by the width and height of the image the network sees
(after a resize only, that is the original image's width and height).

``setup()`` reads every annotation once, so that bad inputs are found and counted before the
first step, never mid-epoch (:class:`BoxReport`):

- a box reaching outside the image is clipped to it (counted);
- a box of zero width or height, as given or after clipping, is dropped (counted);
- a box naming an unknown class is dropped (counted; the first few names are reported);
- an image left without objects is kept for evaluation and skipped for training (counted);
- a missing, empty or undecodable image, or one whose size differs from its annotation, is found
  by :func:`src.datamodules.bad_files.screen_files`: ``on_bad_file="error"`` stops naming them
  all, ``"skip"`` leaves them out (counted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from src.datamodules.bad_files import check_on_bad_file, decode_image, screen_files
from src.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD, DatasetLayoutError
from src.datamodules.loading import resumable_loader
from src.datamodules.segmentation import read_rgb

log = logging.getLogger(__name__)

# ssd.pytorch's Expand fills the canvas with the mean pixel; rounded for uint8 images
ZOOM_OUT_FILL = tuple(round(255 * m) for m in IMAGENET_MEAN)
# RandomSampleCrop's modes in the official code: the whole image, min IoU 0.1/0.3/0.7/0.9 and
# any crop (0.0); torchvision's default also has 0.5, which the code lacks
IOU_CROP_OPTIONS = (1.0, 0.1, 0.3, 0.7, 0.9, 0.0)
SHOWN_NAMES = 5  # unknown class names quoted in a report

Target = dict[str, Any]
Batch = tuple[Tensor, list[Target]]


@dataclass(frozen=True)
class DetectionRecord:
    """One annotated image.

    Args:
        path: the image file.
        boxes: (N, 4) float32 (x1, y1, x2, y2) in pixels of the original image, inside it.
        labels: (N,) int64 class ids in 1..C-1 (0 is background).
        difficult: (N,) bool; VOC "difficult" objects and COCO crowd regions (scored as neither
            hits nor misses).
        image_id: the image's id in its dataset (COCO id; position in the split for VOC).
        size: (H, W) of the image, as the annotation gives it.
    """

    path: Path
    boxes: np.ndarray
    labels: np.ndarray
    difficult: np.ndarray
    image_id: int
    size: tuple[int, int]


@dataclass
class BoxReport:
    """What ``setup()`` found in and did to the annotations of one split.

    Args:
        split: "train", "val" or "test".
        images: images kept.
        boxes: boxes kept (difficult ones included where kept).
        difficult: difficult or crowd boxes (kept and flagged for evaluation, dropped in training).
        clipped: boxes that reached outside their image, clipped to it.
        zero_area: boxes without width or height (as given or after clipping), dropped.
        unknown_class: boxes naming a class not in the class list, dropped.
        without_objects: images without a box (kept for evaluation, skipped in training).
        bad_files: images left out because the file is missing or bad (``on_bad_file="skip"``).
        unknown_names: the first few unknown class names met.
    """

    split: str
    images: int = 0
    boxes: int = 0
    difficult: int = 0
    clipped: int = 0
    zero_area: int = 0
    unknown_class: int = 0
    without_objects: int = 0
    bad_files: int = 0
    unknown_names: list[str] = field(default_factory=list)

    def count_unknown(self, name: str) -> None:
        """Count a box with an unknown class name, remembering the first few names."""
        self.unknown_class += 1
        if name not in self.unknown_names and len(self.unknown_names) < SHOWN_NAMES:
            self.unknown_names.append(name)

    @property
    def problems(self) -> bool:
        return bool(self.clipped or self.zero_area or self.unknown_class or self.bad_files)

    def summary(self) -> str:
        """One line: the counts, what was done with each, the first unknown class names."""
        fate = "skipped" if self.split == "train" else "kept"
        difficult = "dropped" if self.split == "train" else "kept, flagged"
        text = (
            f"{self.split}: {self.images} images, {self.boxes} boxes; {self.difficult} difficult "
            f"({difficult}), {self.clipped} clipped to the image, {self.zero_area} of zero area "
            f"dropped, {self.unknown_class} of an unknown class dropped, {self.without_objects} "
            f"images without objects ({fate}), {self.bad_files} bad image files left out"
        )
        if self.unknown_names:
            text += f"; unknown classes: {', '.join(map(repr, self.unknown_names))}"
        return text


def clean_boxes(
    boxes: np.ndarray, size: tuple[int, int], report: BoxReport
) -> tuple[np.ndarray, np.ndarray]:
    """Clip pixel boxes to the image and find those left without area; counts go to ``report``.

    Shape:
        boxes: (N, 4) (x1, y1, x2, y2) pixels; returns the clipped (N, 4) float32 and a (N,)
        bool mask of the boxes to keep.
    """
    height, width = size
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    clipped = boxes.copy()
    clipped[:, 0::2] = clipped[:, 0::2].clip(0, width)
    clipped[:, 1::2] = clipped[:, 1::2].clip(0, height)
    keep = (clipped[:, 2] > clipped[:, 0]) & (clipped[:, 3] > clipped[:, 1])
    report.clipped += int(((clipped != boxes).any(axis=1) & keep).sum())
    report.zero_area += int((~keep).sum())
    return clipped, keep


def make_record(
    path: Path,
    boxes: np.ndarray,
    labels: Sequence[int],
    difficult: Sequence[bool],
    *,
    image_id: int,
    size: tuple[int, int],
    train: bool,
    report: BoxReport,
) -> DetectionRecord | None:
    """A record of known-class boxes (unknown ones already counted), clipped and without
    zero-area boxes; difficult boxes are dropped for training. ``None`` when a training image is
    left without objects. Counts go to ``report``.

    Shape:
        boxes: (N, 4) pixels; labels, difficult: (N,).
    """
    boxes, keep = clean_boxes(boxes, size, report)
    labels_array = np.asarray(labels, dtype=np.int64).reshape(-1)
    flags = np.asarray(difficult, dtype=bool).reshape(-1)
    report.difficult += int((flags & keep).sum())
    if train:
        keep &= ~flags
    boxes, labels_array, flags = boxes[keep], labels_array[keep], flags[keep]
    if len(boxes) == 0:
        report.without_objects += 1
        if train:
            return None
    report.images += 1
    report.boxes += len(boxes)
    return DetectionRecord(path, boxes, labels_array, flags, image_id, size)


def image_size_check(records: Iterable[DetectionRecord]) -> Callable[[Path], None]:
    """A file reader for :func:`screen_files`: decodes the image in full and raises when its size
    differs from the size its annotation gives (the boxes would then be wrong)."""
    sizes = {record.path: record.size for record in records}

    def read(path: Path) -> None:
        decode_image(path)
        with Image.open(path) as image:
            width, height = image.size
        expected = sizes.get(path)
        if expected is not None and expected != (height, width):
            raise ValueError(
                f"the image is {width}x{height} but its annotation says {expected[1]}x{expected[0]}"
            )

    return read


def labels_and_flags(inputs: tuple[Any, Target]) -> tuple[Tensor, Tensor]:
    """The per-box tensors ``SanitizeBoundingBoxes`` filters along with the boxes."""
    target = inputs[1]
    return target["labels"], target["difficult"]


def detection_transform(train: bool, image_size: int) -> v2.Compose:
    """Joint transform of a (3, H, W) uint8 ``tv_tensors.Image`` and a target dict holding
    ``tv_tensors.BoundingBoxes`` (pixels), ``labels`` and ``difficult``.

    Training (ssd.pytorch's augmentation as EdgeNets uses it, with torchvision's equivalents):
    photometric distortion, zoom out (p 0.5, canvas up to 4x the side, filled with the mean
    pixel), an IoU-constrained random crop keeping boxes whose centres fall inside, horizontal
    flip, sanitising (boxes under a pixel dropped), resize to ``image_size`` squared (aspect not
    kept, as the code's ``Resize``). Evaluation: the resize only. The image is scaled to [0, 1]
    and normalised with the ImageNet mean and std.
    """
    size = (image_size, image_size)
    augment: list[v2.Transform] = []
    if train:
        augment = [
            v2.RandomPhotometricDistort(p=0.5),
            v2.RandomZoomOut(fill={tv_tensors.Image: ZOOM_OUT_FILL, "others": 0}, p=0.5),
            v2.RandomIoUCrop(sampler_options=list(IOU_CROP_OPTIONS), trials=50),
            v2.RandomHorizontalFlip(),
            v2.SanitizeBoundingBoxes(labels_getter=labels_and_flags),
        ]
    return v2.Compose(
        [
            *augment,
            v2.Resize(size, antialias=True),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


class DetectionFiles(Dataset):
    """Annotated images read into a normalised image and a target dict.

    Args:
        records: the split's images and boxes.
        transform: joint transform (:func:`detection_transform`).

    Shape:
        an item is ((3, S, S) float32, target) with target ``boxes`` (N, 4) float32 in [0, 1],
        ``labels`` (N,) int64, ``difficult`` (N,) bool, ``image_id`` int, ``orig_size`` (H, W).
    """

    def __init__(self, records: Sequence[DetectionRecord], transform: v2.Transform) -> None:
        self.records = list(records)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[Tensor, Target]:
        record = self.records[index]
        image = read_rgb(record.path)
        height, width = image.shape[-2:]
        boxes = tv_tensors.BoundingBoxes(
            torch.from_numpy(record.boxes), format="XYXY", canvas_size=(height, width)
        )
        # a size mismatch the time-capped file check missed must not stop the epoch
        boxes = v2.functional.clamp_bounding_boxes(boxes)
        target = {
            "boxes": boxes,
            "labels": torch.from_numpy(record.labels),
            "difficult": torch.from_numpy(record.difficult),
        }
        image, target = self.transform(image, target)
        out_height, out_width = image.shape[-2:]
        scale = torch.tensor([out_width, out_height, out_width, out_height], dtype=torch.float32)
        normalised = (target["boxes"].as_subclass(Tensor).float() / scale).clamp_(0.0, 1.0)
        return image.as_subclass(Tensor), {
            "boxes": normalised.reshape(-1, 4),
            "labels": target["labels"].long(),
            "difficult": target["difficult"].bool(),
            "image_id": record.image_id,
            "orig_size": (int(height), int(width)),
        }


def detection_collate(batch: Sequence[tuple[Tensor, Target]]) -> Batch:
    """Stack the images and keep the targets as a list (their box counts differ).

    Shape:
        returns ((B, 3, S, S), list of B target dicts).
    """
    images, targets = zip(*batch)
    return torch.stack(images), list(targets)


class DetectionDataModule(L.LightningDataModule):
    """Loaders, example input, the file check and the reports shared by the detection
    datamodules; subclasses read their annotations into records (:meth:`read_records`).

    Args:
        root: the dataset folder (bad-file lists are written there).
        num_classes: classes including background (index 0).
        class_names: the object class names, in label order 1..C-1.
        image_size: side S of the square network input.
        batch_size: per-device batch size.
        num_workers: data-loading worker processes.
        on_bad_file: "error" (``setup`` raises naming every missing or bad image) or "skip"
            (leave them out, listed in ``<root>/bad_files.txt``).
        check_max_seconds: time limit of the file check in ``setup`` (None: none; 0: no check).

    Shape:
        batches are ((B, 3, S, S) float normalised, list of B target dicts), see
        :class:`DetectionFiles`.
    """

    has_test = True

    def __init__(
        self,
        root: str,
        num_classes: int,
        class_names: Sequence[str],
        image_size: int,
        batch_size: int,
        num_workers: int,
        *,
        on_bad_file: str = "error",
        check_max_seconds: float | None = 300.0,
    ) -> None:
        super().__init__()
        if num_classes != len(class_names) + 1:
            raise ValueError(
                f"num_classes must be {len(class_names) + 1} (background + {len(class_names)} "
                f"classes), got {num_classes}"
            )
        if image_size < 1:
            raise ValueError(f"image_size must be positive, got {image_size}")
        self.root = Path(root)
        self.num_classes = num_classes
        self.class_names = ("background", *class_names)  # indexed by label
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.on_bad_file = check_on_bad_file(on_bad_file)
        self.check_max_seconds = check_max_seconds
        self.splits: dict[str, DetectionFiles] = {}
        self.reports: dict[str, BoxReport] = {}

    def read_records(self) -> dict[str, tuple[list[DetectionRecord], BoxReport]]:
        """Split -> (records, its own report) for "train", "val" and "test"."""
        raise NotImplementedError

    def example_input(self, batch_size: int = 1) -> Tensor:
        """A zero batch with the shape the network receives: (batch_size, 3, S, S)."""
        return torch.zeros(batch_size, 3, self.image_size, self.image_size)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        records = self.read_records()
        everything = [r for split_records, _ in records.values() for r in split_records]
        unique = list({r.path: r for r in everything}.values())
        bad = screen_files(
            [r.path for r in unique], self.root, on_bad_file=self.on_bad_file,
            read=image_size_check(unique), max_seconds=self.check_max_seconds,
            workers=max(1, self.num_workers),
        )  # fmt: skip
        for split, (split_records, report) in records.items():
            usable = [r for r in split_records if r.path not in bad]
            report.bad_files = len(split_records) - len(usable)
            report.images -= report.bad_files
            report.boxes -= sum(len(r.boxes) for r in split_records if r.path in bad)
            if not usable:
                raise DatasetLayoutError(
                    f"no usable {split} images under {self.root}: {report.summary()}"
                )
            log_report = log.warning if report.problems else log.info
            log_report("%s: %s", self.root, report.summary())
            self.reports[split] = report
            transform = detection_transform(split == "train", self.image_size)
            self.splits[split] = DetectionFiles(usable, transform)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        loader = resumable_loader(
            self.splits[split], self.batch_size, self.num_workers, shuffle=shuffle
        )
        loader.collate_fn = detection_collate  # targets stay a list: their box counts differ
        return loader

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
