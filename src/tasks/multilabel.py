"""Multi-label image classification: binary cross-entropy per label, the multi-label F1 family and
mAP (thesis Table 3.7, MS-COCO).

A label is predicted when its logit is above 0 (probability 0.5). Reported, as in the thesis and
the multi-label literature (e.g. Wang et al., CNN-RNN, CVPR'16):

- CP, CR: precision and recall of each label, averaged over labels (torchmetrics ``macro``);
- CF1 = 2 CP CR / (CP + CR), the harmonic mean of the averages (not the average of per-label F1);
- OP, OR, OF1: precision, recall and F1 over all (image, label) decisions (torchmetrics ``micro``;
  OF1 is both the micro F1 and the harmonic mean of OP and OR);
- mAP: average precision of each label's ranking, averaged over labels (torchmetrics ``macro``).
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MultilabelAveragePrecision,
    MultilabelF1Score,
    MultilabelPrecision,
    MultilabelRecall,
)

from src.optim.clipping import FusedOptimizerClipping
from src.optim.schedules import per_update
from src.tasks.classification import OptimizerFactory, SchedulerFactory
from src.tasks.finetune import load_network_weights
from src.utils.memory_format import channels_last_images, channels_last_network


def harmonic_mean(a: Tensor, b: Tensor) -> Tensor:
    """2ab / (a + b), and 0 where both are 0."""
    total = a + b
    return torch.where(total > 0, 2 * a * b / total, torch.zeros_like(total))


def multilabel_metrics(num_labels: int) -> MetricCollection:
    """CP, CR, OP, OR, OF1 at probability 0.5 and mAP; CF1 is derived from CP and CR."""
    return MetricCollection(
        {
            "CP": MultilabelPrecision(num_labels, threshold=0.5, average="macro"),
            "CR": MultilabelRecall(num_labels, threshold=0.5, average="macro"),
            "OP": MultilabelPrecision(num_labels, threshold=0.5, average="micro"),
            "OR": MultilabelRecall(num_labels, threshold=0.5, average="micro"),
            "OF1": MultilabelF1Score(num_labels, threshold=0.5, average="micro"),
            "mAP": MultilabelAveragePrecision(num_labels, average="macro"),
        }
    )


class MultiLabelTask(FusedOptimizerClipping, L.LightningModule):
    """Trains ``net`` with ``BCEWithLogitsLoss`` on multi-hot targets.

    Training logs the loss; validation and test log the loss, CP, CR, CF1, OP, OR, OF1 and mAP,
    computed over the whole epoch (torchmetrics, reduced over processes in distributed runs).

    Args:
        net: maps images to one logit per label.
        num_classes: number of labels.
        optimizer: factory called with the parameters (a Hydra ``_partial_``).
        scheduler: factory called as ``scheduler(optimizer, total_steps=...)``, stepped every
            optimiser step; ``None`` keeps the learning rate constant.
        init_checkpoint: checkpoint (e.g. an ImageNet run's) whose network weights initialise
            ``net`` when fitting starts (weights only).
        init_skip_mismatched: keep ``net``'s fresh values for entries whose shape differs in the
            checkpoint (the 1000-class ImageNet classifier when fine-tuning for 80 labels).
        channels_last: train and evaluate in channels-last layout
            (:mod:`src.utils.memory_format`); False keeps the loader's layout.

    Shape:
        batch: ((B, C, H, W) float images, (B, num_classes) float {0, 1} targets);
        forward returns (B, num_classes) logits.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        *,
        init_checkpoint: str | None = None,
        init_skip_mismatched: bool = False,
        channels_last: bool = True,
    ) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.net = channels_last_network(net) if channels_last else net
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.init_checkpoint = init_checkpoint
        self.init_skip_mismatched = init_skip_mismatched
        self.criterion = nn.BCEWithLogitsLoss()
        metrics = multilabel_metrics(num_classes)
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")

    def setup(self, stage: str) -> None:
        # at fit start, before Lightning restores a resumed checkpoint (which then wins)
        if stage == "fit" and self.init_checkpoint is not None:
            load_network_weights(
                self.net, self.init_checkpoint, skip_mismatched=self.init_skip_mismatched
            )

    def forward(self, images: Tensor) -> Tensor:
        return self.net(channels_last_images(images) if self.channels_last else images)

    def _loss(self, batch: tuple[Tensor, Tensor], stage: str) -> tuple[Tensor, Tensor]:
        images, targets = batch
        logits = self(images)
        loss = self.criterion(logits, targets)
        training = stage == "train"
        self.log(
            f"{stage}/loss",
            loss,
            prog_bar=True,
            on_step=training,
            on_epoch=True,
            sync_dist=not training,
        )
        return logits, loss

    def _evaluate(
        self, batch: tuple[Tensor, Tensor], stage: str, metrics: MetricCollection
    ) -> None:
        logits, _ = self._loss(batch, stage)
        # probabilities, not logits: torchmetrics would read logits that all lie in [0, 1] as
        # probabilities and threshold them at 0.5 instead of 0
        metrics.update(torch.sigmoid(logits.detach()), batch[1].long())

    def _log_epoch(self, stage: str, metrics: MetricCollection) -> None:
        values = metrics.compute()
        values[f"{stage}/CF1"] = harmonic_mean(values[f"{stage}/CP"], values[f"{stage}/CR"])
        self.log_dict(values, prog_bar=False)
        metrics.reset()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._loss(batch, "train")[1]

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_metrics)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_metrics)

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test", self.test_metrics)

    def configure_optimizers(self) -> dict:
        return per_update(self.optimizer_factory(self.parameters()), self.scheduler_factory, self)
