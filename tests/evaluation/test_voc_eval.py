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


def devkit_iou(box: np.ndarray, truth: np.ndarray) -> float:
    """The VOC devkit's overlap (``VOCevaldet.m``): inclusive pixels; -inf (the devkit's starting
    ``ovmax``) for boxes that do not meet."""
    iw = min(box[2], truth[2]) - max(box[0], truth[0]) + 1
    ih = min(box[3], truth[3]) - max(box[1], truth[1]) + 1
    if iw <= 0 or ih <= 0:
        return -math.inf
    union = (
        (box[2] - box[0] + 1) * (box[3] - box[1] + 1)
        + (truth[2] - truth[0] + 1) * (truth[3] - truth[1] + 1)
        - iw * ih
    )
    return iw * ih / union


def devkit_ap(preds: list[dict], truths: list[dict], cls: int) -> float:
    """VOC2007 AP of one class as the devkit's ``VOCevaldet.m`` computes it: all detections of
    the class sorted by confidence; each goes to the ground-truth box of its image it overlaps
    most; at overlap >= 0.5 it is a true positive on a new non-difficult box, a false positive on
    one found already, and neither on a difficult box; otherwise a false positive. AP is the mean
    over 11 recall levels of the best precision at recall >= level (``max`` ignores NaN, 0 when no
    point reaches it). The levels are ``numpy.arange(0, 1.1, 0.1)``, as in the devkit's Python
    port (py-faster-rcnn ``voc_eval.py``). NaN for a class without a non-difficult box, and, as
    the devkit's ``max`` of NaN gives, for a class whose every detection lies on a difficult box
    (precision 0/0 everywhere)."""
    detections = [
        (float(score), image, box.numpy().astype(np.float64))
        for image, pred in enumerate(preds)
        for box, label, score in zip(pred["boxes"], pred["labels"], pred["scores"])
        if label == cls
    ]
    detections.sort(key=lambda d: -d[0])
    mine = [t["labels"] == cls for t in truths]
    boxes = [t["boxes"][m].numpy().astype(np.float64) for t, m in zip(truths, mine)]
    difficult = [t["difficult"][m].numpy() for t, m in zip(truths, mine)]
    positives = sum(int((~d).sum()) for d in difficult)
    if positives == 0:
        return math.nan
    found = [np.zeros(len(d), dtype=bool) for d in difficult]
    tp, fp = np.zeros(len(detections)), np.zeros(len(detections))
    for d, (_, image, box) in enumerate(detections):
        overlaps = [devkit_iou(box, truth) for truth in boxes[image]]
        if overlaps and max(overlaps) >= 0.5:
            j = int(np.argmax(overlaps))
            if not difficult[image][j]:
                if not found[image][j]:
                    tp[d], found[image][j] = 1, True
                else:
                    fp[d] = 1
        else:
            fp[d] = 1
    tp, fp = np.cumsum(tp), np.cumsum(fp)
    recall = tp / positives
    with np.errstate(invalid="ignore"):
        precision = tp / (tp + fp)
    ap = 0.0
    for level in np.arange(0.0, 1.1, 0.1):
        reached = precision[recall >= level]
        numbers = reached[~np.isnan(reached)]
        ap += (numbers.max() if numbers.size else math.nan if reached.size else 0.0) / 11
    return ap


def random_case(rng: np.random.Generator, num_classes: int) -> tuple[list[dict], list[dict]]:
    """Integer ground-truth boxes (a fifth difficult) and float detections: shifted copies of the
    boxes (some with the wrong class, some twice), and false alarms; scores without ties."""
    preds, truths = [], []
    for _ in range(int(rng.integers(4, 9))):
        count = int(rng.integers(1, 6))
        corner = rng.integers(0, 200, size=(count, 2))
        boxes = np.concatenate([corner, corner + rng.integers(8, 80, size=(count, 2))], axis=1)
        labels = rng.integers(1, num_classes, size=count)
        truths.append(
            {
                "boxes": torch.tensor(boxes, dtype=torch.float32),
                "labels": torch.tensor(labels),
                "difficult": torch.tensor(rng.random(count) < 0.2),
            }
        )
        found = [b for b in range(count) for _ in range(int(rng.integers(0, 3)))]  # 0-2 copies each
        shifted = boxes[found] + rng.normal(0, 4, size=(len(found), 4))
        wrong = rng.random(len(found)) < 0.15
        found_labels = np.where(wrong, rng.integers(1, num_classes, size=len(found)), labels[found])
        alarms = int(rng.integers(0, 4))
        corner = rng.uniform(0, 200, size=(alarms, 2))
        alarm_boxes = np.concatenate(
            [corner, corner + rng.uniform(8, 80, size=(alarms, 2))], axis=1
        )
        all_boxes = np.concatenate([shifted, alarm_boxes]).reshape(-1, 4)
        all_labels = np.concatenate([found_labels, rng.integers(1, num_classes, size=alarms)])
        preds.append(
            {
                "boxes": torch.tensor(all_boxes, dtype=torch.float32),
                "scores": torch.tensor(rng.random(len(all_labels)), dtype=torch.float32),
                "labels": torch.tensor(all_labels, dtype=torch.int64),
            }
        )
    return preds, truths


@pytest.mark.parametrize("seed", range(20))
def test_random_cases_match_the_devkit_definition(seed: int) -> None:
    """Per-class AP and the mean equal an independent implementation of the devkit's rule."""
    num_classes = 5
    preds, truths = random_case(np.random.default_rng(seed), num_classes)
    scores = torch.cat([p["scores"] for p in preds])
    assert scores.unique().numel() == scores.numel()  # ties would make the order a choice
    for pred, truth in zip(preds, truths):  # no overlap exactly at the threshold
        for box in pred["boxes"].numpy().astype(np.float64):
            for other in truth["boxes"].numpy().astype(np.float64):
                assert abs(devkit_iou(box, other) - 0.5) > 1e-9
    expected = np.array([devkit_ap(preds, truths, cls) for cls in range(1, num_classes)])
    metric = VOCMeanAP(num_classes)
    metric.update(preds, truths)
    result = metric.compute()
    ap = result["ap"].double().numpy()
    # The one difference: a class with non-difficult boxes whose every detection lies on a
    # difficult box. The devkit (and its Python port) makes its AP NaN, and so the mean; ours, as
    # chainercv, takes precision 0/0 as 0: AP 0, in the mean.
    positives = np.array(
        [
            int(sum(((t["labels"] == c) & ~t["difficult"]).sum() for t in truths))
            for c in range(1, num_classes)
        ]
    )
    on_difficult_only = np.isnan(expected) & (positives > 0)
    assert (ap[on_difficult_only] == 0).all()
    expected[on_difficult_only] = 0.0
    assert np.array_equal(np.isnan(ap), np.isnan(expected))
    assert np.allclose(ap[~np.isnan(ap)], expected[~np.isnan(expected)], atol=1e-6, rtol=0)
    assert result["map"].item() == pytest.approx(np.nanmean(expected), abs=1e-6)
