"""Word-level LM task: token-weighted loss and perplexity over a split, context-window
evaluation (every token once; context 0 equals plain blocks), the optimiser factories, sampling,
and a short real training run of the demo."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from src.commands.train import train
from src.datamodules.word_lm import PAD, ContextWindows, TokenBlocks, WordLMDataModule, collate
from src.decoding.generation import sample_windowed
from src.models.delight_lm import DeLighTLanguageModel
from src.optim.schedules import warmup_cosine
from src.tasks.word_lm import WordLMTask
from tests.conftest import compose_config

VOCAB = 40
NO_DROPOUT = {
    name: 0.0
    for name in ("dropout", "attention_dropout", "ffn_dropout", "dextra_dropout",
                 "embedding_dropout", "position_dropout", "adaptive_softmax_dropout")
}  # fmt: skip


def tiny_net() -> DeLighTLanguageModel:
    torch.manual_seed(0)
    return DeLighTLanguageModel(VOCAB, 64, 2, 3, 2.0, cutoffs=(10, 20), **NO_DROPOUT).eval()


def make_task(net: DeLighTLanguageModel) -> WordLMTask:
    return WordLMTask(net, partial(torch.optim.Adam, lr=1e-3, betas=(0.9, 0.98)))


def evaluate(task: WordLMTask, dataset, batch_size: int = 3) -> tuple[float, float]:
    """(loss, ppl) the task logs for ``dataset`` as a validation split."""
    logged = {}
    task.log = lambda name, value, **_: logged.__setitem__(name, float(value))
    with torch.no_grad():
        for begin in range(0, len(dataset), batch_size):
            items = [dataset[j] for j in range(begin, min(begin + batch_size, len(dataset)))]
            task.validation_step(collate(items), 0)
        task.on_validation_epoch_end()
    return logged["val/loss"], logged["val/ppl"]


def stream() -> np.ndarray:
    return np.random.default_rng(0).integers(4, VOCAB, size=53)


def test_context_zero_equals_plain_block_evaluation() -> None:
    net = tiny_net()
    task = make_task(net)
    loss, ppl = evaluate(task, ContextWindows(stream(), 8, 0))
    blocks = TokenBlocks(stream(), 8)
    with torch.no_grad():
        total = sum(float(net.loss(*collate([blocks[k]]))) for k in range(len(blocks)))
    assert loss == pytest.approx(total / 53, rel=1e-5)
    assert ppl == pytest.approx(math.exp(total / 53), rel=1e-5)


def test_context_windows_score_each_token_once_with_its_context() -> None:
    net = tiny_net()
    task = make_task(net)
    tokens = stream()
    loss, _ = evaluate(task, ContextWindows(tokens, 8, 5))
    # tokens 0..7 are scored in window 0 from all earlier ones; token t >= 8 in the window of
    # stride 3 holding it, which starts 5 tokens before that window's first scored token
    shifted = np.concatenate([[2], tokens])  # </s> predicts the first token
    nll = []
    with torch.no_grad():
        for t in range(len(tokens)):
            start = 0 if t < 8 else t - 5 - (t - 8) % 3
            inputs = torch.tensor(shifted[start : t + 1][None])
            nll.append(float(-net.log_prob(inputs)[0, -1, tokens[t]]))
    assert loss == pytest.approx(sum(nll) / len(tokens), rel=1e-4)


def test_training_step_is_the_mean_nll() -> None:
    net = tiny_net()
    task = make_task(net)
    task.log = lambda *args, **kwargs: None
    inputs, targets = collate([TokenBlocks(stream(), 8)[k] for k in range(2)])
    targets[0, :3] = PAD
    loss = task.training_step((inputs, targets), 0)
    assert float(loss) == pytest.approx(float(net.loss(inputs, targets) / 13), rel=1e-5)
    assert task(inputs).shape == (2, 8, VOCAB)


def test_optimizer_and_scheduler_factories() -> None:
    task = WordLMTask(
        tiny_net(), partial(torch.optim.Adam, lr=2e-3, betas=(0.9, 0.98)),
        partial(warmup_cosine, warmup_steps=10, eta_min=1e-7),
    )  # fmt: skip
    task.trainer = type("T", (), {"estimated_stepping_batches": 100})()
    config = task.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert (
        optimizer.defaults["betas"] == (0.9, 0.98) and config["lr_scheduler"]["interval"] == "step"
    )
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2e-4)  # warm-up starts at lr / 10
    for _ in range(10):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2e-3)


def test_sampling_draws_allowed_words_reproducibly() -> None:
    net = tiny_net()
    prompt = torch.tensor([[2, 5, 6]])
    banned = torch.zeros(VOCAB, dtype=torch.bool)
    banned[:4] = True
    draw = partial(sample_windowed, net, prompt, 12, context=8, banned=banned)
    a = draw(generator=torch.Generator().manual_seed(0))
    b = draw(generator=torch.Generator().manual_seed(0))
    assert a.shape == (1, 12) and torch.equal(a, b) and int(a.min()) >= 4
    greedy = draw(top_k=1)
    expected = net.log_prob(prompt)[0, -1].masked_fill(banned, -math.inf).argmax()
    assert int(greedy[0, 0]) == int(expected)


def test_full_split_through_the_trainer_matches(tmp_path: Path) -> None:
    (tmp_path / "wiki.train.tokens").write_text("a b c d e\n" * 6)
    (tmp_path / "wiki.valid.tokens").write_text("a b c\nd e a b\n" * 3)
    (tmp_path / "wiki.test.tokens").write_text("e d c b a\n")
    dm = WordLMDataModule(str(tmp_path), None, 8, 2, eval_batch_size=2, eval_context_window=4)
    net = DeLighTLanguageModel(dm.vocab_size, 64, 2, 3, 2.0, cutoffs=(5, 6), **NO_DROPOUT)
    task = make_task(net)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False
    )
    (result,) = trainer.validate(task, datamodule=dm, verbose=False)
    windows = ContextWindows(dm.splits["val"], 8, 4)
    with torch.no_grad():
        total = sum(float(net.loss(*collate([windows[j]]))) for j in range(len(windows)))
    assert result["val/loss"] == pytest.approx(total / 27, rel=1e-5)  # 27 tokens with </s>
    assert result["val/ppl"] == pytest.approx(math.exp(total / 27), rel=1e-5)


@pytest.mark.slow
def test_demo_trains_below_the_unigram_perplexity(tmp_path: Path) -> None:
    """A short ``experiment=delight_lm/demo`` run: test perplexity below the corpus's unigram one
    (~81)."""
    overrides = [
        "experiment=delight_lm/demo", "trainer.max_steps=60", "trainer.val_check_interval=60",
        "trainer.limit_val_batches=4", "callbacks.progress_bar=null",
        f"data.root={tmp_path / 'data'}",
    ]  # fmt: skip
    summary = train(compose_config("train", overrides, tmp_path / "run"))
    assert summary["status"] == "finished"
    assert summary["metrics"]["test/ppl"] == pytest.approx(
        math.exp(summary["metrics"]["test/loss"]), rel=1e-4
    )
    assert summary["metrics"]["test/ppl"] < 81
