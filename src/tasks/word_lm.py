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

from src.decoding.generation import draw
from src.optim.clipping import FusedOptimizerClipping
from src.optim.schedules import per_update
from src.tasks.finetune import InitFromCheckpoint

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]
SchedulerFactory = Callable[..., LRScheduler]


class WordLMTask(InitFromCheckpoint, FusedOptimizerClipping, L.LightningModule):
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
        # fairseq's adaptive_loss: summed NLL divided by the number of target tokens
        loss = self.net.loss(tokens, targets, reduction="mean")
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        tokens, targets = batch
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


@torch.no_grad()
def sample(
    net: nn.Module,
    prompt: Tensor,
    num_tokens: int,
    *,
    context: int,
    temperature: float = 1.0,
    top_k: int = 0,
    banned: Tensor | None = None,
    stop: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue ``prompt`` by ``num_tokens`` words drawn one at a time from
    ``softmax(log_prob / temperature)`` (the ``top_k`` most probable when ``top_k > 0``).

    The network keeps no state between calls, so each step reruns the last ``context`` tokens
    (the training ``tokens_per_sample``: the model has seen no longer history).

    Args:
        net: the language model (``log_prob(tokens)``), in eval mode.
        prompt: the context, at least one token (start it with ``</s>`` as the corpus does).
        num_tokens: how many words to add.
        context: longest history a step reads.
        temperature: > 0.
        top_k: keep only the k most probable words (0: all; 1: greedy).
        banned: ids never produced (the specials, the padding entries), or None.
        stop: an id (the end of sentence) after which a row adds nothing: its later positions
            repeat ``stop``, and sampling ends once every row has produced it. None: never stop.
        generator: random source, for reproducible samples.

    Shape:
        prompt (B, T) int64 -> (B, n) int64, n = num_tokens unless every row stopped earlier
    """
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be (B, T) with T >= 1, got {tuple(prompt.shape)}")
    if num_tokens < 0 or context < 1 or not temperature > 0 or top_k < 0:
        raise ValueError(
            f"need num_tokens >= 0, context >= 1, temperature > 0, top_k >= 0; got {num_tokens}, "
            f"{context}, {temperature}, {top_k}"
        )
    allowed = None if banned is None else ~banned
    stopped = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)  # (B,)
    tokens = prompt
    for _ in range(num_tokens):
        if stop is not None and bool(stopped.all()):
            break
        scores = net.log_prob(tokens[:, -context:])[:, -1]  # (B, V)
        choice = draw(scores, temperature=temperature, top_k=top_k, allowed=allowed, generator=generator)  # (B,)
        if stop is not None:
            choice = choice.masked_fill(stopped, stop)
            stopped |= choice == stop
        tokens = torch.cat([tokens, choice[:, None]], dim=1)
    return tokens[:, prompt.shape[1] :]
