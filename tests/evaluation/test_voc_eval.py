"""The VOC07 metric against average precisions worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from src.evaluation.voc_eval import VOCMeanAP, pixel_iou, voc_detection_ap

# Two images, classes 1..4 (0 is background). Boxes are inclusive pixel coordinates.
GT = [
    {
        "boxes": torch.tensor(
            [[0, 0, 9, 9], [20, 20, 29, 29], [30, 30, 39, 39], [50, 50, 59, 59]],
            dtype=torch.float32,
        ),
        "labels": torch.tensor([1, 1, 2, 4]),
        "difficult": torch.tensor([False, True, False, True]),
    },
    {"boxes": torch.tensor([[0.0, 0.0, 9.0, 9.0]]), "labels": torch.tensor([1])},
]
PREDS = [
    {
        "boxes": torch.tensor(
            [
                [0, 0, 9, 9],  # class 1 on its box: true positive
                [0, 0, 9, 9],  # the same box again: false positive
                [20, 20, 29, 29],  # on the difficult box: ignored
                [30, 35, 39, 39],  # class 2, IoU exactly 0.5 with the +1 convention (0.44 without)
                [60, 60, 70, 70],  # class 3, which has no ground truth
            ],
            dtype=torch.float32,
        ),
        "scores": torch.tensor([0.9, 0.8, 0.7, 0.4, 0.3]),
        "labels": torch.tensor([1, 1, 1, 2, 3]),
    },
    {
        "boxes": torch.tensor([[40, 40, 49, 49], [0, 0, 9, 9], [0, 0, 9, 9]], dtype=torch.float32),
        "scores": torch.tensor([0.6, 0.5, 0.95]),
        "labels": torch.tensor([1, 1, 2]),  # a miss, a hit, and class 2 where it is absent
    },
]
# class 1, best score first: TP, FP, ignored, FP, TP over 2 non-difficult boxes: precision 1 up to
# recall 0.5 (6 levels: 0, ..., 0.5) and 0.5 at recall 1 (5 levels)
AP_CLASS_1 = (6 * 1.0 + 5 * 0.5) / 11
# class 2: FP (0.95) then TP (0.4) over 1 box: precision 0.5 at recall 1, every level
AP_CLASS_2 = 0.5


def test_pixel_iou_counts_inclusive_pixels() -> None:
    others = np.array([[30.0, 30, 39, 39], [40, 40, 49, 49]])
    iou = pixel_iou(np.array([[30.0, 35, 39, 39]]), others)
    assert iou.tolist() == [[0.5, 0.0]]  # 10 x 5 pixels inside 10 x 10
    # boxes that share one column: 1 x 10 of 10 x 10 + 10 x 10 - 10 pixels
    assert pixel_iou(np.array([[0, 0, 9, 9]]), np.array([[9, 0, 18, 9]])).tolist() == [[10 / 190]]


def chainercv_iou(boxes: np.ndarray, others: np.ndarray) -> np.ndarray:
    """chainercv's ``bbox_iou`` in float64 on boxes whose x2 and y2 got +1."""
    a = boxes.astype(np.float64)
    b = others.astype(np.float64)
    a[:, 2:] += 1
    b[:, 2:] += 1
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])  # (N, M, 2)
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])  # (N, M, 2)
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=2)  # (N, M)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def test_pixel_iou_is_the_numpy_formula_exactly() -> None:
    """torchvision's ``box_iou`` in float64 gives the reference's numbers bit for bit, one-pixel
    and disjoint boxes included, and leaves its inputs alone."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, m = rng.integers(1, 20, size=2)
        boxes = rng.integers(0, 300, size=(n, 4)).astype(np.float32)
        boxes[:, 2:] = boxes[:, :2] + rng.integers(0, 60, size=(n, 2))
        others = rng.integers(0, 300, size=(m, 4)).astype(np.float32)
        others[:, 2:] = others[:, :2] + rng.integers(0, 60, size=(m, 2))
        given = boxes.copy()
        iou = pixel_iou(boxes, others)
        assert iou.dtype == np.float64 and iou.shape == (n, m)
        assert np.array_equal(iou, chainercv_iou(boxes, others))
        assert np.array_equal(boxes, given)


def test_hand_computed_average_precisions() -> None:
    metric = VOCMeanAP(num_classes=5)
    metric.update(PREDS, GT)
    result = metric.compute()
    ap = result["ap"].tolist()
    assert ap[:2] == pytest.approx([AP_CLASS_1, AP_CLASS_2])
    # class 3 has detections only, class 4 only a difficult box: no AP, left out of the mean
    assert math.isnan(ap[2]) and math.isnan(ap[3])
    assert result["map"].item() == pytest.approx((AP_CLASS_1 + AP_CLASS_2) / 2)
    assert result["map"].item() == pytest.approx(7 / 11)


def test_images_accumulate_over_updates() -> None:
    metric = VOCMeanAP(num_classes=5)
    for pred, gt in zip(PREDS, GT):
        metric.update([pred], [gt])
    assert metric.compute()["map"].item() == pytest.approx(7 / 11)
    metric.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert metric.compute()["map"].item() == 0.0  # nothing seen: no class has a box


def test_eleven_levels_are_numpy_floats() -> None:
    # 3 of 10 boxes found at precision 1: recall 0.3 is below the level 0.30000000000000004
    boxes = np.array([[10.0 * i, 0, 10 * i + 9, 9] for i in range(10)])
    labels, difficult = np.ones(10, dtype=np.int64), np.zeros(10, dtype=bool)
    ap = voc_detection_ap(
        [boxes[:3]], [labels[:3]], [np.array([0.9, 0.8, 0.7])], [boxes], [labels], [difficult], 2
    )
    assert ap.tolist() == pytest.approx([3 / 11])


def test_detection_below_the_iou_threshold_is_a_false_positive() -> None:
    # 10 x 4 inside 10 x 10: IoU 0.4
    truth = np.array([[0.0, 0, 9, 9]])
    one = np.ones(1, dtype=np.int64)
    ap = voc_detection_ap(
        [np.array([[0.0, 0, 9, 3], [0, 0, 9, 9]])],
        [np.ones(2, dtype=np.int64)],
        [np.array([0.9, 0.1])],
        [truth],
        [one],
        [np.zeros(1, dtype=bool)],
        2,
    )
    assert ap.tolist() == pytest.approx([0.5])  # FP then TP: precision 0.5 at recall 1
