"""PASCAL VOC 2012 semantic segmentation, optionally with the SBD augmented training set.

21 classes (background and the 20 VOC objects, in the order of ``VOC_CLASSES``), ignore index 255
(the object borders of the VOC masks). With ``sbd_root`` the training split is the usual
"train_aug" set: VOC ``train`` together with the images listed in SBD's ``sbd_lists``, minus every
image of VOC ``val`` (so validation stays unseen), about 10,582 images. An image that VOC itself
annotates keeps VOC's mask; the others use SBD's ``cls/<id>.mat`` (``GTcls.Segmentation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.io

from src.datamodules.bad_files import decode_image
from src.datamodules.image_folder import DatasetLayoutError
from src.datamodules.segmentation import (
    Pairs,
    SegmentationDataModule,
    SegmentationFiles,
    read_png_mask,
    require_dir,
    require_file,
    require_files,
    segmentation_transform,
)

VOC_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair",
    "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
    "train", "tvmonitor",
)  # fmt: skip

LAYOUT = """expected layout:
    {root}/VOCdevkit/VOC2012/
        JPEGImages/<id>.jpg
        SegmentationClass/<id>.png                 (palette PNG: class index per pixel, 255 = ignore)
        ImageSets/Segmentation/train.txt, val.txt  (one <id> a line)"""  # noqa: E501 (a layout table row cannot wrap)

SBD_LAYOUT = """expected SBD layout (data.sbd_root):
    {root}/dataset/
        img/<id>.jpg
        cls/<id>.mat          (struct GTcls with field Segmentation: class index per pixel)
        train.txt, val.txt    (the lists named by data.sbd_lists, one <id> a line)"""


def read_sbd_mask(path: Path) -> np.ndarray:
    """Class ids of an SBD ``cls/<id>.mat`` file (its ``GTcls.Segmentation`` array)."""
    mat = scipy.io.loadmat(path, squeeze_me=True, struct_as_record=False)
    if "GTcls" not in mat or not hasattr(mat["GTcls"], "Segmentation"):
        raise DatasetLayoutError(f"{path} holds no GTcls.Segmentation array\n{SBD_LAYOUT}")
    return np.asarray(mat["GTcls"].Segmentation)


def read_mask(path: Path) -> np.ndarray:
    """A VOC palette PNG or an SBD .mat, chosen by suffix."""
    return read_sbd_mask(path) if path.suffix == ".mat" else read_png_mask(path)


def decode_voc_file(path: Path) -> None:
    """Decode an image or mask in full (an SBD .mat through :func:`read_sbd_mask`): the file
    check."""
    if path.suffix == ".mat":
        read_sbd_mask(path)
    else:
        decode_image(path)


def read_ids(path: Path, layout: str) -> list[str]:
    """The image ids listed in a split file, one a line."""
    ids = [
        line.strip() for line in require_file(path, layout, "split list").read_text().splitlines()
    ]
    ids = [i for i in ids if i]
    if not ids:
        raise DatasetLayoutError(f"split list {path} is empty\n{layout}")
    return ids


class VOCSegmentationDataModule(SegmentationDataModule):
    """PASCAL VOC 2012 segmentation (train / val), optionally with SBD (train_aug).

    Args:
        root: folder holding ``VOCdevkit/VOC2012``.
        num_classes: must be 21 (background + 20 objects).
        crop_size: (H, W) of the network input; training crops and evaluation resizes to it.
        batch_size: per-device batch size.
        num_workers: data-loading worker processes.
        in_chans: 3 (RGB).
        sbd_root: folder holding SBD's ``dataset/`` (the "benchmark_RELEASE" folder); ``None``
            trains on VOC ``train`` only (1,464 images).
        sbd_lists: SBD id lists under ``sbd_root/dataset/`` added to the training set.
        crop_scale: area range of the random-resized training crop.
        ignore_index: mask value of pixels that are not scored (VOC's object borders).
        on_bad_file: "error" (``setup`` raises naming every bad image or mask) or "skip" (leave
            their pairs out, the files listed in ``<root>/bad_files.txt``).
        check_max_seconds: time limit of the file check in ``setup`` (None: none; 0: no check).

    Shape:
        batches are ((B, 3, H, W) float normalised, (B, H, W) int64 in 0..20 or 255).
    """

    def __init__(
        self,
        root: str,
        num_classes: int = 21,
        crop_size: Sequence[int] = (256, 256),
        batch_size: int = 40,
        num_workers: int = 4,
        in_chans: int = 3,
        *,
        sbd_root: str | None = None,
        sbd_lists: Sequence[str] = ("train.txt", "val.txt"),
        crop_scale: Sequence[float] = (0.25, 1.0),
        ignore_index: int = 255,
        on_bad_file: str = "error",
        check_max_seconds: float | None = 300.0,
    ) -> None:
        super().__init__(
            crop_size,
            batch_size,
            num_workers,
            in_chans,
            on_bad_file=on_bad_file,
            check_max_seconds=check_max_seconds,
        )
        if num_classes != len(VOC_CLASSES):
            raise ValueError(
                f"VOC segmentation has {len(VOC_CLASSES)} classes, got num_classes={num_classes}"
            )
        if ignore_index != 255:
            raise ValueError(
                f"VOC masks mark ignored pixels with 255, got ignore_index={ignore_index}"
            )
        self.root = Path(root)
        self.num_classes = num_classes
        self.sbd_root = Path(sbd_root) if sbd_root is not None else None
        self.sbd_lists = tuple(sbd_lists)
        self.crop_scale = (float(crop_scale[0]), float(crop_scale[1]))
        self.ignore_index = ignore_index

    def _voc_samples(
        self, ids: Sequence[str], voc: Path, layout: str, split: str
    ) -> list[tuple[Path, Path]]:
        samples = [
            (voc / "JPEGImages" / f"{i}.jpg", voc / "SegmentationClass" / f"{i}.png") for i in ids
        ]
        require_files(
            [p for pair in samples for p in pair], layout, f"VOC {split} images and masks"
        )
        return samples

    def _train_samples(self, voc: Path, layout: str) -> list[tuple[Path, Path]]:
        lists = voc / "ImageSets" / "Segmentation"
        voc_train = read_ids(lists / "train.txt", layout)
        samples = self._voc_samples(voc_train, voc, layout, "train")
        if self.sbd_root is None:
            return samples
        sbd_layout = SBD_LAYOUT.format(root=self.sbd_root)
        sbd = require_dir(self.sbd_root / "dataset", sbd_layout, "SBD folder")
        # VOC's own masks are finer (they mark borders) and VOC val must stay unseen
        skip = set(voc_train) | set(read_ids(lists / "val.txt", layout))
        extra: dict[str, None] = {}  # ordered and without duplicates across the lists
        for name in self.sbd_lists:
            extra.update(
                dict.fromkeys(i for i in read_ids(sbd / name, sbd_layout) if i not in skip)
            )
        sbd_samples = [(sbd / "img" / f"{i}.jpg", sbd / "cls" / f"{i}.mat") for i in extra]
        require_files([p for pair in sbd_samples for p in pair], sbd_layout, "SBD images and masks")
        return samples + sbd_samples

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        layout = LAYOUT.format(root=self.root)
        if not self.root.is_dir():
            raise DatasetLayoutError(
                f"dataset root {self.root} does not exist; set data.root=/path/to/voc\n{layout}"
            )
        voc = require_dir(self.root / "VOCdevkit" / "VOC2012", layout)
        for folder in ("JPEGImages", "SegmentationClass"):
            require_dir(voc / folder, layout)
        val_ids = read_ids(voc / "ImageSets" / "Segmentation" / "val.txt", layout)
        samples: dict[str, Pairs] = {
            "train": self._train_samples(voc, layout),
            "val": self._voc_samples(val_ids, voc, layout, "val"),
        }
        for split, pairs in self.usable_pairs(samples, self.root, decode_voc_file).items():
            transform = segmentation_transform(
                split == "train", self.crop_size, crop_scale=self.crop_scale
            )
            self.splits[split] = SegmentationFiles(pairs, read_mask, transform)
