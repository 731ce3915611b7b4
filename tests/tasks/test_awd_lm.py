"""AWD word-LM task: CE + AR + TAR, the learning rate scaled by the batch length inside the step,
the recurrent state carried and reset, the NT-ASGD rule and switch, evaluation and checkpoints on
the averaged weights, and an exact resume in the ASGD phase."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import NamedTuple

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader

from src.datamodules.awd_lm import AWDLMDataModule
from src.models.awd_lm import AWDLanguageModel
from src.models.awd_state import carried_hidden
from src.tasks.awd_lm import AWDLMTask, averaged_sgd, nonmonotone

VOCAB, DIM = 6, 8


class Output(NamedTuple):
    logits: Tensor
    hidden: list[tuple[Tensor, Tensor]]
    raw_output: Tensor
    dropped_output: Tensor


class TinyLM(nn.Module):
    """Embedding, one LSTM layer and a tied decoder, with the AWD network's interface; the
    "dropout" of the output is a fixed scale, so AR and TAR see different tensors. Records the
    state it is given and returns while training.

    Shape:
        tokens (B, T) -> logits (B, T, VOCAB)
    """

    def __init__(self, output_scale: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.rnn = nn.LSTM(DIM, DIM, batch_first=True)
        self.decoder = nn.Linear(DIM, VOCAB)
        self.decoder.weight = self.embedding.weight
        self.output_scale = output_scale
        self.given: list[list[tuple[Tensor, Tensor]]] = []
        self.returned: list[list[tuple[Tensor, Tensor]]] = []

    def init_hidden(self, batch_size: int) -> list[tuple[Tensor, Tensor]]:
        zeros = self.embedding.weight.new_zeros(1, batch_size, DIM)
        return [(zeros, zeros.clone())]

    def forward(self, tokens: Tensor, hidden: list[tuple[Tensor, Tensor]] | None = None) -> Output:
        hidden = self.init_hidden(tokens.shape[0]) if hidden is None else hidden
        raw, (h, c) = self.rnn(self.embedding(tokens), hidden[0])
        dropped = raw * self.output_scale
        if self.training:
            self.given.append(hidden)
            self.returned.append([(h.detach().clone(), c.detach().clone())])
        return Output(self.decoder(dropped), [(h, c)], raw, dropped)


def stream_batches(pattern: list[int], rows: int, steps: int, count: int) -> list[tuple]:
    """``count`` consecutive (rows, steps) batches of ``pattern`` repeated, each row shifted."""
    length = count * steps + 1
    data = torch.tensor([[pattern[(r + t) % len(pattern)] for t in range(length)]
                         for r in range(rows)])  # fmt: skip
    return [(data[:, i * steps : (i + 1) * steps], data[:, i * steps + 1 : (i + 1) * steps + 1])
            for i in range(count)]  # fmt: skip


def loader(batches: list[tuple]) -> DataLoader:
    """The batches as they are, in order."""
    return DataLoader(batches, batch_size=None)


def make_task(net: nn.Module | None = None, *, lr: float = 1.0, **kwargs) -> AWDLMTask:
    optimizer = partial(torch.optim.SGD, lr=lr, weight_decay=1.2e-6)
    return AWDLMTask(net or TinyLM(), optimizer, bptt=kwargs.pop("bptt", 4), **kwargs)


def make_trainer(root: Path, epochs: int, callbacks: list[Callback] = (), **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu", max_epochs=epochs, logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=root,
        callbacks=list(callbacks), gradient_clip_val=0.25, **kwargs,
    )  # fmt: skip


# train on 1 2 3 4 ..., validate on 4 3 2 1 ...: every validation transition is unseen, so the
# validation loss rises as training goes on and NT-ASGD fires
def train_loader() -> DataLoader:
    return loader(stream_batches([1, 2, 3, 4], 2, 5, 4))


def val_batches() -> list[tuple]:
    return stream_batches([4, 3, 2, 1], 2, 5, 2)


def test_loss_is_cross_entropy_plus_ar_plus_tar() -> None:
    net = TinyLM(output_scale=0.5)
    task = make_task(net, alpha=2.0, beta=1.0)
    logged = {}
    task.log = lambda name, value, **_: logged.__setitem__(name, float(torch.as_tensor(value)))
    tokens, targets = stream_batches([1, 5, 2, 4, 3], 3, 6, 1)[0]
    with torch.no_grad():
        loss = task.training_step((tokens, targets), 0)
    with torch.no_grad():
        out = net(tokens)  # a zero state, as the first batch of an epoch
        ce = F.cross_entropy(out.logits.reshape(-1, VOCAB), targets.reshape(-1))
        ar = 2.0 * (0.5 * out.raw_output).pow(2).mean()
        tar = 1.0 * (out.raw_output[:, 1:] - out.raw_output[:, :-1]).pow(2).mean()
    assert float(loss) == pytest.approx(float(ce + ar + tar), rel=1e-6)
    assert float(ar) > 0 and float(tar) > 0
    assert logged["train/loss"] == pytest.approx(float(ce), rel=1e-6)
    assert logged["train/ppl"] == pytest.approx(float(ce.exp()), rel=1e-6)
    assert logged["train/total_loss"] == pytest.approx(float(loss), rel=1e-6)
    assert logged["train/asgd"] == 0.0


class RecordingSGD(torch.optim.SGD):
    def __init__(self, params, *, seen: list[float], **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.seen = seen

    def step(self, closure=None):
        self.seen.append(self.param_groups[0]["lr"])
        return super().step(closure)


class LearningRates(Callback):
    def __init__(self) -> None:
        self.after: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.after.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_learning_rate_scaled_by_length_inside_the_step_and_restored(tmp_path) -> None:
    seen: list[float] = []
    task = AWDLMTask(TinyLM(), partial(RecordingSGD, lr=2.0, seen=seen), bptt=4)
    batches = [stream_batches([1, 2, 3], 2, t, 1)[0] for t in (4, 8, 2, 5)]
    rates = LearningRates()
    make_trainer(tmp_path, 1, [rates], limit_val_batches=0).fit(task, loader(batches))
    assert seen == pytest.approx([2.0, 4.0, 1.0, 2.5])
    assert rates.after == [2.0] * 4


def test_state_carried_detached_and_reset_per_epoch(tmp_path) -> None:
    net = TinyLM()
    batches = loader(stream_batches([1, 2, 3, 4, 5], 3, 4, 3))
    make_trainer(tmp_path, 2, limit_val_batches=0).fit(make_task(net), batches)
    assert len(net.given) == 6
    for step, given in enumerate(net.given):
        ((h, c),) = given
        assert not h.requires_grad and not c.requires_grad
        if step % 3 == 0:  # the first batch of an epoch
            assert h.abs().sum() == 0 and c.abs().sum() == 0
        else:
            ((h_prev, c_prev),) = net.returned[step - 1]
            torch.testing.assert_close(h, h_prev, rtol=0, atol=0)
            torch.testing.assert_close(c, c_prev, rtol=0, atol=0)
            assert h.abs().sum() > 0


def test_state_reset_when_the_batch_size_changes() -> None:
    net = TinyLM()
    hidden = [(torch.ones(1, 3, DIM), torch.ones(1, 3, DIM))]
    assert carried_hidden(net, hidden, 3) is hidden
    ((h, c),) = carried_hidden(net, hidden, 2)
    assert h.shape == c.shape == (1, 2, DIM) and h.abs().sum() == c.abs().sum() == 0
    assert carried_hidden(net, None, 3)[0][0].abs().sum() == 0


def val_loss(task: AWDLMTask, batches: list, root: Path) -> float:
    (result,) = make_trainer(root, 1).validate(task, loader(batches), verbose=False)
    return result["val/loss"]


def test_evaluation_carries_the_state_across_batches_and_resets_per_pass(tmp_path) -> None:
    net = TinyLM().eval()
    ((tokens, targets),) = stream_batches([1, 5, 2, 4, 3, 3], 2, 9, 1)
    whole = val_loss(make_task(net), [(tokens, targets)], tmp_path)
    with torch.no_grad():
        expected = F.cross_entropy(net(tokens).logits.reshape(-1, VOCAB), targets.reshape(-1))
    assert whole == pytest.approx(float(expected), rel=1e-6)
    split = [(tokens[:, :4], targets[:, :4]), (tokens[:, 4:], targets[:, 4:])]
    task = make_task(net)
    assert val_loss(task, split, tmp_path) == pytest.approx(whole, rel=1e-6)
    # a second pass starts from zeros again, not from the end of the first
    assert val_loss(task, split, tmp_path) == pytest.approx(whole, rel=1e-6)


def test_nonmonotone_rule() -> None:
    losses = [4.0, 3.0, 3.5, 3.2, 2.9, 3.1, 3.05]
    # with nonmono 2: 3.2 (4th) is above the best 3.0 but that one is among the last two; 3.1 (6th)
    # is above 3.0, the best before the last two (3.2, 2.9)
    fired = [nonmonotone(losses[:i], loss, 2) for i, loss in enumerate(losses)]
    assert fired == [False, False, False, False, False, True, True]
    assert not nonmonotone([1.0] * 5, 2.0, 5)  # needs more than nonmono earlier validations
    assert nonmonotone([1.0] * 6, 2.0, 5)
    assert not nonmonotone([1.0] * 6, 1.0, 5)  # equal is not worse
    with pytest.raises(ValueError):
        nonmonotone([1.0], 2.0, 0)


def test_averaged_sgd_copies_lr_and_weight_decay() -> None:
    params = [nn.Parameter(torch.zeros(2))]
    asgd = averaged_sgd(torch.optim.SGD(params, lr=30.0, weight_decay=1.2e-6))
    (group,) = asgd.param_groups
    assert isinstance(asgd, torch.optim.ASGD)
    assert (group["lr"], group["weight_decay"]) == (30.0, 1.2e-6)
    assert (group["t0"], group["lambd"]) == (0, 0.0)


class Watch(Callback):
    """At each validation (weights as validated): the loss, the optimiser, the network's weights
    and ASGD's averages; at the end of training the weights and averages training reached."""

    def __init__(self) -> None:
        self.validations: list[dict] = []
        self.at_start: str | None = None
        self.start_weights: dict[str, Tensor] = {}
        self.before_validation: dict[str, Tensor] = {}
        self.final: dict | None = None

    @staticmethod
    def averages(trainer, pl_module) -> dict[str, Tensor]:
        optimizer = trainer.optimizers[0]
        return {n: optimizer.state[p]["ax"].clone() for n, p in pl_module.net.named_parameters()
                if "ax" in optimizer.state.get(p, {})}  # fmt: skip

    def on_validation_start(self, trainer, pl_module) -> None:
        # callbacks run before the module's hook: these are the weights training goes on from
        net = pl_module.net
        self.before_validation = {n: p.detach().clone() for n, p in net.named_parameters()}

    def on_train_start(self, trainer, pl_module) -> None:
        self.at_start = type(trainer.optimizers[0]).__name__
        self.start_weights = {n: p.detach().clone() for n, p in pl_module.net.named_parameters()}

    def on_validation_end(self, trainer, pl_module) -> None:
        self.validations.append({
            "epoch": trainer.current_epoch,
            "loss": float(trainer.callback_metrics["val/loss"]),
            "optimizer": type(trainer.optimizers[0]).__name__,
            "weights": {n: p.detach().clone() for n, p in pl_module.net.named_parameters()},
            "averages": self.averages(trainer, pl_module),
            "training": self.before_validation,
            "step": trainer.global_step,
        })  # fmt: skip

    def on_train_end(self, trainer, pl_module) -> None:
        self.final = {
            "weights": {n: p.detach().clone() for n, p in pl_module.net.named_parameters()},
            "averages": self.averages(trainer, pl_module),
        }


