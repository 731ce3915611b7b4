"""SSD with its post-processing in the graph: softmax, box decoding, per-class candidates and
NMS (ONNX ``NonMaxSuppression``, from ``torchvision.ops.nms``), for runtimes that run it.

The eager post-processing (:func:`src.models.ssd_boxes.postprocess`) selects candidates with
data-dependent counts; the graph's version keeps every shape fixed until NMS and gives the same
detections: per class the ``k`` best priors by score (``topk``; ``k`` = ``pre_nms_top_k``, or
every prior as in the official code), those above ``score_threshold``, NMS of each class apart
(boxes offset by class, torchvision's coordinate trick), then at most ``max_per_class`` per class,
best score first. One image a call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import nms

from src.export.spec import ExportSpec
from src.models.ssd import SSD
from src.models.ssd_boxes import decode


class SSDDetections(nn.Module):
    """An SSD network and its post-processing, as one graph.

    Shape:
        image (1, 3, S, S) -> boxes (N, 4) normalised (x1, y1, x2, y2), scores (N,), labels (N,)
        int64 in 1..C-1, best score first
    """

    def __init__(
        self,
        net: SSD,
        *,
        score_threshold: float,
        nms_threshold: float,
        max_per_class: int,
        pre_nms_top_k: int | None,
    ) -> None:
        super().__init__()
        self.net = net
        self.score_threshold = score_threshold
        self.nms_threshold = nms_threshold
        self.max_per_class = max_per_class
        self.pre_nms_top_k = pre_nms_top_k

    def forward(self, image: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        locations, logits = self.net(image)
        scores = logits[0].float().softmax(dim=-1)[:, 1:]  # (P, C - 1)
        boxes = decode(locations[0].float(), self.net.priors.float())  # (P, 4)
        priors, classes = scores.shape
        k = priors if self.pre_nms_top_k is None else min(self.pre_nms_top_k, priors)
        top_scores, top_priors = scores.topk(k, dim=0)  # (k, C - 1) each, best first per class
        labels = torch.arange(1, classes + 1).expand(k, classes)  # (k, C - 1)
        top_scores, top_priors, labels = (t.reshape(-1) for t in (top_scores, top_priors, labels))
        keep = top_scores > self.score_threshold
        top_scores, top_priors, labels = top_scores[keep], top_priors[keep], labels[keep]
        candidates = boxes[top_priors]  # (n, 4)
        # one NMS over all classes: each class's boxes moved apart so that no two classes overlap
        offsets = labels.to(candidates.dtype) * (candidates.max() - candidates.min() + 1)
        kept = nms(candidates + offsets[:, None], top_scores, self.nms_threshold)  # best first
        # at most max_per_class per class: the rank of each kept box among those of its class
        one_hot = F.one_hot(labels[kept] - 1, classes)  # (m, C - 1)
        rank = (one_hot.cumsum(0) * one_hot).sum(1) - 1  # (m,)
        kept = kept[rank < self.max_per_class]
        return candidates[kept], top_scores[kept], labels[kept]


def ssd_nms_spec(net: SSD, image: Tensor, settings: dict[str, float | int | None]) -> ExportSpec:
    """The spec of :class:`SSDDetections` for one image at the SSD's size; ``settings``: the task's
    ``score_threshold``, ``nms_threshold``, ``max_per_class`` and ``pre_nms_top_k``."""
    module = SSDDetections(net.eval(), **settings)  # type: ignore[arg-type]
    return ExportSpec(
        name="network",
        module=module,
        inputs=(image[:1],),
        input_names=["image"],
        output_names=["boxes", "scores", "labels"],
        notes=[
            (
                "post-processing in the graph: softmax, box decoding, per-class top-k candidates, "
                f"score threshold, NMS (NonMaxSuppression) and the per-class cap, with {settings}; "
                "one image a call; boxes normalised (x1, y1, x2, y2)"
            )
        ],
    )


def _canonical(boxes: Tensor, scores: Tensor, labels: Tensor) -> Tensor:
    """Detections as rows (score rounded to 1e-5, label, box), sorted: boxes of exactly tied
    scores come out of NMS in either order. (N, 4), (N,), (N,) -> (N, 6) float64."""
    rows = torch.cat(
        [(scores.double() * 1e5).round()[:, None] / 1e5, labels.double()[:, None], boxes.double()],
        dim=1,
    )
    for column in reversed(range(rows.shape[1])):  # lexicographic: last key first, stable sorts
        rows = rows[torch.sort(rows[:, column], stable=True, descending=column == 0).indices]
    return rows


def detection_parity(
    run: Callable[[Tensor], Sequence[Tensor]], module: SSDDetections, images: Tensor
) -> dict[str, Any]:
    """The exported graph's detections (``run``: image -> boxes, scores, labels) against
    ``module``'s eager ones, image by image: whether every image has as many detections of the
    same labels, and the largest box or score difference.

    Shape:
        images (B, 3, S, S)
    """
    same, max_abs, counts = True, 0.0, []
    with torch.no_grad():
        for image in images:
            expected = _canonical(*module(image[None]))
            got = _canonical(*run(image[None]))
            counts.append(len(expected))
            if got.shape != expected.shape or not torch.equal(got[:, 1], expected[:, 1]):
                same = False
                continue
            if len(got):
                max_abs = max(max_abs, float((got - expected).abs().max()))
    return {
        "images": len(images),
        "detections": counts,
        "same_detections": same,
        "max_abs": max_abs,
    }
