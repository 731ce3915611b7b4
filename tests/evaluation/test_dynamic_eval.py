"""Dynamic evaluation: no step and no decay is static evaluation, the reference algorithm
(gradient RMS, clipped decay rates, each segment scored before its update), its old
hyper-parameter scaling, adaptation to a repeating stream, segmenting, and the eval config."""

from __future__ import annotations

import logging
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor

from src.commands.eval import dynamic_metrics, evaluate
from src.commands.train import train
from src.datamodules.awd_lm import AWDLMDataModule
from src.evaluation.dynamic_eval import dynamic_evaluate, gradient_statistics, segments
from src.models.awd_lm import AWDLanguageModel
from src.tasks.awd_lm import AWDLMTask
from tests.conftest import compose_config
from tests.tasks.test_awd_lm import VOCAB, TinyLM, make_trainer, write_corpus


def stream(rows: int, length: int, seed: int) -> list[tuple[Tensor, Tensor]]:
    """One (rows, length) batch of random tokens and its next-token targets."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(1, VOCAB, (rows, length + 1), generator=generator)
    return [(data[:, :-1], data[:, 1:])]


def train_segments() -> list[tuple[Tensor, Tensor]]:
    return list(segments(stream(4, 40, 0), 5))


def test_segments_cut_a_stream_of_batches() -> None:
    ((inputs, targets),) = stream(2, 16, 1)
    cuts = [0, 3, 10, 12, 16]
    batches = [(inputs[:, a:b], targets[:, a:b]) for a, b in zip(cuts, cuts[1:])]
    pieces = list(segments(batches, 5))
    assert [x.shape[1] for x, _ in pieces] == [5, 5, 5, 1]
    assert torch.equal(torch.cat([x for x, _ in pieces], 1), inputs)
    assert torch.equal(torch.cat([y for _, y in pieces], 1), targets)
    with pytest.raises(ValueError):
        list(segments(batches, 0))


@torch.no_grad()
def static_loss(net: TinyLM, batches: list[tuple[Tensor, Tensor]]) -> float:
    total, count, hidden = torch.zeros((), dtype=torch.float64), 0, None
    for inputs, targets in batches:
        out = net(inputs, hidden)
        hidden = out.hidden
        total += F.cross_entropy(out.logits.flatten(0, 1), targets.flatten(), reduction="sum")
        count += targets.numel()
    return float(total) / count


def test_no_step_and_no_decay_is_static_evaluation() -> None:
    net = TinyLM().eval()
    test = list(segments(stream(1, 37, 2), 5))
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    result = dynamic_evaluate(net, train_segments(), test, lr=0.0, lamb=0.0)
    assert result.tokens == 37
    assert result.loss == static_loss(net, test)
    assert result.ppl == pytest.approx(math.exp(result.loss))
    for name, p in net.named_parameters():
        assert torch.equal(p, before[name])


def reference(
    net: TinyLM, train: list, test: list, lr: float, lamb: float, epsilon: float, *,
    score_after_update: bool = False,
) -> float:  # fmt: skip
    """``dynamiceval.py``'s gradstat() and evaluate(), restated loop by loop."""
    params = list(net.parameters())
    ms = [torch.zeros_like(p) for p in params]
    hidden = net.init_hidden(train[0][0].shape[0])
    for inputs, targets in train:
        net.zero_grad()
        out = net(inputs, hidden)
        hidden = [(h.detach(), c.detach()) for h, c in out.hidden]
        F.cross_entropy(out.logits.reshape(-1, VOCAB), targets.reshape(-1)).backward()
        ms = [m + p.grad * p.grad for m, p in zip(ms, params)]
    ms = [torch.sqrt(m / len(train)) for m in ms]
    gsum = sum(torch.mean(m) for m in ms) / len(ms)
    decrate = [m / gsum for m in ms]
    decrate = [torch.where(d > 1 / lamb, torch.full_like(d, 1 / lamb), d) for d in decrate]
    data0 = [p.detach().clone() for p in params]
    seq_len0 = test[0][0].shape[1]
    total_loss, batch = 0.0, 0.0
    hidden = net.init_hidden(1)
    for inputs, targets in test:
        net.zero_grad()
        out = net(inputs, hidden)
        loss = F.cross_entropy(out.logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        with torch.no_grad():
            for p, p0, d, m in zip(params, data0, decrate, ms):
                p += lamb * d * (p0 - p) - lr * p.grad / (m + epsilon)
            if score_after_update:
                out = net(inputs, hidden)
                loss = F.cross_entropy(out.logits.reshape(-1, VOCAB), targets.reshape(-1))
        hidden = [(h.detach(), c.detach()) for h, c in out.hidden]
        seq_len = inputs.shape[1]
        total_loss += seq_len / seq_len0 * float(loss.detach())
        batch += seq_len / seq_len0
    with torch.no_grad():
        for p, p0 in zip(params, data0):
            p.copy_(p0)
    return total_loss / batch


def test_matches_the_reference_algorithm() -> None:
    net = TinyLM().eval()
    train, test = train_segments(), list(segments(stream(1, 48, 3), 5))
    lr, lamb, epsilon = 1e-2, 0.5, 2e-5
    rms, used = gradient_statistics(net, train)
    rates = torch.cat([(m / torch.stack([r.mean() for r in rms]).mean()).flatten() for m in rms])
    assert used == len(train) and (rates > 1 / lamb).any()  # the clipping matters here
    result = dynamic_evaluate(net, train, test, lr=lr, lamb=lamb, epsilon=epsilon)
    expected = reference(net, train, test, lr, lamb, epsilon)
    assert result.loss == pytest.approx(expected, rel=1e-5)
    assert result.loss != pytest.approx(static_loss(net, test), rel=1e-3)
    # scored after its own update, a segment would look better: the loss is taken before
    after = reference(net, train, test, lr, lamb, epsilon, score_after_update=True)
    assert after < result.loss and result.loss != pytest.approx(after, rel=1e-3)


def test_old_hyper_parameters_are_rescaled() -> None:
    net = TinyLM().eval()
    train, test = train_segments(), list(segments(stream(1, 30, 4), 5))
    count, segments_used = len(list(net.parameters())), len(train)
    old = dynamic_evaluate(net, train, test, lr=2e-3, lamb=2e-2, epsilon=1e-3, old_hyper=True)
    new = dynamic_evaluate(
        net, train, test, lr=2e-3 / math.sqrt(segments_used), lamb=2e-2 / count,
        epsilon=1e-3 / math.sqrt(segments_used),
    )  # fmt: skip
    assert old.loss == pytest.approx(new.loss, rel=1e-9)
    _, used = gradient_statistics(net, train, max_batches=3)
    assert used == 3


def test_adapts_to_a_repeating_stream() -> None:
    net = TinyLM()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    for inputs, targets in segments(stream(8, 100, 5), 10):
        optimizer.zero_grad()
        F.cross_entropy(net(inputs).logits.flatten(0, 1), targets.flatten()).backward()
        optimizer.step()
    net.eval()
    pattern = torch.tensor([1, 4, 2, 5, 3] * 30)[None]
    test = list(segments([(pattern[:, :-1], pattern[:, 1:])], 5))
    static = math.exp(static_loss(net, test))
    result = dynamic_evaluate(net, train_segments(), test, lr=1e-2, lamb=2e-3, epsilon=2e-5)
    assert result.ppl < 0.8 * static


def test_eval_config_switches_dynamic_evaluation_on(tmp_path) -> None:
    cfg = compose_config("eval", ["ckpt_path=/some.ckpt"], tmp_path)
    assert cfg.dynamic_eval is None
    assert (cfg.dynamic_eval_options.lr, cfg.dynamic_eval_options.lamb) == (5e-5, 2e-3)
    for switch in ("+dynamic_eval=true", "dynamic_eval=true"):
        cfg = compose_config("eval", ["ckpt_path=/some.ckpt", switch], tmp_path)
        assert cfg.dynamic_eval is True


def test_eval_dynamic_metrics_without_steps_equal_the_test_loss(tmp_path) -> None:
    root = str(write_corpus(tmp_path))
    data = {"_target_": "src.datamodules.awd_lm.AWDLMDataModule", "root": root,
            "vocab_size": None, "batch_size": 4, "bptt": 8}  # fmt: skip
    options = {"lr": 0.0, "lamb": 0.0, "epsilon": 2e-5, "bptt": 5, "batch_size": 3,
               "max_batches": 4, "old_hyper": False}  # fmt: skip
    cfg = OmegaConf.create({"split": "test", "data": data, "dynamic_eval_options": options})
    datamodule = AWDLMDataModule(root, batch_size=4, test_batch_size=1, bptt=8)
    torch.manual_seed(0)
    net = AWDLanguageModel(datamodule.vocab_size, embedding_dim=8, hidden_size=16, num_layers=2,
                           groups=2)  # fmt: skip
    task = AWDLMTask(net, partial(torch.optim.SGD, lr=1.0), bptt=8)
    (static,) = make_trainer(tmp_path, 1).test(task, datamodule=datamodule, verbose=False)
    metrics = dynamic_metrics(cfg, task, torch.device("cpu"))
    assert metrics["test/dynamic_loss"] == pytest.approx(static["test/loss"], rel=1e-5)
    assert metrics["test/dynamic_ppl"] == pytest.approx(static["test/ppl"], rel=1e-5)
    options["lr"], options["lamb"] = 1e-2, 2e-3
    cfg = OmegaConf.create({"split": "test", "data": data, "dynamic_eval_options": options})
    adapted = dynamic_metrics(cfg, task, torch.device("cpu"))
    assert adapted["test/dynamic_loss"] != pytest.approx(static["test/loss"], rel=1e-4)


def test_train_then_eval_with_dynamic_evaluation(tmp_path) -> None:
    """``python train.py data=pydoc_ptb ...`` then ``python eval.py ckpt_path=<best>
    +dynamic_eval=true``: without steps or decay the dynamic loss is the test loss."""
    tiny = [
        "data=pydoc_ptb", f"data.root={tmp_path / 'pydoc_ptb'}", "model.embedding_dim=16",
        "model.hidden_size=16", "model.num_layers=2", "model.groups=2", "trainer.max_epochs=2",
        "trainer.limit_train_batches=4", "trainer.limit_val_batches=3", "trainer.accelerator=cpu",
        "callbacks.progress_bar=null", "data.val_fraction=0.02", "data.test_fraction=0.02",
    ]  # fmt: skip
    trained = train(compose_config("train", tiny, tmp_path / "train"))
    overrides = [
        f"ckpt_path={trained['best_checkpoint']}", "trainer.accelerator=cpu", "+dynamic_eval=true",
        "dynamic_eval_options.lr=0", "dynamic_eval_options.lamb=0", "dynamic_eval_options.bptt=35",
        "dynamic_eval_options.max_batches=2",
    ]  # fmt: skip
    metrics = evaluate(compose_config("eval", overrides, tmp_path / "eval"))["metrics"]
    assert metrics["test/loss"] == pytest.approx(trained["metrics"]["test/loss"], rel=1e-6)
    assert metrics["test/dynamic_loss"] == pytest.approx(metrics["test/loss"], rel=1e-5)
    assert metrics["test/dynamic_ppl"] == pytest.approx(metrics["test/ppl"], rel=1e-5)


def test_both_passes_report_their_progress(monkeypatch, caplog) -> None:
    import src.evaluation.dynamic_eval as dynamic

    monkeypatch.setattr(dynamic, "Progress", partial(dynamic.Progress, every_s=0.0))
    pattern = torch.tensor([1, 4, 2, 5, 3] * 6)[None]
    test = list(segments([(pattern[:, :-1], pattern[:, 1:])], 5))
    with caplog.at_level(logging.INFO, logger="src.utils.progress"):
        dynamic_evaluate(TinyLM().eval(), train_segments(), test, max_batches=3)
    lines = [r.getMessage() for r in caplog.records]
    assert "dynamic evaluation: gradient statistics, training segments: 3 of 3 (100%)" in lines[2]
    assert f"dynamic evaluation: test segments: 1 of {len(test)} " in lines[4]
    assert lines[-1].startswith(f"dynamic evaluation: test segments: {len(test)} in ")
