"""The text classification task: weighted loss, accuracy and macro F1, per-epoch test curve."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn

from src.commands.train import train
from src.datamodules.text_classification import SentimentTweetsDataModule
from src.models.text_classifier import DeLighTClassifier
from src.tasks.text_classification import TextClassificationTask
from tests.datamodules.test_text_classification import tweets_file


class FixedLogits(nn.Module):
    """Returns the logits it was given, whatever the tokens."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.logits + 0 * self.unused


def test_class_weights_weigh_the_loss() -> None:
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.5], [1.0, 0.0, 0.0]])
    labels = torch.tensor([0, 1, 2, 2])
    task = TextClassificationTask(
        FixedLogits(logits), 3, partial(torch.optim.SGD, lr=0.1), class_weights=[1.0, 1.0, 3.0]
    )
    expected = F.cross_entropy(logits, labels, weight=torch.tensor([1.0, 1.0, 3.0]))
    loss = task.criterion(task(torch.zeros(4, 2, dtype=torch.long)), labels)
    torch.testing.assert_close(loss, expected)
    # per-example losses -log softmax, weighted mean: (l0 + l1 + 3 l2 + 3 l3) / 8
    manual = -F.log_softmax(logits, dim=1)[torch.arange(4), labels]
    torch.testing.assert_close(loss, (manual * torch.tensor([1.0, 1.0, 3.0, 3.0])).sum() / 8)


def test_accuracy_and_macro_f1() -> None:
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.5], [1.0, 0.0, 0.0]])
    labels = torch.tensor([0, 1, 2, 2])
    task = TextClassificationTask(FixedLogits(logits), 3, partial(torch.optim.SGD, lr=0.1))
    metrics = task.stage_metrics["test_metrics"]
    metrics.update(logits, labels)
    values = {k: float(v) for k, v in metrics.compute().items()}
    # 3 of 4 right; F1 per class: 0: P 1/2 R 1 -> 2/3, 1: 1, 2: P 1 R 1/2 -> 2/3
    assert values["test/acc"] == pytest.approx(0.75)
    assert values["test/f1"] == pytest.approx((2 / 3 + 1 + 2 / 3) / 3)


def test_bad_class_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="class_weights must be 3 positive numbers"):
        TextClassificationTask(
            nn.Linear(1, 1), 3, partial(torch.optim.SGD, lr=0.1), class_weights=[1.0, 2.0]
        )


@pytest.mark.slow
def test_fit_logs_the_test_curve_every_epoch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    dm = SentimentTweetsDataModule(
        str(tmp_path),
        csv_path=str(tweets_file(tmp_path / "t.csv")),
        vocab_size=48,
        max_length=8,
        batch_size=16,
        test_each_epoch=True,
    )
    net = DeLighTClassifier(48, 3, 32, 2, 4, 2.0, block_scaling=True, glt_shuffle=False)
    task = TextClassificationTask(net, 3, partial(torch.optim.AdamW, lr=3e-3))
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=L.pytorch.loggers.CSVLogger(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(task, datamodule=dm)
    logged = trainer.callback_metrics
    assert {"val/acc", "val/f1", "test_epoch/acc", "test_epoch/f1", "train/acc"} <= set(logged)
    (result,) = trainer.test(task, datamodule=dm, verbose=False)
    # the test split is the second validation loader, so the last epoch's value is the test value
    assert result["test/acc"] == pytest.approx(float(logged["test_epoch/acc"]))
    assert 0.0 <= result["test/acc"] <= 1.0
    rows = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    epochs = [r.split(",") for r in rows[1:] if r.split(",")[header.index("test_epoch/acc")]]
    assert [int(r[header.index("epoch")]) for r in epochs] == [0, 1]


def test_a_run_leaves_its_test_predictions_in_the_split_order(make_cfg, tmp_path: Path) -> None:
    """``test_outputs.json`` holds one prediction per test text, in the order of the test split
    (under DDP a process sees every other text), and its accuracy is the logged test/acc."""
    cfg = make_cfg(
        "data=sentiment_tweets",
        f"data.root={tmp_path / 'spm'}",
        f"data.csv_path={tweets_file(tmp_path / 't.csv')}",
        "data.vocab_size=48",
        "data.max_length=8",
        "data.batch_size=16",
        "data.eval_batch_size=5",  # several test batches
        "model.d_model=32",
        "model.num_blocks=1",
        "trainer.max_epochs=3",
        "trainer.num_sanity_val_steps=0",
        "callbacks.progress_bar=null",
    )
    summary = train(cfg)
    outputs = json.loads((Path(summary["output_dir"]) / "test_outputs.json").read_text())
    data = instantiate(cfg.data)
    data.setup("test")
    labels = [label for _, label in data.encoded["test"]]
    assert outputs["kind"] == "classification" and len(labels) == 12
    assert outputs["ids"] == list(range(12)) and outputs["labels"] == labels
    assert len(outputs["predictions"]) == 12 and set(outputs["predictions"]) <= {0, 1, 2}
    correct = sum(p == y for p, y in zip(outputs["predictions"], outputs["labels"]))
    assert correct / 12 == pytest.approx(summary["metrics"]["test/acc"], abs=1e-6)
