"""SSD object detection (thesis Secs. 2.4.3 and 3.6.1; EdgeNets' ``train_detection.py``): the
Lightning task that matches the ground truth to the network's priors, trains with the multibox
loss and scores the post-processed detections with the VOC07 and COCO metrics. The box code is
:mod:`src.models.ssd_boxes`.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn

from src.evaluation.coco_eval import coco_metric
from src.evaluation.voc_eval import VOCMeanAP
from src.models.ssd_boxes import match_priors, multibox_loss, postprocess, to_pixels
from src.optim.clipping import FusedOptimizerClipping
from src.optim.schedules import per_update
from src.tasks.classification import OptimizerFactory, SchedulerFactory
from src.tasks.finetune import freeze_batch_norm_parameters, load_network_weights
from src.utils.memory_format import channels_last_images, channels_last_network


class DetectionTask(FusedOptimizerClipping, L.LightningModule):
    """Trains an SSD network with the multibox loss; evaluates VOC07 and COCO mean AP.

    The batch's ground truth is matched to ``net.priors`` in each step. Training logs
    ``train/loss`` and its parts ``train/loss_loc`` and ``train/loss_cls``; validation logs
    ``val/loss`` and ``val/map`` (VOC07 11-point AP at IoU 0.5, difficult boxes ignored); test
    logs ``test/loss``, ``test/map`` and the COCO numbers of
    :func:`~src.evaluation.coco_eval.coco_metric`: ``test/map_coco`` (AP@[.5:.95]), ``test/map50``
    and ``test/map75``; difficult boxes are COCO crowd regions there. Both metrics see boxes in the
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
            code; :func:`src.models.ssd_boxes.postprocess`).
        init_checkpoint: checkpoint whose network weights initialise ``net`` when fitting starts
            (weights only; the 512 x 512 recipe starts from the 300 x 300 model).
        freeze_bn: stop training the batch norms' affine parameters. Their running statistics
            keep updating, as in the code, whose ``--freeze-bn`` puts the layers in eval mode
            once and is undone by the ``model.train()`` of every epoch.
        channels_last: train and evaluate in channels-last layout
            (:mod:`src.utils.memory_format`); False keeps the loader's layout.

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

    def _loss(self, batch: tuple[Tensor, list[dict]], stage: str) -> tuple[Tensor, Tensor, Tensor]:
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

    def detections(
        self, locations: Tensor, logits: Tensor, targets: list[dict]
    ) -> tuple[list, list]:
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
        self.val_map.update(*self.detections(locations, logits, batch[1]))

    def test_step(self, batch: tuple[Tensor, list[dict]], batch_idx: int) -> None:
        _, locations, logits = self._loss(batch, "test")
        preds, truths = self.detections(locations, logits, batch[1])
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
