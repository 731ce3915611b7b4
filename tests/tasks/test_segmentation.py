"""The segmentation task: metrics against hand-computed values, ignore index, up-sampling, decoder
learning rate, weights-only init and frozen batch norm."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from src.tasks.segmentation import SegmentationTask, inverse_log_frequency_weights

SGD = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)


def one_hot_logits(classes: list[list[int]], num_classes: int = 3) -> Tensor:
    """(1, num_classes, H, W) logits whose argmax is ``classes``."""
    return (
        torch.nn.functional.one_hot(torch.tensor(classes), num_classes)
        .permute(2, 0, 1)[None]
        .float()
        * 4.0
    )


def validate(task: L.LightningModule, logits: Tensor, masks: Tensor) -> dict[str, float]:
    """Run Lightning's validation loop on one batch of given logits (the network is the
    identity)."""
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    (results,) = trainer.validate(
        task, DataLoader(TensorDataset(logits, masks), batch_size=len(logits)), verbose=False
    )
    return results


def test_miou_pixel_accuracy_and_ignored_pixels() -> None:
    logits = one_hot_logits([[0, 1, 1], [2, 2, 0]])
    masks = torch.tensor([[[0, 1, 2], [2, 255, 1]]])
    results = validate(SegmentationTask(nn.Identity(), 3, SGD), logits, masks)
    # scored pixels: 3 right of 5; IoU 1/2 (class 0), 1/3 (class 1), 1/2 (class 2; the ignored
    # pixel predicted as 2 is not a false positive)
    assert results["val/pixel_acc"] == pytest.approx(3 / 5)
    assert results["val/mIoU"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 2) / 3)
    scored = masks != 255
    expected = nn.functional.cross_entropy(logits.permute(0, 2, 3, 1)[scored], masks[scored])
    assert results["val/loss"] == pytest.approx(expected.item(), rel=1e-5)


def test_ignored_class_inside_the_range_is_not_scored() -> None:
    """Cityscapes with background 19 = ignore_index: a background prediction is a miss of the true
    class, background targets are left out, and the background IoU is not averaged."""
    logits = one_hot_logits([[0, 2], [1, 1]])
    masks = torch.tensor([[[0, 0], [2, 1]]])
    results = validate(SegmentationTask(nn.Identity(), 3, SGD, ignore_index=2), logits, masks)
    assert results["val/pixel_acc"] == pytest.approx(2 / 3)
    assert results["val/mIoU"] == pytest.approx((1 / 2 + 1) / 2)


def test_small_logits_are_upsampled_to_the_mask() -> None:
    logits = one_hot_logits([[1]])  # (1, 3, 1, 1)
    results = validate(
        SegmentationTask(nn.Identity(), 3, SGD), logits, torch.ones(1, 4, 6, dtype=torch.long)
    )
    assert results["val/pixel_acc"] == 1.0


def test_network_must_return_pixel_logits() -> None:
    with pytest.raises(ValueError, match=r"needs logits \(B, 3, H', W'\)"):
        validate(
            SegmentationTask(nn.Identity(), 3, SGD),
            torch.zeros(2, 3),
            torch.zeros(2, 4, 4, dtype=torch.long),
        )


def test_class_weights_from_frequencies() -> None:
    weights = inverse_log_frequency_weights([1, 1, 2])
    assert weights.tolist() == pytest.approx(
        [1 / math.log(1.35), 1 / math.log(1.35), 1 / math.log(1.6)]
    )
    task = SegmentationTask(nn.Identity(), 3, SGD, class_weights=weights.tolist())
    assert torch.allclose(task.criterion.weight, weights)
    with pytest.raises(ValueError, match="2 values for 3 classes"):
        SegmentationTask(nn.Identity(), 3, SGD, class_weights=[1.0, 2.0])


class EncoderDecoder(nn.Module):
    """(B, 3, H, W) -> (B, 2, H/2, W/2): conv + batch norm encoder, 1x1 decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU()
        )
        self.decoder = nn.Conv2d(4, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.encoder(x))


def test_head_lr_multiplier_groups() -> None:
    task = SegmentationTask(EncoderDecoder(), 2, SGD, head_lr_multiplier=10.0)
    optimizer = task.configure_optimizers()["optimizer"]
    encoder, decoder = optimizer.param_groups
    assert encoder["lr"] == pytest.approx(0.1) and decoder["lr"] == pytest.approx(1.0)
    assert [p.shape for p in decoder["params"]] == [torch.Size([2, 4, 1, 1]), torch.Size([2])]
    assert len(encoder["params"]) == 4  # conv weight and bias, BN weight and bias
    single = SegmentationTask(EncoderDecoder(), 2, SGD).configure_optimizers()["optimizer"]
    assert len(single.param_groups) == 1
    with pytest.raises(ValueError, match=r"head_prefix='head'.*\['decoder', 'encoder'\]"):
        SegmentationTask(
            EncoderDecoder(), 2, SGD, head_lr_multiplier=10.0, head_prefix="head"
        ).configure_optimizers()


def test_init_checkpoint_loads_network_weights_at_fit(tmp_path: Path) -> None:
    stage1 = SegmentationTask(EncoderDecoder(), 2, SGD, class_weights=[1.0, 2.0])
    path = tmp_path / "stage1.ckpt"
    torch.save({"state_dict": stage1.state_dict(), "epoch": 3}, path)
    stage2 = SegmentationTask(EncoderDecoder(), 2, SGD, init_checkpoint=str(path))
    assert not torch.equal(
        stage2.net.decoder.weight, stage1.net.decoder.weight
    )  # nothing read at build
    stage2.setup("fit")
    for name, value in stage1.net.state_dict().items():
        assert torch.equal(stage2.net.state_dict()[name], value), name

    missing = SegmentationTask(
        EncoderDecoder(), 2, SGD, init_checkpoint=str(tmp_path / "none.ckpt")
    )
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "none.ckpt")):
        missing.setup("fit")
    other = SegmentationTask(nn.Conv2d(3, 2, 1), 2, SGD, init_checkpoint=str(path))
    with pytest.raises(KeyError, match="does not fit Conv2d"):
        other.setup("fit")


def test_freeze_bn_keeps_statistics_and_affine_parameters() -> None:
    task = SegmentationTask(EncoderDecoder(), 2, SGD, freeze_bn=True)
    norm = task.net.encoder[1]
    task.train()
    assert not norm.training and task.net.decoder.training
    assert not norm.weight.requires_grad and not norm.bias.requires_grad
    before = norm.running_mean.clone()
    loss = task.criterion(
        task(torch.randn(2, 3, 8, 8) + 3.0), torch.zeros(2, 4, 4, dtype=torch.long)
    )
    loss.backward()
    assert torch.equal(norm.running_mean, before) and norm.weight.grad is None
    assert task.net.encoder[0].weight.grad is not None
    trainable = task.configure_optimizers()["optimizer"].param_groups[0]["params"]
    assert len(trainable) == 4  # conv and decoder weights and biases, no BN parameters
