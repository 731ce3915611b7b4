"""PASCAL VOC 2007 detection metric: 11-point average precision at IoU 0.5 per class, averaged.

The semantics are chainercv's ``eval_detection_voc(..., use_07_metric=True)``, which EdgeNets
copies (``utilities/metrics/voc_helper.py``):

- boxes are inclusive pixel coordinates: x2 and y2 get +1 before IoU (VOC's XML boxes minus 1), so
  boxes must be in the pixels of the original image, not normalised;
- per image and class, detections best score first each take the ground-truth box they overlap
  most; at IoU >= 0.5 they are a true positive if that box is new, a false positive if it was
  taken already, and neither if it is difficult; below 0.5 they are false positives;
- recall counts the non-difficult boxes; a class without one has no AP (NaN) and is left out of
  the mean, as is a class that occurs in no image;
- AP is the mean over recall levels ``numpy.arange(0, 1.1, 0.1)`` of the best precision at a
  recall at least that level (0 where none is). These levels are floats, so 0.3 is
  0.30000000000000004 and a recall of exactly 3/10 does not reach it, as in the reference code.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat
from torchvision.ops import box_iou

RECALL_LEVELS = np.arange(0.0, 1.1, 0.1)


def pixel_iou(boxes: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of inclusive pixel boxes (x1, y1, x2, y2): each covers ``x2 - x1 + 1`` columns, so x2
    and y2 get +1 before torchvision's ``box_iou``, in float64.

    Shape:
        (N, 4), (M, 4) -> (N, M).
    """
    a = torch.from_numpy(boxes.astype(np.float64))  # a copy: the +1 leaves ``boxes`` alone
    b = torch.from_numpy(others.astype(np.float64))
    a[:, 2:] += 1
    b[:, 2:] += 1
    return box_iou(a, b).numpy()


def _outcomes(
    boxes: np.ndarray, gt_boxes: np.ndarray, gt_difficult: np.ndarray, iou_threshold: float
) -> np.ndarray:
    """1 (true positive), 0 (false positive) or -1 (on a difficult box) for detections of one
    class in one image, given best score first."""
    outcome = np.zeros(len(boxes), dtype=np.int8)
    if len(gt_boxes) == 0:
        return outcome
    iou = pixel_iou(boxes, gt_boxes)
    best = iou.argmax(axis=1)
    hit = iou.max(axis=1) >= iou_threshold
    taken = np.zeros(len(gt_boxes), dtype=bool)
    for k in np.flatnonzero(hit):
        j = best[k]
        if gt_difficult[j]:
            outcome[k] = -1
        elif not taken[j]:
            outcome[k] = 1
        taken[j] = True
    return outcome


def average_precision_07(precision: np.ndarray, recall: np.ndarray) -> float:
    """VOC2007 11-point AP: mean over ``RECALL_LEVELS`` of the best precision at recall >= level."""
    precision = np.nan_to_num(precision)
    best = [
        precision[recall >= level].max() if (recall >= level).any() else 0.0
        for level in RECALL_LEVELS
    ]
    return float(np.sum(best) / len(RECALL_LEVELS))


