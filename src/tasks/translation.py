"""Machine translation: label-smoothed cross-entropy with teacher forcing, BLEU by beam search.

Training minimises cross-entropy with label smoothing (0.1 in every DeLighT and baseline recipe)
over the non-pad target tokens of each token-count batch. torch's ``label_smoothing`` spreads
epsilon over all V classes, ``(1 - eps) NLL + eps / V * sum(-log p)``: fairseq's
``label_smoothed_cross_entropy`` spreads it over V - 1 (``eps / (V - 1)`` on the others), a
difference of about eps / V in the target's weight (1e-5 at V = 8,848).

Validation reports the token-mean loss, NLL and perplexity over the split; with
``val_decoding`` it also translates the split (greedy by default: cheap) and reports BLEU.
Test translates with beam search (``beam_size``, ``length_penalty``, ``max_len_a/b``: the
official ``generate.py`` options) and reports:

- ``test/bleu``: the papers' tokenised BLEU (:func:`src.evaluation.bleu.tokenized_bleu`: whitespace
  tokens of tokenised data, with ``compound_split`` for WMT'14 En-De; 13a tokens of raw text);
- ``test/sacrebleu``: sacreBLEU on the decoded text (detokenised for raw-text corpora; for
  tokenised corpora it scores the tokenised text, which is not the standard signature).

The datamodule supplies ``decode(ids) -> str`` (the target codec) and ``tokenized`` (whether
references are tokenised text); the batches carry the references and each pair's index in its
split (``id``).

After the test, :attr:`TranslationTask.test_outputs` holds every test pair's translation and
reference in the order of the test split, gathered from all processes: what ``train.py`` writes
to ``test_outputs.json`` for paired comparisons of two models on the same sentences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MeanMetric

from src.decoding.beam_search import beam_search, greedy_search
from src.evaluation.bleu import sacre_bleu, tokenized_bleu
from src.models.packing import PackedRows
from src.optim.clipping import FusedOptimizerClipping
from src.optim.schedules import per_update
from src.tasks.finetune import InitFromCheckpoint
from src.tasks.graphed import GraphedStep

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]
SchedulerFactory = Callable[..., LRScheduler]
DECODINGS = ("greedy", "beam", "none")


class TranslationTask(GraphedStep, InitFromCheckpoint, FusedOptimizerClipping, L.LightningModule):
    """Trains an encoder-decoder ``net`` by teacher forcing; evaluates by translating.

    Args:
        net: ``(src_tokens (B, S), src_padding_mask (B, S) | None, prev_output_tokens (B, T)) ->
            logits (B, T, V)``, with ``encode``/``decode_step`` for the searches
            (:mod:`src.decoding.beam_search`).
        optimizer: factory called with the parameters (a Hydra ``_partial_``).
        scheduler: factory called as ``scheduler(optimizer, total_steps=...)``, stepped every
            update; None keeps the learning rate constant.
        label_smoothing: epsilon of the smoothed cross-entropy.
        padding_idx: the pad id (ignored by the loss, never generated).
        eos: end of sentence, also the decoder's first input.
        beam_size: beam of the test translations (and of validation with ``val_decoding="beam"``).
        length_penalty: the exponent of the length normalisation.
        max_len_a: a in the longest translation ``a * src_len + b``.
        max_len_b: b in it.
        val_decoding: ``"greedy"``, ``"beam"`` or ``"none"`` (validation BLEU or not).
        compound_split: split hyphenated compounds before tokenised BLEU (WMT'14 En-De).
        lowercase: compare lowercased text in tokenised BLEU (IWSLT'14 is lowercased by its
            preparation, so this changes nothing there).

    Shape:
        batch: dict of src_tokens (B, S), prev_output_tokens (B, T), target (B, T), id (B,) (int64,
        right-padded; id -1 on rows without a pair) and references (one string per pair)

    Attributes:
        test_outputs: after the test, ``{"kind": "translation", "ids": [...], "hypotheses":
            [...], "references": [...]}``, one entry per test pair sorted by its index in the
            test split; None before.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        *,
        label_smoothing: float = 0.1,
        padding_idx: int = 1,
        eos: int = 2,
        beam_size: int = 5,
        length_penalty: float = 1.0,
        max_len_a: float = 0.0,
        max_len_b: int = 200,
        val_decoding: str = "greedy",
        compound_split: bool = False,
        lowercase: bool = False,
        init_checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        if val_decoding not in DECODINGS:
            raise ValueError(f"val_decoding must be one of {DECODINGS}, got {val_decoding!r}")
        if not 0.0 <= label_smoothing < 1.0 or beam_size < 1:
            raise ValueError(
                "need 0 <= label_smoothing < 1 and beam_size >= 1, got "
                f"{label_smoothing}, {beam_size}"
            )
        self.net = net
        self.init_checkpoint = init_checkpoint
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.label_smoothing = label_smoothing
        self.padding_idx = padding_idx
        self.eos = eos
        self.search = {
            "beam_size": beam_size,
            "length_penalty": length_penalty,
            "max_len_a": max_len_a,
            "max_len_b": max_len_b,
        }
        self.val_decoding = val_decoding
        self.compound_split = compound_split
        self.lowercase = lowercase
        self.loss_metric = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})
        self.nll_metric = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})
        # (index in the split, hypothesis, reference) of the pairs translated so far
        self.translations: dict[str, list[tuple[int, str, str]]] = {"val": [], "test": []}
        self.test_outputs: dict[str, Any] | None = None

    def forward(
        self, src_tokens: Tensor, src_padding_mask: Tensor | None, prev_output_tokens: Tensor
    ) -> Tensor:
        return self.net(src_tokens, src_padding_mask, prev_output_tokens)

    def _losses(self, batch: dict) -> tuple[Tensor, Tensor, Tensor]:
        """Token-mean smoothed loss and NLL of the batch, and its number of target tokens (a
        tensor: counting on the host would wait for the device every step)."""
        self.begin_step()
        inputs = (batch["src_tokens"], None, batch["prev_output_tokens"])
        packing = PackedRows.of(batch)  # several pairs a row (src.models.packing) or None
        logits = self.net(*inputs) if packing is None else self.net(*inputs, packing)  # (B, T, V)
        logits = logits.flatten(0, 1).float()  # the softmax in fp32 under autocast
        target = batch["target"].flatten()
        loss = F.cross_entropy(
            logits, target, ignore_index=self.padding_idx, label_smoothing=self.label_smoothing
        )
        nll = F.cross_entropy(logits.detach(), target, ignore_index=self.padding_idx)
        return loss, nll, target.ne(self.padding_idx).sum()

    # -- training -----------------------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss, nll, _ = self._losses(batch)
        size = batch["target"].shape[0]
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=size)
        self.log("train/nll", nll, on_step=True, on_epoch=True, batch_size=size)
        return loss

    # -- evaluation ---------------------------------------------------------------------------
    def translate(self, src_tokens: Tensor, decoding: str = "beam") -> list[Tensor]:
        """The best translation of each source (token ids ending with eos).

        Shape:
            src_tokens (B, S) int64, right-padded -> B tensors (n_i,)
        """
        common = {
            "eos": self.eos,
            "pad": self.padding_idx,
            **{k: self.search[k] for k in ("max_len_a", "max_len_b", "length_penalty")},
        }
        if decoding == "greedy":
            return [h.tokens for h in greedy_search(self.net, src_tokens, **common)]
        return [
            hyps[0].tokens
            for hyps in beam_search(
                self.net, src_tokens, beam_size=self.search["beam_size"], **common
            )
        ]

    def _eval_step(self, batch: dict, stage: str, decoding: str) -> None:
        loss, nll, ntokens = self._losses(batch)
        self.loss_metric[stage].update(loss, weight=ntokens)
        self.nll_metric[stage].update(nll, weight=ntokens)
        if decoding == "none":
            return
        decode = self.trainer.datamodule.decode
        # the pairs fill the batch's first rows; rows past them (id -1) are padding
        ids = batch["id"][: len(batch["references"])].tolist()
        hypotheses = self.translate(batch["src_tokens"], decoding)
        for index, tokens, reference in zip(ids, hypotheses, batch["references"]):
            self.translations[stage].append((index, decode(tokens.tolist()), reference))

    def _end_eval(self, stage: str) -> dict[str, float]:
        loss, nll = self.loss_metric[stage].compute(), self.nll_metric[stage].compute()
        self.loss_metric[stage].reset()
        self.nll_metric[stage].reset()
        self.log(f"{stage}/loss", loss)
        self.log(f"{stage}/nll", nll)
        self.log(f"{stage}/ppl", torch.exp(nll), prog_bar=True)
        pairs, self.translations[stage] = self.translations[stage], []
        if dist.is_available() and dist.is_initialized():
            gathered: list[list[tuple[int, str, str]]] = [[] for _ in range(dist.get_world_size())]
            dist.all_gather_object(gathered, pairs)
            pairs = [pair for part in gathered for pair in part]
        if not pairs:
            return {}
        # the split's order: the batches group pairs by length and the processes take turns
        pairs.sort(key=lambda pair: pair[0])
        hypotheses, references = [h for _, h, _ in pairs], [r for _, _, r in pairs]
        if stage == "test":
            self.test_outputs = {
                "kind": "translation",
                "ids": [i for i, _, _ in pairs],
                "hypotheses": hypotheses,
                "references": references,
            }
        tokenized = bool(getattr(self.trainer.datamodule, "tokenized", False))
        bleu = tokenized_bleu(
            hypotheses,
            references,
            tokenized=tokenized,
            compound_split=self.compound_split,
            lowercase=self.lowercase,
        )
        self.log(f"{stage}/bleu", bleu, prog_bar=True, sync_dist=False)
        self.log(f"{stage}/sacrebleu", sacre_bleu(hypotheses, references), sync_dist=False)
        return {"bleu": bleu}

    def on_validation_epoch_start(self) -> None:
        self.translations["val"] = []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # the sanity check runs a few batches only: no translating there
        decoding = "none" if self.trainer.sanity_checking else self.val_decoding
        self._eval_step(batch, "val", decoding)

    def on_validation_epoch_end(self) -> None:
        self._end_eval("val")

    def on_test_epoch_start(self) -> None:
        self.translations["test"] = []
        self.test_outputs = None

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch, "test", "beam")

    def on_test_epoch_end(self) -> None:
        self._end_eval("test")

    def configure_optimizers(self) -> dict:
        return per_update(self.optimizer_factory(self.parameters()), self.scheduler_factory, self)
