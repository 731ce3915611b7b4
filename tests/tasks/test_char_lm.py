"""The language-modelling task: bpc, memory carried across batches and reset, eval memory length."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from src.models.group_transformer import GroupTransformer
from src.models.transformer_xl import TransformerXL
from src.optim.schedules import warmup_cosine
from src.tasks.char_lm import CharLMTask


class RecordingNet(nn.Module):
    """Uniform logits; records the memory length it receives and returns one-slot memories."""

    def __init__(self, vocab: int, mem_len: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.mem_len = mem_len
        self.bias = nn.Parameter(torch.zeros(vocab))
        self.seen: list[tuple[bool, int]] = []

    def forward(
        self, tokens: Tensor, memories: list[Tensor] | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        self.seen.append((self.training, 0 if memories is None else memories[0].shape[1]))
        h = tokens.float().unsqueeze(-1)  # (B, T, 1)
        new = h if memories is None else torch.cat([memories[0], h], 1)
        return self.bias.expand(*tokens.shape, self.vocab), [new[:, -self.mem_len :].detach()]


class Batches(L.LightningDataModule):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.batches = [
            (torch.randint(0, 5, (2, 4)), torch.randint(0, 5, (2, 4))) for _ in range(n)
        ]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.batches[:3], batch_size=None)


def adam(params):
    return torch.optim.Adam(params, lr=1e-3)


def fit(task: CharLMTask, tmp_path: Path, **trainer_kwargs) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **trainer_kwargs,
    )
    trainer.fit(task, datamodule=Batches(4))
    return trainer


def test_memory_carried_reset_and_eval_length(tmp_path: Path) -> None:
    net = RecordingNet(vocab=5, mem_len=6)
    frozen = lambda params: torch.optim.SGD(params, lr=0.0)  # noqa: E731  (logits stay uniform)
    task = CharLMTask(net, frozen, eval_mem_len=8)
    trainer = fit(task, tmp_path, max_epochs=2, num_sanity_val_steps=0)
    train = [m for training, m in net.seen if training]
    evals = [m for training, m in net.seen if not training]
    # training: empty memory at each epoch start, then 4, then capped at mem_len 6
    assert train == [0, 4, 6, 6] * 2
    # evaluation: reset per loop, memory up to eval_mem_len 8
    assert evals == [0, 4, 8] * 2
    assert net.mem_len == 6  # restored after evaluation
    # uniform logits over 5 symbols: log2(5) bits per character
    assert trainer.callback_metrics["val/bpc"].item() == pytest.approx(math.log2(5), abs=1e-5)
    assert trainer.callback_metrics["val/loss"].item() == pytest.approx(math.log(5), abs=1e-5)


@pytest.mark.parametrize("model", ["group", "xl"])
def test_tiny_models_learn_with_schedule_and_clipping(model: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    if model == "group":
        net: nn.Module = GroupTransformer(5, 1, 16, 2, 32, 2, tgt_len=4, mem_len=4, dropout=0.0)
    else:
        net = TransformerXL(5, 1, 16, 2, 32, mem_len=4, dropout=0.0)
    task = CharLMTask(
        net, adam, lambda opt, total_steps: warmup_cosine(opt, total_steps, warmup_steps=2)
    )
    before = [p.detach().clone() for p in net.parameters()]
    trainer = fit(task, tmp_path, max_steps=6, gradient_clip_val=0.25, num_sanity_val_steps=0)
    assert trainer.global_step == 6
    assert all(not torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert torch.isfinite(trainer.callback_metrics["val/bpc"])
    logits, memories = task(torch.zeros(2, 4, dtype=torch.long))
    assert logits.shape == (2, 4, 5) and len(memories) == 2


def test_negative_eval_mem_len_is_refused() -> None:
    with pytest.raises(ValueError, match="eval_mem_len"):
        CharLMTask(RecordingNet(5, 2), adam, eval_mem_len=-1)
