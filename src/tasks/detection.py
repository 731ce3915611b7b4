"""SSD object detection (thesis Secs. 2.4.3 and 3.6.1; EdgeNets' ``utilities/box_utils.py``,
``loss_fns/multi_box_loss.py`` and ``model/detection/box_predictor.py``): matching ground truth to
priors, the box encoding, the multibox loss, post-processing and the Lightning task.

Boxes are (x1, y1, x2, y2) normalised to [0, 1] by the image's width and height; priors are
(cx, cy, w, h), normalised too. Class 0 is background, 1..C-1 the objects.
"""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.detection import MeanAveragePrecision
from torchvision.ops import batched_nms, box_convert, box_iou

from src.tasks.classification import OptimizerFactory, SchedulerFactory
from src.tasks.clipping import FusedOptimizerClipping
from src.tasks.finetune import freeze_batch_norm_parameters, load_network_weights
from src.tasks.memory_format import channels_last_images, channels_last_network
from src.tasks.schedules import per_update
from src.tasks.voc_eval import VOCMeanAP

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


def coco_metric() -> MeanAveragePrecision:
    """COCO AP@[.5:.95], AP50 and AP75 (``map``, ``map_50``, ``map_75``) by pycocotools' COCOeval
    on (x1, y1, x2, y2) pixel boxes, at most 100 detections per image and class as COCOeval keeps;
    ``iscrowd`` ground truth is ignored the COCO way."""
    metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend="pycocotools")
    # up to max_per_class detections per class are expected: no warning past 100 per image
    metric.warn_on_many_detections = False
    return metric


