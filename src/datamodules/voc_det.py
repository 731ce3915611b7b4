"""PASCAL VOC object detection: train on VOC2007 + VOC2012 trainval, validate and test on VOC2007
test, as EdgeNets' ``train_detection.py`` does (16,551 / 4,952 images).

Boxes are read from the XML annotations minus 1 (VOC counts pixels from 1; the code's 0-based
boxes), clipped to the image and normalised by its size. Difficult objects are dropped for
training (the code's ``keep_difficult=False``) and kept, flagged, for evaluation (the VOC07
metric ignores them). 20 classes after background, in the standard order. Bad inputs are
counted and reported at ``setup`` (:mod:`src.datamodules.detection`); a box naming a class outside
``class_names`` is dropped and counted, its name quoted in the report.
"""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from src.datamodules.detection import (
    BoxReport,
    DetectionDataModule,
    DetectionRecord,
    make_record,
)
from src.datamodules.image_folder import DatasetLayoutError
from src.datamodules.segmentation import require_dir, require_files
from src.datamodules.voc_seg import VOC_CLASSES, read_ids

VOC_OBJECTS = VOC_CLASSES[1:]  # the 20 object classes; label = position + 1

VOC_TRAIN_SETS = (("VOCdevkit/VOC2007", "trainval"), ("VOCdevkit/VOC2012", "trainval"))
VOC_TEST_SET = ("VOCdevkit/VOC2007", "test")

LAYOUT = """expected layout (each image set a folder under {root}):
    {root}/VOCdevkit/VOC2007/, {root}/VOCdevkit/VOC2012/
        Annotations/<id>.xml      (PASCAL VOC XML: size, object/name, difficult, bndbox)
        JPEGImages/<id>.jpg
        ImageSets/Main/trainval.txt, test.txt   (one <id> a line; VOC2012 needs trainval only)"""

VOCObject = tuple[str, tuple[float, float, float, float], bool]  # name, 0-based box, difficult


def read_voc_xml(path: Path) -> tuple[tuple[int, int] | None, list[VOCObject]]:
    """The (H, W) an annotation gives (None when absent) and its objects, boxes minus 1."""
    try:
        root = ET.parse(path).getroot()
        size = root.find("size")
        hw = None
        if size is not None:
            hw = (int(float(size.findtext("height", "0"))), int(float(size.findtext("width", "0"))))
        objects = []
        for obj in root.iter("object"):
            box = obj.find("bndbox")
            if box is None:
                raise ValueError("an object has no bndbox")
            keys = ("xmin", "ymin", "xmax", "ymax")
            corners = tuple(float(box.findtext(k, "nan")) - 1 for k in keys)
            if any(np.isnan(corners)):
                raise ValueError(f"a bndbox lacks a corner: {corners}")
            name = (obj.findtext("name") or "").strip()
            difficult = int(float(obj.findtext("difficult", "0") or 0)) == 1
            objects.append((name, corners, difficult))
    except (ET.ParseError, ValueError) as error:
        raise DatasetLayoutError(f"annotation {path} cannot be read: {error}") from error
    return (hw if hw and min(hw) > 0 else None), objects  # type: ignore[return-value]


def image_header_size(path: Path) -> tuple[int, int]:
    """(H, W) from the image header; (0, 0) when it cannot be opened (the file check names it)."""
    try:
        with Image.open(path) as image:
            return image.height, image.width
    except OSError:
        return 0, 0


class VOCDetectionDataModule(DetectionDataModule):
    """PASCAL VOC detection (VOC07+12 trainval / VOC07 test) in the VOC devkit layout.

    Args:
        root: folder holding the image sets (``VOCdevkit/VOC2007``, ``VOCdevkit/VOC2012``).
        num_classes: ``len(class_names) + 1`` (21 for VOC).
        image_size: side S of the square network input (300 or 512).
        batch_size: per-device batch size.
        num_workers: data-loading worker processes.
        train_sets: (folder under ``root``, ImageSets/Main list) pairs joined for training.
        test_set: the (folder, list) pair used for validation and test.
        class_names: object classes in label order 1..C-1 (the XML ``name`` values).
        on_bad_file: "error" (``setup`` raises naming every missing or bad image) or "skip".
        check_max_seconds: time limit of the file check in ``setup`` (None: none; 0: no check).

    Shape:
        batches are ((B, 3, S, S) float normalised, list of B target dicts), see
        :class:`src.datamodules.detection.DetectionFiles`.
    """

    def __init__(
        self,
        root: str,
        num_classes: int = 21,
        image_size: int = 300,
        batch_size: int = 32,
        num_workers: int = 4,
        *,
        train_sets: Sequence[Sequence[str]] = VOC_TRAIN_SETS,
        test_set: Sequence[str] = VOC_TEST_SET,
        class_names: Sequence[str] = VOC_OBJECTS,
        on_bad_file: str = "error",
        check_max_seconds: float | None = 300.0,
    ) -> None:
        super().__init__(
            root, num_classes, tuple(class_names), image_size, batch_size, num_workers,
            on_bad_file=on_bad_file, check_max_seconds=check_max_seconds,
        )  # fmt: skip
        self.train_sets = [self._image_set(s) for s in train_sets]
        self.test_set = self._image_set(test_set)
        if not self.train_sets:
            raise ValueError("train_sets names no image set")
        self.labels = {name: i + 1 for i, name in enumerate(class_names)}

    @staticmethod
    def _image_set(pair: Sequence[str]) -> tuple[str, str]:
        if len(pair) != 2:
            raise ValueError(f"an image set is (folder, list name), got {list(pair)}")
        return str(pair[0]), str(pair[1])

    def _records(
        self, image_sets: Sequence[tuple[str, str]], split: str, layout: str
    ) -> tuple[list[DetectionRecord], BoxReport]:
        report = BoxReport(split)
        records = []
        image_id = 0
        for folder, list_name in image_sets:
            base = require_dir(self.root / folder, layout, "image set folder")
            ids = read_ids(base / "ImageSets" / "Main" / f"{list_name}.txt", layout)
            xmls = [base / "Annotations" / f"{i}.xml" for i in ids]
            require_files(xmls, layout, f"{folder} {list_name} annotations")
            for image_name, xml in zip(ids, xmls):
                path = base / "JPEGImages" / f"{image_name}.jpg"
                size, objects = read_voc_xml(xml)
                known = []
                for name, corners, difficult in objects:
                    if name in self.labels:
                        known.append((corners, self.labels[name], difficult))
                    else:
                        report.count_unknown(name)
                record = make_record(
                    path,
                    np.array([k[0] for k in known], dtype=np.float32).reshape(-1, 4),
                    [k[1] for k in known],
                    [k[2] for k in known],
                    image_id=image_id,
                    size=size or image_header_size(path),
                    train=split == "train",
                    report=report,
                )
                if record is not None:
                    records.append(record)
                    image_id += 1
        return records, report

    def read_records(self) -> dict[str, tuple[list[DetectionRecord], BoxReport]]:
        layout = LAYOUT.format(root=self.root)
        if not self.root.is_dir():
            raise DatasetLayoutError(
                f"dataset root {self.root} does not exist; set data.root=/path/to/voc\n{layout}"
            )
        train = self._records(self.train_sets, "train", layout)
        records, val_report = self._records([self.test_set], "val", layout)
        test_report = copy.deepcopy(val_report)
        test_report.split = "test"
        return {"train": train, "val": (records, val_report), "test": (records, test_report)}
