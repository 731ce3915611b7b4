"""The multi-label task: CP, CR, CF1, OP, OR, OF1 and mAP against hand-computed values."""

from __future__ import annotations

import functools
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from src.tasks.multilabel import MultiLabelTask

SGD = functools.partial(torch.optim.SGD, lr=0.1)

TARGETS = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.float32)
# positive logits predict the label; 0.3, 0.4, 0.2 and 0.6 are positive logits inside [0, 1]
LOGITS = torch.tensor([[2.0, -1.0, 0.3], [0.4, 1.5, -2.0], [-0.5, 0.2, -1.0], [-3.0, 0.6, 1.0]])


def validate(
    task: L.LightningModule, logits: Tensor, targets: Tensor, batch_size: int
) -> dict[str, float]:
    """Lightning's validation loop over given logits (the network is the identity)."""
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    (results,) = trainer.validate(
        task, DataLoader(TensorDataset(logits, targets), batch_size=batch_size), verbose=False
    )
    return results


def test_metrics_match_hand_computed_values() -> None:
    # two batches: the metrics are over the epoch, not averaged over batches
    results = validate(MultiLabelTask(nn.Identity(), 3, SGD), LOGITS, TARGETS, batch_size=2)
    # per label (TP, FP, FN): (1, 1, 1), (2, 1, 0), (2, 0, 0)
    cp, cr = (1 / 2 + 2 / 3 + 1) / 3, (1 / 2 + 1 + 1) / 3
    assert results["val/CP"] == pytest.approx(cp)
    assert results["val/CR"] == pytest.approx(cr)
    assert results["val/CF1"] == pytest.approx(2 * cp * cr / (cp + cr))
    assert results["val/OP"] == pytest.approx(5 / 7)
    assert results["val/OR"] == pytest.approx(5 / 6)
    assert results["val/OF1"] == pytest.approx(10 / 13)
    # AP per label from the ranking: (1 + 2/3) / 2, (1 + 2/3) / 2, 1
    assert results["val/mAP"] == pytest.approx((5 / 6 + 5 / 6 + 1) / 3)
    expected_loss = nn.functional.binary_cross_entropy_with_logits(LOGITS, TARGETS)
    assert results["val/loss"] == pytest.approx(expected_loss.item(), rel=1e-5)


def test_threshold_is_logit_zero_even_for_logits_in_unit_interval() -> None:
    logits = torch.tensor([[0.3, 0.8, -0.1]])  # all in [-0.1, 0.8]: logits 0.3 and 0.8 are positive
    results = validate(
        MultiLabelTask(nn.Identity(), 3, SGD), logits, torch.tensor([[1.0, 1.0, 0.0]]), 1
    )
    assert results["val/OR"] == 1.0 and results["val/OP"] == 1.0


def test_init_checkpoint_skips_the_mismatched_classifier(tmp_path: Path) -> None:
    imagenet = MultiLabelTask(
        nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Linear(8, 10)), 10, SGD
    )
    path = tmp_path / "imagenet.ckpt"
    torch.save({"state_dict": imagenet.state_dict()}, path)
    coco = MultiLabelTask(
        nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Linear(8, 3)),
        3,
        SGD,
        init_checkpoint=str(path),
    )
    with pytest.raises(KeyError, match=r"2.weight: file \(10, 8\) vs network \(3, 8\)"):
        coco.setup("fit")
    coco.init_skip_mismatched = True
    fresh_head = coco.net[2].weight.clone()
    coco.setup("fit")
    assert torch.equal(coco.net[1].weight, imagenet.net[1].weight) and torch.equal(
        coco.net[2].weight, fresh_head
    )