class DetectionTask(FusedOptimizerClipping, L.LightningModule):
    """Trains an SSD network with the multibox loss; evaluates VOC07 and COCO mean AP.

    The batch's ground truth is matched to ``net.priors`` in each step. Training logs
    ``train/loss`` and its parts ``train/loss_loc`` and ``train/loss_cls``; validation logs
    ``val/loss`` and ``val/map`` (VOC07 11-point AP at IoU 0.5, difficult boxes ignored); test
    logs ``test/loss``, ``test/map`` and the COCO numbers of :func:`coco_metric`:
    ``test/map_coco`` (AP@[.5:.95]), ``test/map50`` and ``test/map75``; difficult boxes are COCO
    crowd regions there. Both metrics see boxes in the
    pixels of the original image (``orig_size``). The code chooses its checkpoint by the
    validation loss; ``val/map`` is logged for that choice too.

    Args:
        net: SSD network with a ``priors`` buffer (P, 4) and ``num_classes`` (background
            included), mapping images to (locations, logits).
        optimizer: factory called with the trainable parameters (a Hydra ``_partial_``).
        scheduler: factory called as ``scheduler(optimizer, total_steps=...)``, stepped every
            optimiser step; ``None`` keeps the learning rate constant.
        iou_threshold: matching IoU below which a prior is background.
        neg_pos_ratio: background priors kept per positive by hard negative mining.
        score_threshold: class score a detection must exceed.
        nms_threshold: IoU above which NMS suppresses a detection of the same class.
        max_per_class: detections kept per class and image after NMS.
        pre_nms_top_k: candidates per class and image that enter NMS (None: all, the official
            code; :func:`postprocess`).
        init_checkpoint: checkpoint whose network weights initialise ``net`` when fitting starts
            (weights only; the 512 x 512 recipe starts from the 300 x 300 model).
        freeze_bn: stop training the batch norms' affine parameters. Their running statistics
            keep updating, as in the code, whose ``--freeze-bn`` puts the layers in eval mode
            once and is undone by the ``model.train()`` of every epoch.
        channels_last: train and evaluate in channels-last layout
            (:mod:`src.tasks.memory_format`); False keeps the loader's layout.

    Shape:
        batch: (images (B, 3, S, S), B target dicts: ``boxes`` (N_i, 4) normalised,
        ``labels`` (N_i,) int64, ``difficult`` (N_i,) bool, ``orig_size`` (H, W));
        forward returns (locations (B, P, 4), logits (B, P, C)).
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        *,
        iou_threshold: float = 0.45,
        neg_pos_ratio: int = 3,
        score_threshold: float = 0.01,
        nms_threshold: float = 0.45,
        max_per_class: int = 200,
        pre_nms_top_k: int | None = None,
        init_checkpoint: str | None = None,
        freeze_bn: bool = False,
        channels_last: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(getattr(net, "priors", None), Tensor) or not hasattr(net, "num_classes"):
            raise TypeError(f"{type(net).__name__} needs a `priors` buffer and `num_classes`")
        top_k_ok = pre_nms_top_k is None or pre_nms_top_k >= 1
        if neg_pos_ratio < 1 or max_per_class < 1 or not top_k_ok:
            raise ValueError(
                f"need neg_pos_ratio, max_per_class and pre_nms_top_k (or null) >= 1, got "
                f"{neg_pos_ratio}, {max_per_class}, {pre_nms_top_k}"
            )
        self.channels_last = channels_last
        self.net = channels_last_network(net) if channels_last else net
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.iou_threshold = iou_threshold
        self.neg_pos_ratio = neg_pos_ratio
        self.score_threshold = score_threshold
        self.nms_threshold = nms_threshold
        self.max_per_class = max_per_class
        self.pre_nms_top_k = pre_nms_top_k
        self.init_checkpoint = init_checkpoint
        if freeze_bn:
            freeze_batch_norm_parameters(net)
        self.val_map = VOCMeanAP(net.num_classes)
        self.test_map = VOCMeanAP(net.num_classes)
        self.test_coco = coco_metric()

    def setup(self, stage: str) -> None:
        # at fit start, before Lightning restores a resumed checkpoint (which then wins)
        if stage == "fit" and self.init_checkpoint is not None:
            load_network_weights(self.net, self.init_checkpoint)

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        return self.net(channels_last_images(images) if self.channels_last else images)

    def match(self, targets: list[dict]) -> tuple[Tensor, Tensor]:
        """The batch's regression targets (B, P, 4) and prior labels (B, P)."""
        matched = [
            match_priors(t["boxes"], t["labels"], self.net.priors, self.iou_threshold)
            for t in targets
        ]
        return torch.stack([m[0] for m in matched]), torch.stack([m[1] for m in matched])

    def _loss(
        self, batch: tuple[Tensor, list[dict]], stage: str
    ) -> tuple[Tensor, Tensor, Tensor]:
        images, targets = batch
        locations, logits = self(images)
        target_locations, target_labels = self.match(targets)
        loc, cls = multibox_loss(
            locations, logits, target_locations, target_labels, self.neg_pos_ratio
        )
        loss = loc + cls
        training = stage == "train"
        logged = {f"{stage}/loss": loss, f"{stage}/loss_loc": loc, f"{stage}/loss_cls": cls}
        self.log_dict(
            logged,
            on_step=training,
            on_epoch=True,
            sync_dist=not training,
            batch_size=len(targets),
        )
        return loss, locations, logits

    def _detect(self, locations: Tensor, logits: Tensor, targets: list[dict]) -> tuple[list, list]:
        """Detections and ground truth of the batch in pixels, as the metrics take them."""
        detections = postprocess(
            locations.detach(),
            logits.detach(),
            self.net.priors,
            self.score_threshold,
            self.nms_threshold,
            self.max_per_class,
            self.pre_nms_top_k,
        )
        preds, truths = [], []
        for found, target in zip(detections, targets):
            preds.append({**found, "boxes": to_pixels(found["boxes"], target["orig_size"])})
            difficult = target.get("difficult")
            if difficult is None:
                difficult = torch.zeros_like(target["labels"], dtype=torch.bool)
            truths.append(
                {
                    "boxes": to_pixels(target["boxes"].float(), target["orig_size"]),
                    "labels": target["labels"],
                    "difficult": difficult.bool(),
                    "iscrowd": difficult.long(),
                }
            )
        return preds, truths

    def training_step(self, batch: tuple[Tensor, list[dict]], batch_idx: int) -> Tensor:
        return self._loss(batch, "train")[0]

    def validation_step(self, batch: tuple[Tensor, list[dict]], batch_idx: int) -> None:
        _, locations, logits = self._loss(batch, "val")
        self.val_map.update(*self._detect(locations, logits, batch[1]))

    def test_step(self, batch: tuple[Tensor, list[dict]], batch_idx: int) -> None:
        _, locations, logits = self._loss(batch, "test")
        preds, truths = self._detect(locations, logits, batch[1])
        self.test_map.update(preds, truths)
        self.test_coco.update(
            preds, [{k: t[k] for k in ("boxes", "labels", "iscrowd")} for t in truths]
        )

    def on_validation_epoch_end(self) -> None:
        self.log("val/map", self.val_map.compute()["map"], prog_bar=True)
        self.val_map.reset()

    def on_test_epoch_end(self) -> None:
        coco = self.test_coco.compute()
        self.log_dict(
            {
                "test/map": self.test_map.compute()["map"],
                "test/map_coco": coco["map"],
                "test/map50": coco["map_50"],
                "test/map75": coco["map_75"],
            }
        )
        self.test_map.reset()
        self.test_coco.reset()

    def configure_optimizers(self) -> dict:
        trainable = [p for p in self.net.parameters() if p.requires_grad]
        return per_update(self.optimizer_factory(trainable), self.scheduler_factory, self)
