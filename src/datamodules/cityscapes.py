"""Cityscapes semantic segmentation (fine annotations), read by ``torchvision.datasets.Cityscapes``.

The ``gtFine/*_labelIds.png`` masks hold the 34 Cityscapes label ids; they are mapped to the 19
train ids of the benchmark (road 0 ... bicycle 18, torchvision's ``Cityscapes.classes`` table).
Every other label id (void, ego vehicle, parking, ...) becomes either

- ``background_class=True`` (default): class 19, ``background``. The networks then have 20
  outputs, the layout the official EdgeNets Cityscapes weights expect. The official training gives
  this class zero loss weight and its evaluation scores only the 19 classes, which is what
  ``ignore_index=19`` gives: background pixels are left out of the loss and of the metrics, while
  a background prediction on a real class still counts as a miss of that class.
- ``background_class=False``: 255, the standard 19-class benchmark with ``ignore_index=255``.

Validation resizes images and masks to ``crop_size``; the benchmark scores predictions at the
label size (2048x1024), which ``eval_full_resolution=True`` gives
(:mod:`src.evaluation.cityscapes_eval` scores them with the official script).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor
from torchvision import tv_tensors
from torchvision.datasets import Cityscapes
from torchvision.transforms import v2

from src.datamodules.image_folder import DatasetLayoutError
from src.datamodules.segmentation import (
    Pairs,
    SegmentationDataModule,
    mask_values,
    require_dir,
    require_files,
    segmentation_transform,
)

NUM_TRAIN_IDS = 19
BACKGROUND = 19

LAYOUT = """expected layout:
    {root}/
        leftImg8bit/train/<city>/<city>_<seq>_<frame>_leftImg8bit.png
        leftImg8bit/val/<city>/...
        gtFine/train/<city>/<city>_<seq>_<frame>_gtFine_labelIds.png   (label ids 0..33)
        gtFine/val/<city>/..."""


def train_id_table(background_class: bool) -> Tensor:
    """(256,) int64 look-up table from label id to train id; unlisted ids go to 19 or 255."""
    table = torch.full((256,), BACKGROUND if background_class else 255, dtype=torch.int64)
    for label in Cityscapes.classes:
        if 0 <= label.train_id < NUM_TRAIN_IDS:
            table[label.id] = label.train_id
    return table


class CityscapesTransform:
    """Joint transform of a Cityscapes (PIL image, PIL labelIds mask) pair: map the label ids to
    train ids, then apply ``transform`` to both, or to the image alone with ``image_only`` (the
    mask keeps its stored size, 2048x1024 for Cityscapes).

    Shape:
        returns ((3, h, w) float32, (H, W) int64); (h, w) = (H, W) unless ``image_only``.
    """

    def __init__(self, table: Tensor, transform: v2.Transform, *, image_only: bool = False) -> None:
        self.table = table
        self.transform = transform
        self.image_only = image_only

    def __call__(self, image: Image.Image, mask: Image.Image) -> tuple[Tensor, Tensor]:
        label_ids = torch.from_numpy(mask_values(mask, mask.filename)).long()
        pixels = tv_tensors.Image(v2.functional.pil_to_tensor(image))
        if self.image_only:
            return self.transform(pixels).as_subclass(Tensor), self.table[label_ids]
        image_t, mask_t = self.transform(pixels, tv_tensors.Mask(self.table[label_ids]))
        return image_t.as_subclass(Tensor), mask_t.as_subclass(Tensor)


class CityscapesDataModule(SegmentationDataModule):
    """Cityscapes fine annotations (train / val) mapped to train ids.

    Args:
        root: folder holding ``leftImg8bit/`` and ``gtFine/``.
        num_classes: 20 with ``background_class``, else 19.
        crop_size: (H, W) of the network input; training crops and evaluation resizes to it
            (the EdgeNets "512 256" is (256, 512) here).
        batch_size: per-device batch size.
        num_workers: data-loading worker processes.
        in_chans: 3 (RGB).
        background_class: unlisted label ids become class 19 (True) or 255 (False).
        ignore_index: the mask value left out of loss and metrics: 19 with ``background_class``
            (the official protocol), else 255.
        crop_scale: area range of the random-resized training crop.
        eval_full_resolution: validation images are still resized to ``crop_size``, but their
            masks keep the stored label size (2048x1024); the task up-samples the logits
            bilinearly to it, so mIoU is scored against the original labels, as the official
            benchmark does. False resizes the masks with the images (nearest neighbour).
        on_bad_file: "error" (``setup`` raises naming every bad image or mask) or "skip" (leave
            their pairs out, the files listed in ``<root>/bad_files.txt``).
        check_max_seconds: time limit of the file check in ``setup`` (None: none; 0: no check).

    Shape:
        batches are ((B, 3, H, W) float normalised, (B, H, W) int64 train ids), (H, W) =
        ``crop_size``; with ``eval_full_resolution`` validation masks are (B, 1024, 2048).
    """

    def __init__(
        self,
        root: str,
        num_classes: int = 20,
        crop_size: Sequence[int] = (256, 512),
        batch_size: int = 25,
        num_workers: int = 4,
        in_chans: int = 3,
        *,
        background_class: bool = True,
        ignore_index: int = BACKGROUND,
        crop_scale: Sequence[float] = (0.0625, 0.25),
        eval_full_resolution: bool = False,
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
        expected = (20, BACKGROUND) if background_class else (19, 255)
        if (num_classes, ignore_index) != expected:
            raise ValueError(
                f"background_class={background_class} needs num_classes={expected[0]} and "
                f"ignore_index={expected[1]}, got num_classes={num_classes}, "
                f"ignore_index={ignore_index}"
            )
        self.root = Path(root)
        self.num_classes = num_classes
        self.background_class = background_class
        self.ignore_index = ignore_index
        self.crop_scale = (float(crop_scale[0]), float(crop_scale[1]))
        self.eval_full_resolution = eval_full_resolution

    def _pairs(self, split: str, layout: str) -> Pairs:
        """The split's (image, labelIds mask) files; raises naming a missing folder or mask."""
        images = require_dir(self.root / "leftImg8bit" / split, layout)
        masks = require_dir(self.root / "gtFine" / split, layout)
        files = sorted(images.glob("*/*_leftImg8bit.png"))
        if not files:
            raise DatasetLayoutError(f"{images} holds no <city>/*_leftImg8bit.png images\n{layout}")
        expected = [
            masks / f.parent.name / f.name.replace("_leftImg8bit.png", "_gtFine_labelIds.png")
            for f in files
        ]
        require_files(expected, layout, f"gtFine {split} labelIds masks")
        return list(zip(files, expected))

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        layout = LAYOUT.format(root=self.root)
        if not self.root.is_dir():
            raise DatasetLayoutError(
                f"dataset root {self.root} does not exist; set "
                f"data.root=/path/to/cityscapes\n{layout}"
            )
        table = train_id_table(self.background_class)
        usable = self.usable_pairs(
            {split: self._pairs(split, layout) for split in ("train", "val")}, self.root
        )
        for split, pairs in usable.items():
            transform = segmentation_transform(
                split == "train", self.crop_size, crop_scale=self.crop_scale
            )
            dataset = Cityscapes(
                str(self.root), split=split, mode="fine", target_type="semantic",
                transforms=CityscapesTransform(
                    table, transform, image_only=self.eval_full_resolution and split != "train"
                ),
            )  # fmt: skip
            # torchvision lists the files itself: keep those the check let through
            keep = {image for image, _ in pairs}
            kept = [pair for pair in zip(dataset.images, dataset.targets) if Path(pair[0]) in keep]
            dataset.images = [image for image, _ in kept]
            dataset.targets = [targets for _, targets in kept]
            self.splits[split] = dataset
