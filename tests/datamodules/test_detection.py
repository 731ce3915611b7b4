"""The shared detection pieces: box sanitising with counts, the SSD augmentation, the collate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.datamodules.detection import (
    ZOOM_OUT_FILL,
    BoxReport,
    DetectionFiles,
    DetectionRecord,
    clean_boxes,
    detection_collate,
    detection_transform,
    make_record,
)
from src.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD


def test_clean_boxes_clips_and_drops_with_counts() -> None:
    report = BoxReport("train")
    boxes = np.array(
        [[10, 5, 30, 25], [-4, 2, 20, 50], [5, 5, 5, 20], [70, 5, 90, 20]], dtype=np.float32
    )
    clipped, keep = clean_boxes(boxes, (40, 60), report)
    np.testing.assert_array_equal(clipped[:2], [[10, 5, 30, 25], [0, 2, 20, 40]])
    assert keep.tolist() == [True, True, False, False]  # zero width as given / after clipping
    assert (report.clipped, report.zero_area) == (1, 2)


def test_make_record_drops_difficult_and_empty_images_for_training_only() -> None:
    boxes = np.array([[1, 1, 9, 9]], dtype=np.float32)
    train, val = BoxReport("train"), BoxReport("val")
    kwargs = {"image_id": 3, "size": (10, 10)}
    dropped = make_record(Path("a.jpg"), boxes, [2], [True], train=True, report=train, **kwargs)
    assert dropped is None
    record = make_record(Path("a.jpg"), boxes, [2], [True], train=False, report=val, **kwargs)
    assert record is not None and record.difficult.tolist() == [True]
    assert (train.images, train.difficult, train.without_objects) == (0, 1, 1)
    assert (val.images, val.boxes, val.difficult, val.without_objects) == (1, 1, 1, 0)
    assert "1 images without objects (skipped)" in train.summary()


@pytest.fixture
def record(tmp_path: Path) -> DetectionRecord:
    """A 60x40 image with three boxes, one touching the right edge."""
    path = tmp_path / "image.jpg"
    Image.fromarray(np.full((40, 60, 3), 128, np.uint8)).save(path)
    boxes = np.array([[2, 3, 20, 30], [30, 10, 60, 40], [40, 1, 50, 8]], dtype=np.float32)
    return DetectionRecord(
        path, boxes, np.array([1, 2, 3]), np.array([False, False, True]), 7, (40, 60)
    )


def test_evaluation_item_keeps_normalised_boxes_and_metadata(record: DetectionRecord) -> None:
    image, target = DetectionFiles([record], detection_transform(False, 32))[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    expected = record.boxes / np.array([60, 40, 60, 40], dtype=np.float32)
    torch.testing.assert_close(target["boxes"], torch.from_numpy(expected))
    assert target["labels"].tolist() == [1, 2, 3] and target["labels"].dtype == torch.int64
    assert target["difficult"].tolist() == [False, False, True]
    assert (target["image_id"], target["orig_size"]) == (7, (40, 60))
    grey = (128 / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    torch.testing.assert_close(image.mean(dim=(1, 2)), grey, atol=2e-2, rtol=0)


def test_augmentation_keeps_boxes_valid_and_labels_aligned(record: DetectionRecord) -> None:
    torch.manual_seed(0)
    dataset = DetectionFiles([record], detection_transform(True, 48))
    counts = set()
    for _ in range(60):
        image, target = dataset[0]
        boxes = target["boxes"]
        assert image.shape == (3, 48, 48)
        assert boxes.shape[0] == target["labels"].shape[0] == target["difficult"].shape[0]
        assert ((boxes >= 0) & (boxes <= 1)).all()
        assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
        # the difficult flag travels with its box (label 3) through crops and flips
        assert (target["difficult"] == (target["labels"] == 3)).all()
        counts.add(boxes.shape[0])
    assert len(counts) > 1  # the crop drops boxes sometimes


def test_zoom_out_fills_with_the_mean_pixel() -> None:
    assert ZOOM_OUT_FILL == (124, 116, 104)


def test_collate_stacks_images_and_keeps_target_lists(record: DetectionRecord) -> None:
    empty = DetectionRecord(
        record.path, np.zeros((0, 4), np.float32), np.zeros(0, np.int64), np.zeros(0, bool), 8,
        (40, 60),
    )  # fmt: skip
    dataset = DetectionFiles([record, empty], detection_transform(False, 32))
    images, targets = detection_collate([dataset[0], dataset[1]])
    assert images.shape == (2, 3, 32, 32)
    assert [t["boxes"].shape for t in targets] == [(3, 4), (0, 4)]
    assert [t["image_id"] for t in targets] == [7, 8]
