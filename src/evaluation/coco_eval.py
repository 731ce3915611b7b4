"""COCO box AP as the detection task reports it (``test/map_coco``, ``map50``, ``map75``):
torchmetrics' ``MeanAveragePrecision`` on pycocotools' COCOeval, set up to give COCOeval's own
numbers."""

from __future__ import annotations

from pycocotools.cocoeval import Params
from torchmetrics.detection import MeanAveragePrecision


def coco_metric() -> MeanAveragePrecision:
    """COCO AP@[.5:.95], AP50 and AP75 (``map``, ``map_50``, ``map_75``) by pycocotools' COCOeval
    on (x1, y1, x2, y2) pixel boxes, at most 100 detections per image and class as COCOeval keeps;
    ``iscrowd`` ground truth is ignored the COCO way."""
    # COCOeval's own recall thresholds (float64): torchmetrics' default float32 ones move a recall
    # that lands exactly on a threshold (1 of 5 boxes found) to the next, up to 3e-3 AP apart
    metric = MeanAveragePrecision(
        box_format="xyxy",
        iou_type="bbox",
        backend="pycocotools",
        rec_thresholds=Params(iouType="bbox").recThrs.tolist(),
    )
    # up to max_per_class detections per class are expected: no warning past 100 per image
    metric.warn_on_many_detections = False
    return metric
