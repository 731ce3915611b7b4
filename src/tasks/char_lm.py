"""Character-level language modelling, segment-level recurrence: cross-entropy, bits per character.

The network maps ``(tokens, memories)`` to ``(logits, new_memories)`` (Transformer-XL,
Group-Transformer). Batches arrive in stream order (see ``src.datamodules.char_lm``), so the
memories returned for one batch are the context of the next; they are carried across batches,
detached by the network, and reset at the start of every training epoch and every evaluation loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import lightning as L
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MeanMetric

from src.optim.clipping import FusedOptimizerClipping
from src.optim.schedules import per_update
from src.tasks.finetune import InitFromCheckpoint
from src.tasks.graphed import GraphedStep

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]
SchedulerFactory = Callable[..., LRScheduler]


class CharLMTask(GraphedStep, InitFromCheckpoint, FusedOptimizerClipping, L.LightningModule):
    """Trains ``net`` by next-symbol cross-entropy; logs loss (nats) and bpc = loss / ln 2.

    Validation and test report the token-weighted mean over the whole split (``val/bpc``,
    ``test/bpc``), reduced over all processes.

    Args:
        net: ``(tokens (B, T), memories | None) -> (logits (B, T, V), new_memories | None)``
            with a ``mem_len`` attribute.
        optimizer: factory called with the parameters (a Hydra ``_partial_``).
        scheduler: factory called as ``scheduler(optimizer, total_steps=...)``, stepped every
            optimiser step; ``None`` keeps the learning rate constant.
        eval_mem_len: memory length during validation and test (Transformer-XL evaluates with a
            longer memory than it trains with); None keeps the network's training ``mem_len``.

    Shape:
        batch: ((B, T) int64 inputs, (B, T) int64 targets); forward returns (B, T, V) logits and
        the new memories.
    """

    graphs_per_shape = 4  # training and evaluation, each with and without memories

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        *,
        eval_mem_len: int | None = None,
        init_checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        if eval_mem_len is not None and eval_mem_len < 0:
            raise ValueError(f"eval_mem_len must be >= 0 or None, got {eval_mem_len}")
        self.net = net
        self.init_checkpoint = init_checkpoint
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.eval_mem_len = eval_mem_len
        self.train_mem_len: int = net.mem_len
        self.memories: dict[str, list[Tensor] | None] = {"train": None, "val": None, "test": None}
        self.val_nll = MeanMetric()
        self.test_nll = MeanMetric()

    def forward(
        self, tokens: Tensor, memories: list[Tensor] | None = None
    ) -> tuple[Tensor, list[Tensor] | None]:
        return self.net(tokens, memories)

    def _nll(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        tokens, targets = batch
        self.begin_step()
        if hasattr(
            self.net, "loss"
        ):  # scores without forming (B, T, V) where it can (adaptive softmax)
            nll, memories = self.net.loss(tokens, targets, self.memories[stage])
            self.memories[stage] = self.keep(memories)
            return nll.mean()  # over B*T
        logits, memories = self.net(tokens, self.memories[stage])
        self.memories[stage] = self.keep(memories)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean over B*T

    def units(self, nll: Tensor) -> dict[str, Tensor]:
        """The metrics a mean NLL (nats) is reported in besides ``loss``: bits per character."""
        return {"bpc": nll / math.log(2)}

    # -- training -----------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        self.memories["train"] = None

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._nll(batch, "train")
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        for name, value in self.units(loss.detach()).items():
            self.log(f"train/{name}", value, prog_bar=True, on_step=True, on_epoch=True)
        return loss

    # -- evaluation ---------------------------------------------------------------------------
    def _start_eval(self, stage: str) -> None:
        self.memories[stage] = None
        if self.eval_mem_len is not None:
            self.net.mem_len = self.eval_mem_len

    def _end_eval(self, stage: str, metric: MeanMetric) -> None:
        self.net.mem_len = self.train_mem_len
        self.memories[stage] = None
        nll = metric.compute()  # token-weighted mean over the split and all processes
        metric.reset()
        self.log(f"{stage}/loss", nll, prog_bar=False)
        for name, value in self.units(nll).items():
            self.log(f"{stage}/{name}", value, prog_bar=True)

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str, metric: MeanMetric) -> None:
        loss = self._nll(batch, stage)
        metric.update(loss, weight=batch[1].numel())

    def on_validation_epoch_start(self) -> None:
        self._start_eval("val")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_nll)

    def on_validation_epoch_end(self) -> None:
        self._end_eval("val", self.val_nll)

    def on_test_epoch_start(self) -> None:
        self._start_eval("test")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_nll)

    def on_test_epoch_end(self) -> None:
        self._end_eval("test", self.test_nll)

    def configure_optimizers(self) -> dict:
        return per_update(self.optimizer_factory(self.parameters()), self.scheduler_factory, self)
