"""MS-COCO 2017 object detection, read with pycocotools, as EdgeNets' COCO loader does.

Training uses the ``train2017`` images that have annotations (pycocotools' ``imgToAnns`` keys),
without crowd regions and degenerate boxes; an image left without a box is skipped. Validation
and test use all of ``val2017`` (5,000 images), crowd regions kept and flagged ``difficult`` (the
metric scores detections on them as neither hits nor misses). The 80 categories map to labels
1..80 in the order of their sorted COCO ids. COCO boxes are (x, y, w, h) in pixels; they become
(x1, y1, x2, y2), clipped to the image (counted) and normalised by its size. An annotation
naming a category the file does not list is dropped and counted (:mod:`.detection`).
"""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np
from pycocotools.coco import COCO

from src.datamodules.detection import (
    BoxReport,
    DetectionDataModule,
    DetectionRecord,
    make_record,
)
from src.datamodules.image_folder import DatasetLayoutError
from src.datamodules.segmentation import require_dir, require_file

# the 80 categories of the 2017 instance files, in the order of their sorted ids (1 ... 90)
COCO_OBJECTS = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant",
    "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors",
    "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip

LAYOUT = """expected layout:
    {root}/
        annotations/instances_train2017.json, instances_val2017.json
        train2017/<file_name>   (the file_name of each image in the json)
        val2017/<file_name>"""


class COCODetectionDataModule(DetectionDataModule):
    """MS-COCO 2017 detection: train2017 (annotated images) / val2017 (validation and test).

    Args:
        root: folder holding ``annotations/`` and the ``train2017/``, ``val2017/`` images.
        num_classes: 81 (background + the 80 categories of the annotation files).
        image_size: side S of the square network input (300 or 512).
        batch_size: per-device batch size.
        num_workers: data-loading worker processes.
        on_bad_file: "error" (``setup`` raises naming every missing or bad image) or "skip".
        check_max_seconds: time limit of the file check in ``setup`` (None: none; 0: no check).

    Shape:
        batches are ((B, 3, S, S) float normalised, list of B target dicts; ``image_id`` is the
        COCO image id), see :class:`src.datamodules.detection.DetectionFiles`.
    """

    def __init__(
        self,
        root: str,
        num_classes: int = 81,
        image_size: int = 300,
        batch_size: int = 32,
        num_workers: int = 4,
        *,
        on_bad_file: str = "error",
        check_max_seconds: float | None = 300.0,
    ) -> None:
        # setup() takes the names from the annotation file; until then COCO's, or placeholders
        # for a file with another category count
        names = COCO_OBJECTS
        if num_classes != len(COCO_OBJECTS) + 1:
            names = tuple(f"class{i}" for i in range(1, num_classes))
        super().__init__(
            root, num_classes, names, image_size, batch_size, num_workers,
            on_bad_file=on_bad_file, check_max_seconds=check_max_seconds,
        )  # fmt: skip
        self.category_ids: list[int] = []

    def _load(self, split: str, layout: str) -> COCO:
        annotations = require_file(
            self.root / "annotations" / f"instances_{split}2017.json", layout
        )
        require_dir(self.root / f"{split}2017", layout)
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            coco = COCO(str(annotations))
        categories = sorted(coco.getCatIds())
        if len(categories) + 1 != self.num_classes:
            raise DatasetLayoutError(
                f"{annotations} lists {len(categories)} categories but data.num_classes="
                f"{self.num_classes} (background + categories)\n{layout}"
            )
        if self.category_ids and categories != self.category_ids:
            raise DatasetLayoutError(f"{annotations} lists other categories than train2017")
        if not self.category_ids:
            self.category_ids = categories
            names = tuple(coco.cats[c]["name"] for c in categories)
            self.class_names = ("background", *names)
        return coco

    def _records(self, coco: COCO, split: str, report: BoxReport) -> list[DetectionRecord]:
        train = split == "train"
        labels = {c: i + 1 for i, c in enumerate(self.category_ids)}
        image_ids = sorted(coco.getImgIds())
        if train:  # the images that have annotations, as the code's COCO loader
            image_ids = [i for i in image_ids if coco.imgToAnns.get(i)]
        records = []
        for image_id in image_ids:
            info = coco.imgs[image_id]
            boxes, classes, crowd = [], [], []
            for ann in coco.imgToAnns.get(image_id, []):
                if ann["category_id"] not in labels:
                    report.count_unknown(str(ann["category_id"]))
                    continue
                x, y, w, h = ann["bbox"]
                boxes.append((x, y, x + w, y + h))
                classes.append(labels[ann["category_id"]])
                crowd.append(bool(ann.get("iscrowd", 0)))
            record = make_record(
                self.root / f"{split}2017" / info["file_name"],
                np.array(boxes, dtype=np.float32).reshape(-1, 4),
                classes,
                crowd,
                image_id=int(image_id),
                size=(int(info["height"]), int(info["width"])),
                train=train,
                report=report,
            )
            if record is not None:
                records.append(record)
        return records

    def read_records(self) -> dict[str, tuple[list[DetectionRecord], BoxReport]]:
        layout = LAYOUT.format(root=self.root)
        if not self.root.is_dir():
            raise DatasetLayoutError(
                f"dataset root {self.root} does not exist; set data.root=/path/to/coco\n{layout}"
            )
        train = self._load("train", layout)
        val = self._load("val", layout)
        train_report, val_report = BoxReport("train"), BoxReport("val")
        train_records = self._records(train, "train", train_report)
        records = self._records(val, "val", val_report)
        test_report = copy.deepcopy(val_report)
        test_report.split = "test"
        return {
            "train": (train_records, train_report),
            "val": (records, val_report),
            "test": (records, test_report),
        }