def voc_detection_ap(
    pred_boxes: Sequence[np.ndarray],
    pred_labels: Sequence[np.ndarray],
    pred_scores: Sequence[np.ndarray],
    gt_boxes: Sequence[np.ndarray],
    gt_labels: Sequence[np.ndarray],
    gt_difficult: Sequence[np.ndarray],
    num_classes: int,
    iou_threshold: float = 0.5,
) -> np.ndarray:
    """VOC07 AP of classes 1..num_classes-1 over a list of images (NaN for a class without a
    non-difficult ground-truth box).

    Shape:
        per image: pred_boxes (R, 4) pixels, pred_labels (R,), pred_scores (R,), gt_boxes (G, 4)
        pixels, gt_labels (G,), gt_difficult (G,) bool -> (num_classes - 1,).
    """
    positives = np.zeros(num_classes, dtype=np.int64)
    scores: list[list[np.ndarray]] = [[] for _ in range(num_classes)]
    outcomes: list[list[np.ndarray]] = [[] for _ in range(num_classes)]
    images = zip(
        pred_boxes, pred_labels, pred_scores, gt_boxes, gt_labels, gt_difficult, strict=True
    )
    for boxes, labels, image_scores, truth, truth_labels, difficult in images:
        difficult = difficult.astype(bool)
        for cls in np.unique(np.concatenate([labels, truth_labels]).astype(np.int64)):
            mine = labels == cls
            order = np.argsort(-image_scores[mine], kind="stable")
            gt_mine = truth_labels == cls
            positives[cls] += int((~difficult[gt_mine]).sum())
            scores[cls].append(image_scores[mine][order])
            outcomes[cls].append(
                _outcomes(boxes[mine][order], truth[gt_mine], difficult[gt_mine], iou_threshold)
            )
    ap = np.full(num_classes - 1, np.nan)
    for cls in range(1, num_classes):
        if positives[cls] == 0:
            continue
        order = np.argsort(-np.concatenate(scores[cls]), kind="stable")
        outcome = np.concatenate(outcomes[cls])[order]
        tp = np.cumsum(outcome == 1)
        fp = np.cumsum(outcome == 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            precision = tp / (tp + fp)
        ap[cls - 1] = average_precision_07(precision, tp / positives[cls])
    return ap


class VOCMeanAP(Metric):
    """VOC07 mean AP (see the module docstring) over all images seen, reduced across processes.

    Detections and ground truth are kept per box with a count per image, so that processes'
    states concatenate (``dist_reduce_fx="cat"``) into one list of images.

    Args:
        num_classes: classes including background (label 0, never evaluated).
        iou_threshold: IoU a detection needs to hit a ground-truth box.

    Shape:
        ``update(preds, targets)``: one dict per image; preds ``boxes`` (R, 4) in pixels,
        ``scores`` (R,), ``labels`` (R,); targets ``boxes`` (G, 4) in pixels, ``labels`` (G,) and
        optionally ``difficult`` (G,) bool. ``compute()`` -> ``map`` (scalar; 0 when no class has
        a ground-truth box) and ``ap`` (num_classes - 1,) with NaN for classes without one.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, num_classes: int, *, iou_threshold: float = 0.5) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"need background and a class, got num_classes={num_classes}")
        self.num_classes = num_classes
        self.iou_threshold = iou_threshold
        for name in (
            "pred_boxes",
            "pred_scores",
            "pred_labels",
            "pred_counts",
            "gt_boxes",
            "gt_labels",
            "gt_difficult",
            "gt_counts",
        ):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, preds: list[dict[str, Tensor]], targets: list[dict[str, Tensor]]) -> None:
        if len(preds) != len(targets):
            raise ValueError(f"got {len(preds)} predictions for {len(targets)} images")
        for pred, target in zip(preds, targets):
            difficult = target.get("difficult")
            if difficult is None:
                difficult = torch.zeros_like(target["labels"])
            self.pred_boxes.append(pred["boxes"].float().reshape(-1, 4))
            self.pred_scores.append(pred["scores"].float().reshape(-1))
            self.pred_labels.append(pred["labels"].long().reshape(-1))
            self.pred_counts.append(torch.tensor([len(pred["labels"])], device=self.device))
            self.gt_boxes.append(target["boxes"].float().reshape(-1, 4))
            self.gt_labels.append(target["labels"].long().reshape(-1))
            # integers, not bool, for the gather across processes
            self.gt_difficult.append(difficult.long().reshape(-1))
            self.gt_counts.append(torch.tensor([len(target["labels"])], device=self.device))

    def _per_image(self, name: str, counts: np.ndarray) -> list[np.ndarray]:
        values = getattr(self, name)
        values = dim_zero_cat(values).cpu().numpy()
        return np.split(values, np.cumsum(counts)[:-1])

    def compute(self) -> dict[str, Tensor]:
        if isinstance(self.pred_counts, list) and not self.pred_counts:
            ap = np.full(self.num_classes - 1, np.nan)
        else:
            pred_counts = dim_zero_cat(self.pred_counts).cpu().numpy()
            gt_counts = dim_zero_cat(self.gt_counts).cpu().numpy()
            ap = voc_detection_ap(
                self._per_image("pred_boxes", pred_counts),
                self._per_image("pred_labels", pred_counts),
                self._per_image("pred_scores", pred_counts),
                self._per_image("gt_boxes", gt_counts),
                self._per_image("gt_labels", gt_counts),
                self._per_image("gt_difficult", gt_counts),
                self.num_classes,
                self.iou_threshold,
            )
        mean = float(np.nanmean(ap)) if not np.isnan(ap).all() else 0.0
        return {"map": torch.tensor(mean), "ap": torch.from_numpy(ap).float()}
