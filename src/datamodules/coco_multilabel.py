"""MS-COCO as a multi-label image classification set (thesis Table 3.7), read with pycocotools.

The target of an image is the multi-hot vector of the categories of its instance annotations
(crowd regions included: they still show the category). The 80 categories are indexed in the
order of their sorted COCO ids (1 person ... 90 toothbrush), so index 0 is ``person``.

Images without any annotation (about 1% of COCO) are kept, with an all-zero target, by default: the
network should learn to say "none of the 80", and the validation set stays the complete official
split. The common multi-label protocol (e.g. ML-GCN: 82,081 train / 40,137 val images of 2014)
drops them instead: ``keep_unannotated=False``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Set
from pathlib import Path

import lightning as L
import torch
from pycocotools.coco import COCO
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from src.datamodules.bad_files import check_on_bad_file, screen_files
from src.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD, DatasetLayoutError, load_rgb
from src.datamodules.loading import resumable_loader
from src.datamodules.segmentation import require_dir, require_file, require_files

YEARS = (2014, 2017)

LAYOUT = """expected layout:
    {root}/
        annotations/instances_train{year}.json, instances_val{year}.json
        train{year}/<file_name>.jpg   (the file_name of each image in the json)
        val{year}/<file_name>.jpg"""


class CocoMultiLabel(Dataset):
    """COCO images with multi-hot category targets.

    Args:
        image_dir: folder of the split's images.
        coco: the split's loaded instance annotations.
        category_ids: COCO category ids in label order.
        transform: image transform.
        keep_unannotated: keep images without annotations (all-zero target).

    Shape:
        an item is ((3, H, W) float32, (num_classes,) float32 in {0, 1}).
    """

    def __init__(
        self,
        image_dir: Path,
        coco: COCO,
        category_ids: list[int],
        transform: v2.Transform,
        *,
        keep_unannotated: bool = True,
    ) -> None:
        index = {cat: i for i, cat in enumerate(category_ids)}
        self.files: list[Path] = []
        targets = []
        for image_id in sorted(coco.getImgIds()):
            labels = {index[a["category_id"]] for a in coco.imgToAnns.get(image_id, [])}
            if not labels and not keep_unannotated:
                continue
            target = torch.zeros(len(category_ids))
            target[sorted(labels)] = 1.0
            self.files.append(image_dir / coco.imgs[image_id]["file_name"])
            targets.append(target)
        self.targets = torch.stack(targets) if targets else torch.zeros(0, len(category_ids))
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def drop(self, files: Set[Path]) -> None:
        """Leave ``files`` out, with their targets."""
        keep = [i for i, path in enumerate(self.files) if path not in files]
        self.files = [self.files[i] for i in keep]
        self.targets = self.targets[keep]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.transform(load_rgb(self.files[index])), self.targets[index]


class CocoMultiLabelDataModule(L.LightningDataModule):
    """COCO 2014/2017 train / val as 80-label multi-hot classification.

    Training: random-resized crop to ``crop_size`` with ``crop_scale``, horizontal flip.
    Evaluation: resize the short side to ``resize_size``, center crop ``crop_size``.
    ImageNet mean/std normalisation, so ImageNet-trained networks fine-tune directly.

    Args:
        root: folder holding ``annotations/`` and the ``train{year}/``, ``val{year}/`` images.
        num_classes: number of categories in the annotation file (80).
        year: 2014 or 2017.
        crop_size: side of the network input.
        resize_size: short side before the evaluation center crop.
        batch_size: per-device batch size.
        num_workers: data-loading worker processes.
        in_chans: 3 (RGB).
        crop_scale: area range of the random-resized crop.
        keep_unannotated: keep images without annotations, with an all-zero target.
        on_bad_file: "error" (``setup`` raises naming every bad image) or "skip" (leave them out,
            listed in ``<root>/bad_files.txt``).
        check_max_seconds: time limit of the file check in ``setup`` (None: none; 0: no check).

    Shape:
        batches are ((B, 3, crop_size, crop_size) float, (B, num_classes) float multi-hot).
    """

    has_test = False  # COCO test images have no public annotations

    def __init__(
        self,
        root: str,
        num_classes: int = 80,
        year: int = 2014,
        crop_size: int = 224,
        resize_size: int = 256,
        batch_size: int = 64,
        num_workers: int = 8,
        in_chans: int = 3,
        *,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        keep_unannotated: bool = True,
        on_bad_file: str = "error",
        check_max_seconds: float | None = 300.0,
    ) -> None:
        super().__init__()
        if in_chans != 3:
            raise ValueError(f"COCO images are RGB: in_chans must be 3, got {in_chans}")
        if year not in YEARS:
            raise ValueError(f"year must be one of {YEARS}, got {year}")
        self.root = Path(root)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.year = year
        self.crop_size = crop_size
        self.resize_size = resize_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.crop_scale = (float(crop_scale[0]), float(crop_scale[1]))
        self.keep_unannotated = keep_unannotated
        self.on_bad_file = check_on_bad_file(on_bad_file)
        self.check_max_seconds = check_max_seconds
        self.category_ids: list[int] = []
        self.splits: dict[str, CocoMultiLabel] = {}

    def example_input(self, batch_size: int = 1) -> Tensor:
        """A zero batch with the shape the network receives: (batch_size, 3, crop, crop)."""
        return torch.zeros(batch_size, self.in_chans, self.crop_size, self.crop_size)

    def _transform(self, train: bool) -> v2.Compose:
        if train:
            geometry = [
                v2.RandomResizedCrop(self.crop_size, scale=self.crop_scale, antialias=True),
                v2.RandomHorizontalFlip(),
            ]
        else:
            geometry = [v2.Resize(self.resize_size, antialias=True), v2.CenterCrop(self.crop_size)]
        return v2.Compose(
            [
                v2.ToImage(),
                *geometry,
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )

    def _load(self, split: str, layout: str) -> CocoMultiLabel:
        annotations = require_file(
            self.root / "annotations" / f"instances_{split}{self.year}.json", layout
        )
        image_dir = require_dir(self.root / f"{split}{self.year}", layout)
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            coco = COCO(str(annotations))
        category_ids = sorted(coco.getCatIds())
        if len(category_ids) != self.num_classes:
            raise DatasetLayoutError(
                f"{annotations} lists {len(category_ids)} categories but "
                f"data.num_classes={self.num_classes}\n{layout}"
            )
        if self.category_ids and category_ids != self.category_ids:
            raise DatasetLayoutError(
                f"{annotations} lists other categories than the train split\n{layout}"
            )
        self.category_ids = category_ids
        dataset = CocoMultiLabel(
            image_dir,
            coco,
            category_ids,
            self._transform(split == "train"),
            keep_unannotated=self.keep_unannotated,
        )
        if len(dataset) == 0:
            raise DatasetLayoutError(f"{annotations} lists no usable images\n{layout}")
        require_files(dataset.files, layout, f"{split}{self.year} images")
        return dataset

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        layout = LAYOUT.format(root=self.root, year=self.year)
        if not self.root.is_dir():
            raise DatasetLayoutError(
                f"dataset root {self.root} does not exist; set data.root=/path/to/coco\n{layout}"
            )
        splits = {split: self._load(split, layout) for split in ("train", "val")}
        files = [path for dataset in splits.values() for path in dataset.files]
        bad = screen_files(
            files, self.root, on_bad_file=self.on_bad_file, max_seconds=self.check_max_seconds,
            workers=max(1, self.num_workers),
        )  # fmt: skip
        for split, dataset in splits.items():
            if bad:
                dataset.drop(bad)
            if len(dataset) == 0:
                raise DatasetLayoutError(
                    f"no usable {split}{self.year} images: data.on_bad_file=skip left out every one"
                )
        self.splits = splits

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return resumable_loader(
            self.splits[split], self.batch_size, self.num_workers, shuffle=shuffle
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)
