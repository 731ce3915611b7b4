"""Single-label image classification: cross-entropy, top-1/top-5 accuracy."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import lightning as L
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from src.optim.clipping import FusedOptimizerClipping
from src.optim.schedules import per_update
from src.tasks.finetune import InitFromCheckpoint
from src.utils.memory_format import channels_last_images, channels_last_network

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]
SchedulerFactory = Callable[..., LRScheduler]


class ClassificationTask(InitFromCheckpoint, FusedOptimizerClipping, L.LightningModule):
    """Trains ``net`` with (label-smoothed) cross-entropy; logs loss and accuracy per stage.

    Metrics are torchmetrics objects, so in distributed runs they are reduced over all processes
    before they are logged.

    Args:
        net: maps images to class logits.
        num_classes: number of classes (sizes the metrics).
        optimizer: factory called with the parameters (a Hydra ``_partial_``).
        scheduler: factory called as ``scheduler(optimizer, total_steps=...)``, stepped every
            optimiser step; ``None`` keeps the learning rate constant.
        label_smoothing: cross-entropy label smoothing.
        channels_last: train and evaluate in channels-last layout
            (:mod:`src.utils.memory_format`); False keeps the loader's layout.

    Shape:
        batch: ((B, C, H, W) float images, (B,) int64 labels); forward returns (B, num_classes).
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        *,
        label_smoothing: float = 0.0,
        channels_last: bool = True,
        init_checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.net = channels_last_network(net) if channels_last else net
        self.init_checkpoint = init_checkpoint
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        metrics = {"acc": MulticlassAccuracy(num_classes, top_k=1, average="micro")}
        if num_classes > 5:
            metrics["acc_top5"] = MulticlassAccuracy(num_classes, top_k=5, average="micro")
        collection = MetricCollection(metrics)
        self.train_metrics = collection.clone(prefix="train/")
        self.val_metrics = collection.clone(prefix="val/")
        self.test_metrics = collection.clone(prefix="test/")

    def forward(self, images: Tensor) -> Tensor:
        return self.net(channels_last_images(images) if self.channels_last else images)

    def _shared_step(
        self, batch: tuple[Tensor, Tensor], stage: str, metrics: MetricCollection
    ) -> Tensor:
        images, labels = batch
        logits = self(images)
        loss = self.criterion(logits, labels)
        metrics.update(logits.detach(), labels)
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

    def configure_optimizers(self) -> dict:
        return per_update(self.optimizer_factory(self.parameters()), self.scheduler_factory, self)