EPOCHS = 7


def asgd_fit(root: Path, epochs: int, ckpt_path: str | None = None) -> tuple:
    task = make_task(nonmono=1)
    watch = Watch()
    checkpoints = ModelCheckpoint(
        dirpath=root / "ckpt", filename="e{epoch}", auto_insert_metric_name=False, save_top_k=-1
    )
    trainer = make_trainer(root, epochs, [watch, checkpoints])
    trainer.fit(task, train_loader(), loader(val_batches()), ckpt_path=ckpt_path)
    return task, watch, trainer


@pytest.fixture(scope="module")
def asgd_run(tmp_path_factory) -> tuple:
    root = tmp_path_factory.mktemp("asgd")
    return (root, *asgd_fit(root, EPOCHS))


def test_switch_to_asgd_exactly_when_the_rule_fires(asgd_run) -> None:
    _, task, watch, trainer = asgd_run
    losses = [v["loss"] for v in watch.validations]
    fired = [nonmonotone(losses[:i], loss, 1) for i, loss in enumerate(losses)]
    assert True in fired, f"validation losses {losses} never triggered the switch"
    switch = fired.index(True)
    # the switch follows the validation where the rule fired; the history stops there
    assert [v["optimizer"] for v in watch.validations] == ["SGD"] * switch + ["ASGD"] * (
        EPOCHS - switch
    )
    assert task.asgd_phase and task.val_history == pytest.approx(losses[: switch + 1])
    assert isinstance(trainer.optimizers[0], torch.optim.ASGD)
    assert switch + 1 < EPOCHS - 1  # ASGD trains at least two epochs


