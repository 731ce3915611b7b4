"""AWD-style word language modelling (AWD-LSTM, AWD-PRU; thesis Sec. 4.4, Merity et al. 2018):
truncated BPTT over contiguous streams, activation regularisation, NT-ASGD.

Batches come from :mod:`src.datamodules.awd_lm`: ``(inputs, targets)``, both (B, T), and row
b of consecutive batches continues one stream, so the recurrent state at the end of a batch is
where the next one starts (detached: truncated back-propagation). The network follows
:class:`src.models.awd_lm.AWDLanguageModel`: ``net(tokens, hidden)`` returns ``logits``,
``hidden``, ``raw_output`` and ``dropped_output``; ``net.init_hidden(B)`` gives zeros.

Training follows the official PRU ``main.py``/``train_utils.py`` (itself AWD-LSTM's):

- loss = token-mean cross-entropy + ``alpha * mean(dropped_output ** 2)`` (AR) +
  ``beta * mean((raw_output[t] - raw_output[t-1]) ** 2)`` (TAR);
- each step's learning rate is the base one times ``T / bptt`` (variable-length windows); the
  optimiser keeps the base, so checkpoints and monitors see it;
- NT-ASGD: SGD first; after each validation of the SGD phase, when more than ``nonmono`` earlier
  validations were seen and the loss is above the best of all but the last ``nonmono`` of them
  (:func:`nonmonotone`), the optimiser becomes ``ASGD(lr, t0=0, lambd=0, weight_decay)`` with the
  SGD's base lr and weight decay. ASGD takes each step with the lr of the step before (its ``eta``
  is updated after the update, in torch's ASGD as in the one the official code ran), so under
  ASGD the length scaling applies one step late, as in the official runs.

In the ASGD phase the averaged weights (ASGD's ``state[p]["ax"]``) are the model: validation
during fitting scores them (swapped in for the pass, out after), every checkpoint holds them as
the network's weights (``state_dict`` ``net.*``, what ``eval.py``, ``trainer.test(ckpt_path=...)``
and ``init_checkpoint`` load; the official saves the averaged model), and the network keeps them
when fitting ends. The weights training continues from are stored beside them
(``checkpoint["nt_asgd"]``): a resumed fit puts them back and builds ASGD again, whose state
Lightning then restores.

Fine-tuning (AWD-LSTM ``finetune.py``, spec Sec. 4.2): ``asgd_from_start`` starts with ASGD (from
``init_checkpoint``, the first stage's best) and stops when the same rule fires on the averaged
model's validation losses.

Generation (``generate.py``): :func:`sample` continues a prompt word by word, carrying the
recurrent state as evaluation does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn
from torch.optim import ASGD, Optimizer
from torchmetrics import SumMetric

from src.models.awd_lm import Hidden
from src.models.awd_state import carried_hidden
from src.optim.clipping import FusedOptimizerClipping
from src.tasks.finetune import load_network_weights
from src.tasks.graphed import GraphedStep

log = logging.getLogger(__name__)

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]


def nonmonotone(history: Sequence[float], loss: float, nonmono: int) -> bool:
    """NT-ASGD's trigger: ``loss`` is above the best of ``history`` but its last ``nonmono``
    entries, and more than ``nonmono`` were seen. ``history`` holds the earlier validation
    losses, not ``loss`` (official ``main.py`` appends after testing)."""
    if nonmono < 1:
        raise ValueError(f"nonmono must be >= 1, got {nonmono}")
    return len(history) > nonmono and loss > min(history[:-nonmono])


def averaged_sgd(optimizer: Optimizer) -> ASGD:
    """``ASGD(t0=0, lambd=0)`` over ``optimizer``'s parameter groups, with their learning rates
    and weight decays: the official switch ``ASGD(params, lr=args.lr, t0=0, lambd=0.,
    weight_decay=args.wdecay)``."""
    groups = [
        {"params": g["params"], "lr": g["lr"], "weight_decay": g.get("weight_decay", 0.0)}
        for g in optimizer.param_groups
    ]
    return ASGD(groups, t0=0, lambd=0.0)


class AWDLMTask(GraphedStep, FusedOptimizerClipping, L.LightningModule):
    """Trains ``net`` by next-word cross-entropy with AR/TAR and NT-ASGD (module docstring).

    Logs ``train/loss`` (cross-entropy, nats per token), ``train/ppl``, ``train/total_loss``
    (with AR and TAR), ``train/asgd`` (1 in the ASGD phase), and over a whole split, token-weighted
    and reduced over processes, ``val/loss``, ``val/ppl``, ``test/loss``, ``test/ppl``.

    Args:
        net: the recurrent language model (:class:`src.models.awd_lm.AWDLanguageModel`).
        optimizer: factory called with the parameters (a Hydra ``_partial_``; official
            ``SGD(lr=30, weight_decay=1.2e-6)``); its lr is the base that each step scales.
        bptt: the nominal window length; a batch of T steps trains with lr * T / bptt.
        alpha: weight of the activation regularisation (AR) of the dropped last-layer output.
        beta: weight of the temporal activation regularisation (TAR) of the raw output.
        nonmono: validations the NT-ASGD rule looks past (>= 1).
        asgd: switch to ASGD by the NT-ASGD rule; False trains with the optimiser throughout.
        asgd_from_start: start in the ASGD phase and stop fitting when the rule fires on the
            averaged model's validation losses (fine-tuning).
        init_checkpoint: checkpoint whose network weights initialise ``net`` when fitting starts
            (weights only: the optimiser, epoch and NT-ASGD history start fresh).

    Shape:
        batch: ((B, T) int64 inputs, (B, T) int64 targets);
        forward: tokens (B, T), hidden -> the network's output (logits (B, T, V))
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        *,
        bptt: int,
        alpha: float = 2.0,
        beta: float = 1.0,
        nonmono: int = 5,
        asgd: bool = True,
        asgd_from_start: bool = False,
        init_checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        if bptt < 1 or nonmono < 1 or alpha < 0 or beta < 0:
            raise ValueError(
                f"need bptt >= 1, nonmono >= 1, alpha >= 0, beta >= 0; got {bptt}, {nonmono}, "
                f"{alpha}, {beta}"
            )
        if asgd_from_start and not asgd:
            raise ValueError("asgd_from_start=True needs asgd=True")
        self.net = net
        self.optimizer_factory = optimizer
        self.bptt = bptt
        self.alpha = alpha
        self.beta = beta
        self.nonmono = nonmono
        self.asgd = asgd
        self.asgd_from_start = asgd_from_start
        self.init_checkpoint = init_checkpoint
        self.asgd_phase = asgd_from_start
        self.val_history: list[float] = []
        self.nll = nn.ModuleDict({"val": SumMetric(), "test": SumMetric()})
        self.scored = nn.ModuleDict({"val": SumMetric(), "test": SumMetric()})
        self._train_hidden: Hidden | None = None
        self._eval_hidden: Hidden | None = None
        self._seq_len = bptt
        # the weights training continues from, while the averaged ones are in the network
        self._training_weights: list[tuple[nn.Parameter, Tensor]] | None = None

    def forward(self, tokens: Tensor, hidden: Hidden | None = None) -> Any:
        return self.net(tokens, hidden)

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.init_checkpoint is not None:
            load_network_weights(self.net, self.init_checkpoint)

    # ---- training -------------------------------------------------------------------------------

    def on_train_epoch_start(self) -> None:
        self._train_hidden = None

    def on_train_batch_start(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._seq_len = batch[0].shape[1]

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        tokens, targets = batch
        hidden = carried_hidden(self.net, self._train_hidden, tokens.shape[0])
        self.begin_step()
        out = self.net(tokens, hidden)
        self._train_hidden = self.keep(out.hidden)
        ce = F.cross_entropy(out.logits.flatten(0, 1), targets.flatten())
        ar = self.alpha * out.dropped_output.pow(2).mean()
        raw = out.raw_output  # (B, T, E)
        tar = self.beta * (raw[:, 1:] - raw[:, :-1]).pow(2).mean() if raw.shape[1] > 1 else 0.0
        loss = ce + ar + tar
        tokens_in_batch = targets.numel()
        self.log("train/loss", ce, prog_bar=True, on_step=True, on_epoch=True,
                 batch_size=tokens_in_batch)  # fmt: skip
        self.log("train/ppl", torch.exp(ce.detach()), on_step=True, on_epoch=False)
        self.log("train/total_loss", loss, on_step=True, on_epoch=True, batch_size=tokens_in_batch)
        self.log("train/asgd", float(self.asgd_phase), on_step=True, on_epoch=False)
        return loss

    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Optimizer | LightningOptimizer,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        # official train(): lr2 = lr; lr = lr2 * seq_len / bptt; step; lr = lr2
        base = [group["lr"] for group in optimizer.param_groups]
        for group, lr in zip(optimizer.param_groups, base):
            group["lr"] = lr * self._seq_len / self.bptt
        try:
            super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        finally:
            for group, lr in zip(optimizer.param_groups, base):
                group["lr"] = lr

    def configure_optimizers(self) -> Optimizer:
        optimizer = self.optimizer_factory(self.parameters())
        return averaged_sgd(optimizer) if self.asgd_phase else optimizer

    # ---- NT-ASGD --------------------------------------------------------------------------------

    def _averages(self) -> list[tuple[nn.Parameter, Tensor]]:
        """(parameter, its ASGD average) of each parameter ASGD has stepped; empty outside the
        ASGD phase of a fit."""
        if not self.asgd_phase or self._trainer is None:
            return []
        optimizers = self.trainer.optimizers
        if len(optimizers) != 1 or not isinstance(optimizers[0], ASGD):
            return []
        state = optimizers[0].state
        return [(p, state[p]["ax"]) for p in self.parameters() if "ax" in state.get(p, {})]

    @torch.no_grad()
    def _use_averages(self) -> None:
        """Put the averaged weights into the network, keeping the training ones aside."""
        if self._training_weights is not None:
            return
        averages = self._averages()
        if averages:
            self._training_weights = [(p, p.detach().clone()) for p, _ in averages]
            for p, ax in averages:
                p.copy_(ax)

    @torch.no_grad()
    def _use_training_weights(self) -> None:
        if self._training_weights is None:
            return
        for p, weight in self._training_weights:
            p.copy_(weight)
        self._training_weights = None

    def _after_validation(self, loss: float) -> None:
        """The NT-ASGD rule on this validation's loss (official ``main.py``: only the SGD phase
        keeps a history; fine-tuning keeps the averaged model's and stops on it)."""
        if self.asgd_phase and not self.asgd_from_start:
            return
        fired = nonmonotone(self.val_history, loss, self.nonmono)
        self.val_history.append(loss)
        if not fired:
            return
        if self.asgd_from_start:
            log.info("validation loss %.4f stopped improving under ASGD: fitting stops", loss)
            self.trainer.should_stop = True
        elif self.asgd:
            (optimizer,) = self.trainer.optimizers
            self.trainer.strategy.optimizers = [averaged_sgd(optimizer)]
            self.asgd_phase = True
            log.info("validation loss %.4f: switching to ASGD at step %d", loss,
                     self.trainer.global_step)  # fmt: skip

    def on_fit_end(self) -> None:
        self._use_averages()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state: dict[str, Any] = {
            "asgd_phase": self.asgd_phase,
            "val_history": list(self.val_history),
        }
        # (training weight, averaged weight) of each averaged parameter
        if self._training_weights is not None:
            pairs = {id(p): (w, p.detach()) for p, w in self._training_weights}
        else:
            pairs = {id(p): (p.detach(), ax) for p, ax in self._averages()}
        if pairs:
            training: dict[str, Tensor] = {}
            # by identity: a tied weight is one parameter under two state-dict names
            for name, tensor in self.state_dict(keep_vars=True).items():
                if id(tensor) in pairs and name in checkpoint["state_dict"]:
                    weight, average = pairs[id(tensor)]
                    checkpoint["state_dict"][name] = average.clone()
                    training[name] = weight.clone()
            state["training_weights"] = training
        checkpoint["nt_asgd"] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("nt_asgd")
        if state is None:
            return
        self.asgd_phase = bool(state["asgd_phase"])
        self.val_history = [float(v) for v in state["val_history"]]
        resuming = self._trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if resuming and "training_weights" in state:
            checkpoint["state_dict"].update(state["training_weights"])

    # ---- evaluation -----------------------------------------------------------------------------

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        tokens, targets = batch
        hidden = carried_hidden(self.net, self._eval_hidden, tokens.shape[0])
        self.begin_step()
        out = self.net(tokens, hidden)
        self._eval_hidden = self.keep(out.hidden)
        nll = F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
        self.nll[stage].update(nll)
        # targets of -100 (a padded last window) are skipped by cross_entropy and not counted
        self.scored[stage].update(targets.ne(-100).sum().float())

    def _end_eval(self, stage: str) -> float:
        total, count = self.nll[stage].compute(), self.scored[stage].compute()
        self.nll[stage].reset()
        self.scored[stage].reset()
        self._eval_hidden = None
        loss = total / count.clamp_min(1)
        self.log(f"{stage}/loss", loss)
        self.log(f"{stage}/ppl", torch.exp(loss), prog_bar=True)
        return float(loss)

    def on_validation_start(self) -> None:
        if self.trainer.state.fn == TrainerFn.FITTING:
            self._use_averages()

    def on_validation_epoch_start(self) -> None:
        self._eval_hidden = None

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        loss = self._end_eval("val")
        if self.trainer.state.fn == TrainerFn.FITTING and not self.trainer.sanity_checking:
            self._after_validation(loss)

    def on_validation_end(self) -> None:
        # after the callbacks' on_validation_end (ModelCheckpoint saves there when validating
        # several times an epoch): the checkpoint is written before the training weights return
        if self.trainer.state.fn == TrainerFn.FITTING:
            self._use_training_weights()

    def on_test_epoch_start(self) -> None:
        self._eval_hidden = None

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._end_eval("test")
