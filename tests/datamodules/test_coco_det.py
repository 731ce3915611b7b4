"""MS-COCO detection on generated instance files with every kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.datamodules.bad_files import BadFilesError
from src.datamodules.coco_det import COCODetectionDataModule
from src.datamodules.image_folder import DatasetLayoutError

H, W = 40, 60
CATEGORIES = [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"}, {"id": 3, "name": "car"}]
PERSON, CAR, DOG = 1, 2, 3  # sorted COCO ids 1, 3, 18


def annotation(ann_id: int, image_id: int, category: int, bbox: list, crowd: int = 0) -> dict:
    return {
        "id": ann_id, "image_id": image_id, "category_id": category, "bbox": bbox,
        "iscrowd": crowd, "area": bbox[2] * bbox[3],
    }  # fmt: skip


TRAIN_IMAGES = {1: "a.jpg", 2: "b.jpg", 3: "c.jpg", 4: "missing.jpg"}
TRAIN_ANNOTATIONS = [
    annotation(1, 1, 1, [10, 5, 20, 20]),
    annotation(2, 1, 3, [40, 20, 30, 30]),  # reaches outside: clipped
    annotation(3, 1, 18, [5, 5, 0, 10]),  # zero width: dropped
    annotation(4, 1, 99, [5, 5, 10, 10]),  # unknown category: dropped
    annotation(5, 1, 18, [0, 0, 60, 40], crowd=1),  # crowd: dropped for training
    annotation(6, 3, 1, [1, 1, 10, 10], crowd=1),  # image 3 has only a crowd region: skipped
    annotation(7, 4, 1, [1, 1, 10, 10]),  # image 4's file is missing
]  # image 2 has no annotation: not a training image
VAL_IMAGES = {10: "v.jpg", 11: "w.jpg"}
VAL_ANNOTATIONS = [
    annotation(8, 10, 18, [10, 5, 20, 20]),
    annotation(9, 10, 1, [30, 10, 20, 20], crowd=1),  # kept, flagged difficult
]  # image 11 has no annotation: kept for evaluation


def write_split(root: Path, split: str, images: dict[int, str], annotations: list) -> None:
    (root / f"{split}2017").mkdir(parents=True)
    for name in images.values():
        if name != "missing.jpg":
            Image.fromarray(np.full((H, W, 3), 90, np.uint8)).save(root / f"{split}2017" / name)
    instances = {
        "images": [{"id": i, "file_name": n, "height": H, "width": W} for i, n in images.items()],
        "annotations": annotations,
        "categories": CATEGORIES,
    }
    (root / "annotations").mkdir(exist_ok=True)
    (root / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(instances))


@pytest.fixture
def coco_root(tmp_path: Path) -> Path:
    root = tmp_path / "coco"
    write_split(root, "train", TRAIN_IMAGES, TRAIN_ANNOTATIONS)
    write_split(root, "val", VAL_IMAGES, VAL_ANNOTATIONS)
    return root


def datamodule(root: Path, **kwargs: object) -> COCODetectionDataModule:
    return COCODetectionDataModule(
        str(root), num_classes=4, image_size=32, batch_size=2, num_workers=0, **kwargs
    )


def test_bad_inputs_are_counted_and_reported(coco_root: Path) -> None:
    dm = datamodule(coco_root, on_bad_file="skip")
    dm.setup()
    train, val = dm.reports["train"], dm.reports["val"]
    assert (train.images, train.boxes, train.difficult) == (1, 2, 2)
    assert (train.clipped, train.zero_area, train.unknown_class) == (1, 1, 1)
    assert (train.without_objects, train.bad_files, train.unknown_names) == (1, 1, ["99"])
    assert (val.images, val.boxes, val.difficult, val.without_objects) == (2, 2, 1, 1)
    assert dm.reports["test"].images == 2 and len(dm.splits["test"]) == 2
    assert dm.class_names == ("background", "person", "car", "dog")


def test_targets_of_training_and_evaluation(coco_root: Path) -> None:
    dm = datamodule(coco_root, on_bad_file="skip")
    dm.setup()
    (record,) = dm.splits["train"].records
    assert record.image_id == 1 and record.labels.tolist() == [PERSON, CAR]
    np.testing.assert_array_equal(record.boxes, [[10, 5, 30, 25], [40, 20, 60, 40]])
    image, target = dm.splits["val"][0]
    assert image.shape == (3, 32, 32)
    scale = torch.tensor([W, H, W, H], dtype=torch.float32)
    expected = torch.tensor([[10, 5, 30, 25], [30, 10, 50, 30]], dtype=torch.float32) / scale
    torch.testing.assert_close(target["boxes"], expected)
    assert target["labels"].tolist() == [DOG, PERSON]
    assert target["difficult"].tolist() == [False, True]
    assert (target["image_id"], target["orig_size"]) == (10, (H, W))
    images, targets = next(iter(dm.val_dataloader()))
    assert images.shape == (2, 3, 32, 32)
    assert [t["image_id"] for t in targets] == [10, 11]
    assert [t["boxes"].shape[0] for t in targets] == [2, 0]


def test_missing_image_stops_setup_naming_it(coco_root: Path) -> None:
    with pytest.raises(BadFilesError, match=r"missing\.jpg: unreadable"):
        datamodule(coco_root).setup()


def test_category_count_must_match(coco_root: Path) -> None:
    full = COCODetectionDataModule(str(coco_root), num_workers=0)
    assert len(full.class_names) == 81 and full.class_names[1::79] == ("person", "toothbrush")
    with pytest.raises(DatasetLayoutError, match="lists 3 categories but data.num_classes=81"):
        COCODetectionDataModule(str(coco_root), num_workers=0).setup()


def test_absent_dataset_names_the_layout(tmp_path: Path) -> None:
    with pytest.raises(DatasetLayoutError, match=r"(?s)does not exist.*instances_train2017\.json"):
        datamodule(tmp_path / "nowhere").setup()
    assert datamodule(tmp_path).example_input(3).shape == (3, 3, 32, 32)