def test_validation_scores_the_averaged_weights(asgd_run, tmp_path) -> None:
    _, _, watch, _ = asgd_run
    averaged = [v for v in watch.validations if v["averages"]]
    assert len(averaged) >= 2
    for v in averaged:
        for name, weight in v["weights"].items():
            torch.testing.assert_close(weight, v["averages"][name], rtol=0, atol=0)
        # a network holding the averages as its weights scores the same outside the fit
        net = TinyLM()
        net.load_state_dict(v["averages"], strict=False)
        loss = val_loss(make_task(net), val_batches(), tmp_path)
        assert loss == pytest.approx(v["loss"], rel=1e-6)
    # the averages differ from the weights training goes on from
    last = averaged[-1]
    final_weights = watch.final["weights"]
    assert any(not torch.equal(last["averages"][n], final_weights[n]) for n in final_weights)


def test_checkpoints_hold_the_averaged_weights(asgd_run) -> None:
    root, _, watch, _ = asgd_run
    for v in watch.validations:
        checkpoint = torch.load(root / "ckpt" / f"e{v['epoch']}.ckpt", weights_only=True)
        state = checkpoint["state_dict"]
        expected = v["averages"] or v["weights"]
        for name, weight in expected.items():
            torch.testing.assert_close(state[f"net.{name}"], weight, rtol=0, atol=0)
        # the tied decoder is the averaged embedding too
        torch.testing.assert_close(state["net.decoder.weight"], expected["embedding.weight"])
        assert checkpoint["nt_asgd"]["asgd_phase"] == (v["optimizer"] == "ASGD")
        assert ("training_weights" in checkpoint["nt_asgd"]) == bool(v["averages"])


