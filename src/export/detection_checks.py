"""How an exported SSD's detections measure up: VOC07 and COCO mAP on the labelled validation
split, and, on unlabelled images, how many of the fp32 file's confident detections an int8 file
finds again.

A predictor here is what the export command runs: images (B, 3, S, S) -> the network's encoded
locations (B, P, 4) and class logits (B, P, C), decoded and filtered by the detection task's own
post-processing (:meth:`src.tasks.detection.DetectionTask.detections`), so that every file is
scored exactly as ``eval.py`` scores the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torchvision.ops import box_iou

from src.evaluation.coco_eval import coco_metric
from src.evaluation.voc_eval import VOCMeanAP
from src.models.ssd_boxes import postprocess

Predictor = Callable[[Tensor], tuple[Tensor, Tensor]]

CONFIDENT = 0.5  # a detection "is there" for the agreement at this score, as a deployed app shows
MATCH_IOU = 0.5  # VOC's hit criterion


def detection_map(task: Any, predict: Predictor, batches: Iterable[Any]) -> dict[str, float]:
    """In percent, of ``predict`` on ``batches`` of (images, targets), as the task's test step
    measures them: VOC07 11-point mAP at IoU 0.5, difficult boxes ignored (``map``), and COCO's
    AP@[.5:.95], difficult boxes as crowd regions (``map_coco``), which a box moved by a few
    pixels lowers where VOC's does not."""
    voc, coco = VOCMeanAP(task.net.num_classes), coco_metric()
    for images, targets in batches:
        locations, logits = predict(images)
        preds, truths = task.detections(locations, logits, targets)
        voc.update(preds, truths)
        coco.update(preds, [{k: t[k] for k in ("boxes", "labels", "iscrowd")} for t in truths])
    return {
        "map": 100.0 * float(voc.compute()["map"]),
        "map_coco": 100.0 * float(coco.compute()["map"]),
    }


def matched(reference: dict[str, Tensor], candidate: dict[str, Tensor]) -> int:
    """How many of ``reference``'s boxes ``candidate`` finds: one to one, best reference score
    first, each taking the unclaimed candidate box of its label that overlaps it most, if that
    IoU reaches :data:`MATCH_IOU`.

    Shape:
        each: ``boxes`` (N, 4) (x1, y1, x2, y2), ``scores`` (N,), ``labels`` (N,)
    """
    if len(reference["boxes"]) == 0 or len(candidate["boxes"]) == 0:
        return 0
    iou = box_iou(reference["boxes"], candidate["boxes"])  # (R, K)
    iou[reference["labels"][:, None] != candidate["labels"][None, :]] = -1.0
    found = 0
    for row in torch.argsort(reference["scores"], descending=True).tolist():
        best = int(iou[row].argmax())
        if iou[row, best] >= MATCH_IOU:
            found += 1
            iou[:, best] = -1.0  # claimed
    return found


def confident_only(detections: dict[str, Tensor]) -> dict[str, Tensor]:
    """An image's detections scoring at least :data:`CONFIDENT`."""
    keep = detections["scores"] >= CONFIDENT
    return {key: value[keep] for key, value in detections.items()}


def detection_agreement(
    task: Any, reference: Predictor, candidate: Predictor, batches: Iterable[Tensor]
) -> dict[str, Any]:
    """On unlabelled images: of ``reference``'s (fp32's) detections scoring at least
    :data:`CONFIDENT`, the percentage ``candidate`` (int8) finds among its own such detections
    (same class, IoU >= :data:`MATCH_IOU`, one to one), and of the candidate's, the percentage
    that match one of the reference's; with the counts of both."""
    settings = (task.score_threshold, task.nms_threshold, task.max_per_class, task.pre_nms_top_k)
    found = confident = own = images = 0
    for batch in batches:
        sides = []
        for predict in (reference, candidate):
            locations, logits = predict(batch)
            per_image = postprocess(locations, logits, task.net.priors, *settings)
            sides.append([confident_only(found_in_image) for found_in_image in per_image])
        for expected, got in zip(*sides):
            found += matched(expected, got)
            confident += len(expected["boxes"])
            own += len(got["boxes"])
        images += len(batch)
    return {
        "agreement": 100.0 * found / max(confident, 1),
        "precision": 100.0 * found / max(own, 1),
        "of": "detections",
        "detections": confident,
        "int8_detections": own,
        "score": CONFIDENT,
        "images": images,
    }
