"""Single-label text classification: (class-weighted) cross-entropy, accuracy and macro F1.

After the test, :attr:`TextClassificationTask.test_outputs` holds every test text's prediction and
label in the order of the test split, gathered from all processes: what ``train.py`` writes to
``test_outputs.json`` for paired comparisons of two models on the same texts.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from src.optim.clipping import FusedOptimizerClipping
from src.tasks.classification import OptimizerFactory, SchedulerFactory
from src.tasks.finetune import InitFromCheckpoint

# the second validation loader of a data module with ``test_each_epoch`` is the test split
EVAL_STAGES = ("val", "test_epoch")


class TextClassificationTask(InitFromCheckpoint, FusedOptimizerClipping, L.LightningModule):
    """Trains ``net`` on token sequences with cross-entropy; logs loss, accuracy and macro F1.

    Metrics are torchmetrics objects (reduced over processes before logging). ``acc`` is the
    share of correct predictions (micro), ``f1`` the unweighted mean of the per-class F1 scores,
    which a classifier that always answers the majority class cannot raise.

    Args:
        net: maps token ids to class logits.
        num_classes: C.
        optimizer: factory called with the parameters (a Hydra ``_partial_``).
        scheduler: factory called as ``scheduler(optimizer, total_steps=...)``, stepped every
            optimiser step; ``None`` keeps the learning rate constant.
        class_weights: C weights of the cross-entropy (e.g. inverse class frequencies for an
            unbalanced corpus); None weighs every class alike.
        label_smoothing: cross-entropy label smoothing.

    Shape:
        batch: ((B, T) int64 tokens, (B,) int64 labels, (B,) int64 ids: each text's index in its
        split); forward returns (B, C).

    Attributes:
        test_outputs: after the test, ``{"kind": "classification", "ids": [...], "predictions":
            [...], "labels": [...]}``, one entry per test text sorted by its index in the test
            split; None before. Under DDP the logged test metrics also count the few texts the
            distributed sampler repeats to give every process as many; these count each once.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        *,
        class_weights: list[float] | None = None,
        label_smoothing: float = 0.0,
        init_checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        if class_weights is not None and (
            len(class_weights) != num_classes or min(class_weights) <= 0
        ):
            raise ValueError(
                f"class_weights must be {num_classes} positive numbers, got {list(class_weights)}"
            )
        self.net = net
        self.init_checkpoint = init_checkpoint
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        weight = None if class_weights is None else torch.tensor(class_weights, dtype=torch.float)
        self.criterion = nn.CrossEntropyLoss(weight=weight, label_smoothing=label_smoothing)
        collection = MetricCollection(
            {
                "acc": MulticlassAccuracy(num_classes, average="micro"),
                "f1": MulticlassF1Score(num_classes, average="macro"),
            }
        )
        # keyed "<stage>_metrics": a key "train" would clash with nn.Module.train
        self.stage_metrics = nn.ModuleDict(
            {
                f"{stage}_metrics": collection.clone(prefix=f"{stage}/")
                for stage in ("train", *EVAL_STAGES, "test")
            }
        )
        # (ids, predictions, labels) of each test batch, on the host
        self.test_batches: list[tuple[Tensor, Tensor, Tensor]] = []
        self.test_outputs: dict[str, Any] | None = None

    def forward(self, tokens: Tensor) -> Tensor:
        return self.net(tokens)

    def _shared_step(self, batch: tuple[Tensor, Tensor, Tensor], stage: str) -> Tensor:
        tokens, labels, ids = batch
        logits = self(tokens)
        if stage == "test":
            predictions = logits.detach().argmax(dim=1)
            self.test_batches.append((ids.cpu(), predictions.cpu(), labels.cpu()))
        loss = self.criterion(logits, labels)
        metrics = self.stage_metrics[f"{stage}_metrics"]
        metrics.update(logits.detach(), labels)
        training = stage == "train"
        self.log(
            f"{stage}/loss",
            loss,
            prog_bar=True,
            on_step=training,
            on_epoch=True,
            sync_dist=not training,
            add_dataloader_idx=False,
            batch_size=labels.shape[0],
        )
        self.log_dict(
            metrics,
            prog_bar=stage != "test_epoch",
            on_step=False,
            on_epoch=True,
            add_dataloader_idx=False,
        )
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._shared_step(batch, "train")

    def validation_step(
        self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._shared_step(batch, EVAL_STAGES[dataloader_idx])

    def on_test_epoch_start(self) -> None:
        self.test_batches = []
        self.test_outputs = None

    def test_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        batches, self.test_batches = self.test_batches, []
        rows = [
            row
            for ids, predictions, labels in batches
            for row in zip(ids.tolist(), predictions.tolist(), labels.tolist())
        ]
        if dist.is_available() and dist.is_initialized():
            gathered: list[list[tuple[int, int, int]]] = [[] for _ in range(dist.get_world_size())]
            dist.all_gather_object(gathered, rows)
            rows = [row for part in gathered for row in part]
        # the split's order; a distributed sampler repeats a few texts to even out the processes
        unique = sorted({row[0]: row for row in rows}.values())
        if unique:
            self.test_outputs = {
                "kind": "classification",
                "ids": [i for i, _, _ in unique],
                "predictions": [p for _, p, _ in unique],
                "labels": [y for _, _, y in unique],
            }

    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return {"optimizer": optimizer}
        total_steps = int(self.trainer.estimated_stepping_batches)
        scheduler = self.scheduler_factory(optimizer, total_steps=total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