def test_checkpoints_written_while_validating_hold_the_averages(tmp_path) -> None:
    # validating twice an epoch, ModelCheckpoint saves in on_validation_end, with the averages in
    watch = Watch()
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", filename="s{step}", auto_insert_metric_name=False, save_top_k=-1
    )
    trainer = make_trainer(tmp_path, 4, [watch, checkpoints], val_check_interval=2)
    trainer.fit(make_task(nonmono=1), train_loader(), loader(val_batches()))
    averaged = [v for v in watch.validations if v["averages"]]
    assert averaged
    for v in averaged:
        checkpoint = torch.load(tmp_path / "ckpt" / f"s{v['step']}.ckpt", weights_only=True)
        training = checkpoint["nt_asgd"]["training_weights"]
        for name, average in v["averages"].items():
            saved = checkpoint["state_dict"][f"net.{name}"]
            torch.testing.assert_close(saved, average, rtol=0, atol=0)
            torch.testing.assert_close(training[f"net.{name}"], v["training"][name], rtol=0, atol=0)
    # (ASGD's first two steps set the average to the weights; later they part)
    last = averaged[-1]
    assert any(not torch.equal(last["training"][n], a) for n, a in last["averages"].items())


def test_network_keeps_the_averages_after_fitting(asgd_run) -> None:
    _, task, watch, _ = asgd_run
    for name, p in task.net.named_parameters():
        torch.testing.assert_close(p.detach(), watch.final["averages"][name], rtol=0, atol=0)


