"""Word-level language modelling: negative log-likelihood in nats, perplexity = exp(loss).

The network scores its own outputs (an adaptive softmax never forms the V-wide logits):
``net.loss(tokens, targets, reduction=...)`` gives the summed or mean NLL over the targets that
are not ``net.padding_idx``, and ``net.log_prob(tokens)`` the full next-token log-probabilities.
Batches come from :mod:`src.datamodules.word_lm`: training blocks of ``tokens_per_sample``
tokens, and evaluation windows whose context positions carry ``pad`` targets, so summing over the
scored targets of a split scores each of its tokens exactly once (fairseq ``eval_lm
--context-window``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import lightning as L
import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import SumMetric

from src.optim.clipping import FusedOptimizerClipping
from src.optim.schedules import per_update
from src.tasks.finetune import InitFromCheckpoint
from src.tasks.graphed import GraphedStep

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]
SchedulerFactory = Callable[..., LRScheduler]


class WordLMTask(GraphedStep, InitFromCheckpoint, FusedOptimizerClipping, L.LightningModule):
    """Trains ``net`` by next-word NLL; logs ``train/loss`` (nats per token), and for validation
    and test the loss and perplexity over the whole split, token-weighted and reduced over all
    processes (``val/loss``, ``val/ppl``, ``test/loss``, ``test/ppl``).

    Args:
        net: a language model with ``loss(tokens, targets, reduction=...)``,
            ``log_prob(tokens)`` and ``padding_idx`` (:class:`src.models.delight_lm.
            DeLighTLanguageModel`).
        optimizer: factory called with the parameters (a Hydra ``_partial_``).
        scheduler: factory called as ``scheduler(optimizer, total_steps=...)``, stepped every
            optimiser step; None keeps the learning rate constant.

    Shape:
        batch: ((B, T) int64 inputs, (B, T) int64 targets, ``padding_idx`` where not scored);
        forward: tokens (B, T) -> next-token log-probabilities (B, T, V)
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        *,
        init_checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        self.net = net
        self.init_checkpoint = init_checkpoint
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.padding_idx: int = net.padding_idx
        self.nll = nn.ModuleDict({"val": SumMetric(), "test": SumMetric()})
        self.scored = nn.ModuleDict({"val": SumMetric(), "test": SumMetric()})

    def forward(self, tokens: Tensor) -> Tensor:
        return self.net.log_prob(tokens)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        tokens, targets = batch
        self.begin_step()
        # fairseq's adaptive_loss: summed NLL divided by the number of target tokens
        loss = self.net.loss(tokens, targets, reduction="mean")
        self.log("train/loss", self.keep(loss), prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        tokens, targets = batch
        self.begin_step()
        nll = self.net.loss(tokens, targets, reduction="sum")
        self.nll[stage].update(nll.float())
        self.scored[stage].update(targets.ne(self.padding_idx).sum().float())

    def _end_eval(self, stage: str) -> None:
        total, count = self.nll[stage].compute(), self.scored[stage].compute()
        self.nll[stage].reset()
        self.scored[stage].reset()
        loss = total / count.clamp_min(1)
        self.log(f"{stage}/loss", loss)
        self.log(f"{stage}/ppl", torch.exp(loss), prog_bar=True)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._end_eval("val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._end_eval("test")

    def configure_optimizers(self) -> dict:
        return per_update(self.optimizer_factory(self.parameters()), self.scheduler_factory, self)
