"""SSD's box code (thesis Secs. 2.4.3 and 3.6.1; EdgeNets' ``utilities/box_utils.py``,
``loss_fns/multi_box_loss.py`` and ``model/detection/box_predictor.py``): the box encoding against
the priors of :mod:`src.models.ssd_priors`, matching ground truth to priors, the multibox loss and
post-processing (per-class thresholds and NMS). As torchvision keeps ``BoxCoder``,
``DefaultBoxGenerator`` and the SSD loss with its model, this lives beside :mod:`src.models.ssd`;
IoU, NMS and the box-format conversions are ``torchvision.ops``.

Boxes are (x1, y1, x2, y2) normalised to [0, 1] by the image's width and height; priors are
(cx, cy, w, h), normalised too. Class 0 is background, 1..C-1 the objects.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import batched_nms, box_convert, box_iou

# the SSD variances: centre offsets are divided by 0.1, log size ratios by 0.2
CENTER_VARIANCE = 0.1
SIZE_VARIANCE = 0.2


def encode(boxes: Tensor, priors: Tensor) -> Tensor:
    """SSD regression targets of corner boxes relative to priors: ``(c - c_p) / wh_p / 0.1`` and
    ``log(wh / wh_p) / 0.2`` (torchvision's ``BoxCoder(weights=(10, 10, 5, 5))``).

    Shape:
        boxes (..., P, 4) (x1, y1, x2, y2), priors (P, 4) (cx, cy, w, h) -> (..., P, 4).
    """
    centre = box_convert(boxes, "xyxy", "cxcywh")
    return torch.cat(
        [
            (centre[..., :2] - priors[..., :2]) / priors[..., 2:] / CENTER_VARIANCE,
            torch.log(centre[..., 2:] / priors[..., 2:]) / SIZE_VARIANCE,
        ],
        dim=-1,
    )


def decode(locations: Tensor, priors: Tensor) -> Tensor:
    """Corner boxes from SSD offsets, the inverse of :func:`encode`.

    Shape:
        locations (..., P, 4), priors (P, 4) (cx, cy, w, h) -> (..., P, 4) (x1, y1, x2, y2).
    """
    centre = torch.cat(
        [
            locations[..., :2] * CENTER_VARIANCE * priors[..., 2:] + priors[..., :2],
            torch.exp(locations[..., 2:] * SIZE_VARIANCE) * priors[..., 2:],
        ],
        dim=-1,
    )
    return box_convert(centre, "cxcywh", "xyxy")


def match_priors(
    gt_boxes: Tensor, gt_labels: Tensor, priors: Tensor, iou_threshold: float = 0.45
) -> tuple[Tensor, Tensor]:
    """Assign one image's ground truth to the priors (EdgeNets ``assign_priors``).

    Each prior takes the box it overlaps most and that box's label, or background when the IoU is
    below ``iou_threshold`` (0.45 in the code; its comment says 0.5). Each box is then forced onto
    the prior it overlaps most, whatever the IoU; when two boxes force the same prior, the later
    box wins, as in the code's loop. An image without boxes gets background everywhere (zero
    offsets, never used by the loss). IoU is torchvision's, without the code's 1e-5 in the
    denominator.

    Shape:
        gt_boxes (G, 4) (x1, y1, x2, y2), gt_labels (G,) int64, priors (P, 4) (cx, cy, w, h) ->
        encoded locations (P, 4), labels (P,) int64.
    """
    num_priors, num_gt = priors.shape[0], gt_boxes.shape[0]
    if num_gt == 0:
        return priors.new_zeros(num_priors, 4), gt_labels.new_zeros(num_priors)
    iou = box_iou(box_convert(priors, "cxcywh", "xyxy"), gt_boxes.to(priors.dtype))  # (P, G)
    best_iou, best_gt = iou.max(dim=1)  # (P,)
    best_prior = iou.argmax(dim=0)  # (G,)
    # claimed[p]: the last box whose best prior is p, -1 for none
    claimed = torch.full_like(best_gt, -1).scatter_reduce(
        0, best_prior, torch.arange(num_gt, device=best_gt.device), reduce="amax"
    )
    forced = claimed >= 0
    best_gt = torch.where(forced, claimed, best_gt)
    best_iou = best_iou.masked_fill(forced, 2.0)
    labels = gt_labels[best_gt].masked_fill(best_iou < iou_threshold, 0)
    return encode(gt_boxes.to(priors.dtype)[best_gt], priors), labels


def multibox_loss(
    locations: Tensor,
    logits: Tensor,
    target_locations: Tensor,
    target_labels: Tensor,
    neg_pos_ratio: int = 3,
) -> tuple[Tensor, Tensor]:
    """SSD's multibox loss with hard negative mining per image (EdgeNets ``MultiBoxLoss``).

    In each image, all positives and the ``neg_pos_ratio`` x (its positives) background priors
    with the highest background loss ``-log softmax(logits)[0]`` are kept. Classification is the
    cross-entropy summed over the kept priors, localisation the smooth-L1 (beta 1) summed over the
    positives; both are divided by the number of positives in the batch (at least 1: the code
    would divide by zero for a batch without objects).

    Shape:
        locations (B, P, 4), logits (B, P, C), target_locations (B, P, 4), target_labels (B, P)
        int64 -> (localisation loss, classification loss), two scalars.
    """
    positive = target_labels > 0  # (B, P)
    with torch.no_grad():
        background_loss = -F.log_softmax(logits.float(), dim=2)[..., 0]  # (B, P)
        background_loss = background_loss.masked_fill(positive, -math.inf)
        rank = background_loss.argsort(dim=1, descending=True).argsort(dim=1)  # (B, P)
        kept = positive | (rank < positive.sum(dim=1, keepdim=True) * neg_pos_ratio)
    classification = F.cross_entropy(logits[kept].float(), target_labels[kept], reduction="sum")
    localisation = F.smooth_l1_loss(
        locations[positive].float(), target_locations[positive].float(), reduction="sum"
    )
    num_positives = positive.sum().clamp(min=1)
    return localisation / num_positives, classification / num_positives


def _rank_within_class(labels: Tensor) -> Tensor:
    """Position of each entry among the entries of its label, in the given order.

    Shape:
        (N,) int64 -> (N,) int64.
    """
    order = torch.argsort(labels, stable=True)
    grouped = labels[order]
    counts = torch.bincount(grouped)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(order)
    rank[order] = torch.arange(labels.numel(), device=labels.device) - starts[grouped]
    return rank


def postprocess(
    locations: Tensor,
    logits: Tensor,
    priors: Tensor,
    score_threshold: float = 0.01,
    nms_threshold: float = 0.45,
    max_per_class: int = 200,
    pre_nms_top_k: int | None = None,
) -> list[dict[str, Tensor]]:
    """Detections per image (EdgeNets ``BoxPredictor``): softmax over classes, decode, then per
    foreground class keep scores above ``score_threshold``, NMS at ``nms_threshold`` and the
    ``max_per_class`` best; no cap per image. Boxes stay normalised and are not clipped.

    ``pre_nms_top_k`` (not in the official code, which is None): only the k best candidates of
    each class enter NMS, as torchvision's SSD does (``topk_candidates``, 400). An untrained
    network scores every prior above 0.01 for every class, and NMS over all of them is what makes
    its first evaluation slow: 1.7 s per image for an untrained ESPNetv2 s=0.5 SSD300 with 21
    classes on one CPU thread, 0.05 s with 400 candidates per class.

    Shape:
        locations (B, P, 4), logits (B, P, C), priors (P, 4) -> B dicts of ``boxes`` (N, 4)
        (x1, y1, x2, y2), ``scores`` (N,) and ``labels`` (N,) int64 in 1..C-1, best score first.
    """
    scores = logits.float().softmax(dim=-1)[..., 1:]  # (B, P, C - 1)
    boxes = decode(locations.float(), priors.float())  # (B, P, 4)
    detections = []
    for image_boxes, image_scores in zip(boxes, scores):
        prior_index, class_index = torch.nonzero(image_scores > score_threshold, as_tuple=True)
        candidate_scores = image_scores[prior_index, class_index]
        candidate_labels = class_index + 1
        candidate_boxes = image_boxes[prior_index]
        if pre_nms_top_k is not None:
            by_score = torch.argsort(candidate_scores, descending=True)
            best = by_score[_rank_within_class(class_index[by_score]) < pre_nms_top_k]
            candidate_scores = candidate_scores[best]
            candidate_labels = candidate_labels[best]
            candidate_boxes = candidate_boxes[best]
        # best score first across classes
        keep = batched_nms(candidate_boxes, candidate_scores, candidate_labels, nms_threshold)
        keep = keep[_rank_within_class(candidate_labels[keep]) < max_per_class]
        detections.append(
            {
                "boxes": candidate_boxes[keep],
                "scores": candidate_scores[keep],
                "labels": candidate_labels[keep],
            }
        )
    return detections


def to_pixels(boxes: Tensor, orig_size: Tensor | tuple[int, int]) -> Tensor:
    """Normalised corner boxes in the pixel coordinates of an image of size (H, W).

    Shape:
        (N, 4) -> (N, 4).
    """
    height, width = (float(v) for v in orig_size)
    return boxes * boxes.new_tensor([width, height, width, height])