def test_resume_in_the_asgd_phase_continues_exactly(asgd_run, tmp_path) -> None:
    root, _, watch, _ = asgd_run
    # the first checkpoint with averages, two epochs or more before the end
    resume_epoch = next(v["epoch"] for v in watch.validations if v["averages"])
    assert resume_epoch <= EPOCHS - 3
    _, resumed, trainer = asgd_fit(tmp_path, EPOCHS, str(root / "ckpt" / f"e{resume_epoch}.ckpt"))
    assert resumed.at_start == "ASGD"
    for key in ("weights", "averages"):
        assert resumed.final[key].keys() == watch.final[key].keys()
        for name, value in watch.final[key].items():
            torch.testing.assert_close(resumed.final[key][name], value, rtol=1e-6, atol=1e-7)


def test_fine_tuning_starts_with_asgd_from_a_checkpoint_and_stops(asgd_run, tmp_path) -> None:
    root, _, watch, _ = asgd_run
    init = root / "ckpt" / f"e{watch.validations[-1]['epoch']}.ckpt"
    task = make_task(nonmono=1, asgd_from_start=True, init_checkpoint=str(init))
    finetune = Watch()
    make_trainer(tmp_path, 10, [finetune]).fit(task, train_loader(), loader(val_batches()))
    assert finetune.at_start == "ASGD"
    state = torch.load(init, weights_only=True)["state_dict"]
    for name, weight in finetune.start_weights.items():
        torch.testing.assert_close(weight, state[f"net.{name}"], rtol=0, atol=0)
    losses = [v["loss"] for v in finetune.validations]
    fired = [nonmonotone(losses[:i], loss, 1) for i, loss in enumerate(losses)]
    assert len(losses) < 10 and fired[-1] and not any(fired[:-1])
    with pytest.raises(ValueError, match="asgd_from_start"):
        make_task(asgd=False, asgd_from_start=True)


SENTENCES = ("the cat sat on a mat", "a dog ran fast", "the dog sat", "a cat ran slow on the mat")


def write_corpus(root: Path) -> Path:
    """A small word corpus in the PTB layout (train.txt, valid.txt, test.txt): four sentences in
    random order, so the next word is mostly predictable."""
    rng = torch.Generator().manual_seed(0)
    for name, lines in (("train.txt", 120), ("valid.txt", 16), ("test.txt", 16)):
        order = torch.randint(0, len(SENTENCES), (lines,), generator=rng)
        (root / name).write_text("".join(SENTENCES[int(i)] + "\n" for i in order))
    return root


def test_trains_the_awd_pru_on_a_word_stream(tmp_path) -> None:
    data = AWDLMDataModule(str(write_corpus(tmp_path)), batch_size=4, eval_batch_size=2,
                                bptt=8, bptt_min=2)  # fmt: skip
    torch.manual_seed(0)
    # light regularisation: the network is small
    net = AWDLanguageModel(
        data.vocab_size, rnn="pru", embedding_dim=32, hidden_size=32, num_layers=2, groups=2,
        levels=2, dropout=0.1, dropout_hidden=0.1, dropout_input=0.1, dropout_embedding=0.0,
        weight_drop=0.1,
    )  # fmt: skip
    task = AWDLMTask(net, partial(torch.optim.SGD, lr=10.0, weight_decay=1.2e-6),
                                bptt=data.bptt, nonmono=1)  # fmt: skip
    watch = Watch()
    trainer = make_trainer(tmp_path, 6, [watch])
    trainer.fit(task, datamodule=data)
    (result,) = trainer.test(task, datamodule=data, verbose=False)
    losses = [v["loss"] for v in watch.validations]
    assert losses[-1] < 0.5 * losses[0] and losses[0] < math.log(data.vocab_size) + 0.1
    assert result["test/ppl"] == pytest.approx(math.exp(result["test/loss"]), rel=1e-5)
    assert result["test/ppl"] < 3.0
