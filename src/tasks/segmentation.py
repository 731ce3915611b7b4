"""Semantic segmentation: per-pixel cross-entropy, mIoU and pixel accuracy (thesis ch. 2-3).

The thesis trains its segmentation networks in two stages (low resolution, then high resolution
with frozen batch norm, starting from the first stage's weights) with the decoder's learning rate
ten times the encoder's. Here these are task options: ``init_checkpoint`` (weights-only init),
``freeze_bn`` and ``head_lr_multiplier`` applied to the parameters named ``head_prefix*``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

from src.optim.clipping import FusedOptimizerClipping
from src.optim.schedules import per_update
from src.tasks.classification import OptimizerFactory, SchedulerFactory
from src.tasks.finetune import batch_norms, freeze_batch_norm_parameters, load_network_weights
from src.utils.memory_format import channels_last_images, channels_last_network


def inverse_log_frequency_weights(
    pixel_counts: Sequence[float] | Tensor, c: float = 1.10
) -> Tensor:
    """Class weights ``1 / ln(c + p_c)`` with ``p_c`` the class's share of the labelled pixels
    (ESPNet, ECCV'18, Cityscapes; from ENet). Rare classes get up to ``1 / ln(c)`` (10.5 for 1.10).

    Shape:
        (num_classes,) counts -> (num_classes,) float32 weights.
    """
    counts = torch.as_tensor(pixel_counts, dtype=torch.float64)
    if counts.ndim != 1 or (counts < 0).any() or counts.sum() <= 0:
        raise ValueError(
            f"need non-negative per-class pixel counts with a positive sum, got {counts.tolist()}"
        )
    if c <= 1.0:
        raise ValueError(f"c must exceed 1 (ln(c + p) > 0), got {c}")
    return (1.0 / torch.log(c + counts / counts.sum())).float()


class SegmentationTask(FusedOptimizerClipping, L.LightningModule):
    """Trains ``net`` with per-pixel cross-entropy; logs loss, mIoU and pixel accuracy per stage.

    Logits smaller than the mask (a decoder that stops at 1/4 resolution) are up-sampled
    bilinearly to the mask size before the loss and the metrics. Pixels labelled
    ``ignore_index`` count in neither. mIoU is torchmetrics' ``MulticlassJaccardIndex``
    (macro over classes that occur in targets or predictions; an ``ignore_index`` inside
    0..num_classes-1, as Cityscapes' background 19, is also left out of the average).

    Args:
        net: maps images (B, 3, H, W) to logits (B, num_classes, H', W').
        num_classes: number of classes (sizes the metrics).
        optimizer: factory called with parameter groups (a Hydra ``_partial_``).
        scheduler: factory called as ``scheduler(optimizer, total_steps=...)``, stepped every
            optimiser step; ``None`` keeps the learning rate constant.
        ignore_index: mask value left out of loss and metrics.
        class_weights: per-class cross-entropy weights (e.g. ``inverse_log_frequency_weights``).
        head_lr_multiplier: learning rate of the parameters named ``head_prefix*`` relative to the
            others (the thesis uses 10 for the decoder).
        head_prefix: name prefix (within ``net``) of the parameters that get the multiplier.
        init_checkpoint: checkpoint whose network weights initialise ``net`` when fitting starts
            (weights only; a stage-2 run from its stage-1 checkpoint).
        freeze_bn: keep every batch norm's running statistics and affine parameters fixed.
        channels_last: train and evaluate in channels-last layout
            (:mod:`src.utils.memory_format`); False keeps the loader's layout.

    Shape:
        batch: ((B, 3, H, W) float images, (B, H, W) int64 masks); forward returns the network's
        logits (B, num_classes, H', W').
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        *,
        ignore_index: int = 255,
        class_weights: Sequence[float] | None = None,
        head_lr_multiplier: float = 1.0,
        head_prefix: str = "decoder",
        init_checkpoint: str | None = None,
        freeze_bn: bool = False,
        channels_last: bool = True,
    ) -> None:
        super().__init__()
        if class_weights is not None and len(class_weights) != num_classes:
            raise ValueError(
                f"class_weights has {len(class_weights)} values for {num_classes} classes"
            )
        if not (head_lr_multiplier > 0 and math.isfinite(head_lr_multiplier)):
            raise ValueError(f"head_lr_multiplier must be positive, got {head_lr_multiplier}")
        self.channels_last = channels_last
        self.net = channels_last_network(net) if channels_last else net
        self.num_classes = num_classes
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.ignore_index = ignore_index
        self.head_lr_multiplier = head_lr_multiplier
        self.head_prefix = head_prefix
        self.init_checkpoint = init_checkpoint
        self.freeze_bn = freeze_bn
        weight = (
            torch.tensor(class_weights, dtype=torch.float32) if class_weights is not None else None
        )
        self.criterion = nn.CrossEntropyLoss(weight=weight, ignore_index=ignore_index)
        if freeze_bn:
            freeze_batch_norm_parameters(net)
        collection = MetricCollection(
            {
                "mIoU": MulticlassJaccardIndex(
                    num_classes, average="macro", ignore_index=ignore_index
                ),
                "pixel_acc": MulticlassAccuracy(
                    num_classes, average="micro", ignore_index=ignore_index
                ),
            }
        )
        self.train_metrics = collection.clone(prefix="train/")
        self.val_metrics = collection.clone(prefix="val/")
        self.test_metrics = collection.clone(prefix="test/")

    def setup(self, stage: str) -> None:
        # at fit start, before Lightning restores a resumed checkpoint (which then wins), and not
        # for eval/complexity runs, which have their own weights
        if stage == "fit" and self.init_checkpoint is not None:
            load_network_weights(self.net, self.init_checkpoint)

    def train(self, mode: bool = True) -> SegmentationTask:
        super().train(mode)
        if self.freeze_bn:
            for layer in batch_norms(self.net):
                layer.eval()
        return self

    def forward(self, images: Tensor) -> Tensor:
        return self.net(channels_last_images(images) if self.channels_last else images)

    def _shared_step(
        self, batch: tuple[Tensor, Tensor], stage: str, metrics: MetricCollection
    ) -> Tensor:
        images, masks = batch
        logits = self(images)
        if logits.ndim != 4 or logits.shape[1] != self.num_classes:
            raise ValueError(
                f"segmentation needs logits (B, {self.num_classes}, H', W'); the network returned "
                f"{tuple(logits.shape)}"
            )
        if logits.shape[-2:] != masks.shape[-2:]:
            logits = F.interpolate(
                logits, size=masks.shape[-2:], mode="bilinear", align_corners=False
            )
        loss = self.criterion(logits, masks)
        metrics.update(logits.detach().argmax(dim=1), masks)
        training = stage == "train"
        self.log(
            f"{stage}/loss",
            loss,
            prog_bar=True,
            on_step=training,
            on_epoch=True,
            sync_dist=not training,
        )
        self.log_dict(metrics, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._shared_step(batch, "train", self.train_metrics)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "val", self.val_metrics)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test", self.test_metrics)

    def parameter_groups(self) -> list[dict]:
        """The trainable parameters: one group, or [others, ``head_prefix*`` with
        ``lr_multiplier``]."""
        named = [(name, p) for name, p in self.net.named_parameters() if p.requires_grad]
        if self.head_lr_multiplier == 1.0:
            return [{"params": [p for _, p in named]}]
        head = [p for name, p in named if name.startswith(self.head_prefix)]
        if not head:
            roots = sorted({name.split(".")[0] for name, _ in named})
            raise ValueError(
                f"head_lr_multiplier={self.head_lr_multiplier} but no trainable parameter of "
                f"{type(self.net).__name__} starts with head_prefix={self.head_prefix!r}; its "
                f"top-level names: {roots}"
            )
        rest = [p for name, p in named if not name.startswith(self.head_prefix)]
        return [{"params": rest}, {"params": head, "lr_multiplier": self.head_lr_multiplier}]

    def configure_optimizers(self) -> dict:
        groups = self.parameter_groups()
        optimizer = self.optimizer_factory(groups)
        # scale before the scheduler is built: schedulers take each group's lr as its base
        for group in optimizer.param_groups:
            group["lr"] *= group.get("lr_multiplier", 1.0)
        return per_update(optimizer, self.scheduler_factory, self)
