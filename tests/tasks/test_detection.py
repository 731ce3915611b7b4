"""The COCO metric against pycocotools; the detection task end to end with a stand-in network."""

from __future__ import annotations

import functools
import math

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torchmetrics.detection import MeanAveragePrecision

from src.evaluation.coco_eval import coco_metric
from src.models.ssd_boxes import match_priors
from src.tasks.detection import DetectionTask

SGD = functools.partial(torch.optim.SGD, lr=0.1)


def coco_fixture() -> tuple[list[dict], list[dict]]:
    """Two 100 x 100 images, two classes; detections at several IoUs (0.91, 0.83, 0.83, 0.66,
    none on a COCO threshold), a miss and false alarms."""
    truths = [
        {
            "boxes": torch.tensor([[10.0, 10, 50, 50], [60, 60, 90, 95]]),
            "labels": torch.tensor([1, 2]),
        },
        {
            "boxes": torch.tensor([[0.0, 0, 30, 40], [50, 10, 80, 30]]),
            "labels": torch.tensor([1, 1]),
        },
    ]
    preds = [
        {
            "boxes": torch.tensor([[12.0, 10, 50, 52], [60, 62, 90, 91], [0, 0, 20, 20]]),
            "scores": torch.tensor([0.9, 0.7, 0.6]),
            "labels": torch.tensor([1, 2, 1]),
        },
        {
            "boxes": torch.tensor([[0.0, 0, 30, 33], [58, 12, 80, 30], [5, 50, 40, 90]]),
            "scores": torch.tensor([0.8, 0.5, 0.3]),
            "labels": torch.tensor([1, 1, 2]),
        },
    ]
    return preds, truths


def xywh(box: Tensor) -> list[float]:
    x1, y1, x2, y2 = box.tolist()
    return [x1, y1, x2 - x1, y2 - y1]


def cocoeval_stats(preds: list[dict], truths: list[dict], size: int = 100) -> list[float]:
    """pycocotools' COCOeval ``stats`` for (x1, y1, x2, y2) boxes on ``size`` x ``size`` images
    (no crowd regions)."""
    annotations = []
    for i, target in enumerate(truths):
        for box, label in zip(target["boxes"], target["labels"]):
            x, y, w, h = xywh(box)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i,
                    "category_id": int(label),
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    labels = sorted({int(label) for t in [*truths, *preds] for label in t["labels"]})
    ground_truth = COCO()
    ground_truth.dataset = {
        "images": [{"id": i, "width": size, "height": size} for i in range(len(truths))],
        "annotations": annotations,
        "categories": [{"id": label} for label in labels],
    }
    ground_truth.createIndex()
    detections = ground_truth.loadRes(
        [
            {"image_id": i, "category_id": int(label), "bbox": xywh(box), "score": float(score)}
            for i, p in enumerate(preds)
            for box, label, score in zip(p["boxes"], p["labels"], p["scores"])
        ]
    )
    evaluation = COCOeval(ground_truth, detections, "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    return list(evaluation.stats)


def test_coco_metric_agrees_with_cocoeval() -> None:
    preds, truths = coco_fixture()
    metric = coco_metric()
    metric.update(preds, truths)
    result = metric.compute()
    ap, ap50, ap75 = cocoeval_stats(preds, truths)[:3]
    assert 0 < ap < ap75 < ap50 < 1  # the fixture tells the thresholds apart
    assert result["map"].item() == pytest.approx(ap, abs=1e-6)
    assert result["map_50"].item() == pytest.approx(ap50, abs=1e-6)
    assert result["map_75"].item() == pytest.approx(ap75, abs=1e-6)


def random_coco_case(rng: np.random.Generator, classes: int = 3) -> tuple[list[dict], list[dict]]:
    """Six 200 x 200 images with 1-6 boxes each of ``classes`` classes; detections are boxes
    shifted by a few pixels (some of the wrong class, some twice) and false alarms."""
    preds, truths = [], []
    for _ in range(6):
        count = int(rng.integers(1, 7))
        corner = rng.uniform(0, 140, size=(count, 2))
        boxes = np.concatenate([corner, corner + rng.uniform(6, 60, size=(count, 2))], axis=1)
        labels = rng.integers(1, classes + 1, size=count)
        truths.append(
            {"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels)}
        )
        found = [b for b in range(count) for _ in range(int(rng.integers(0, 3)))]
        shifted = boxes[found] + rng.normal(0, 3, size=(len(found), 4))
        wrong = rng.random(len(found)) < 0.15
        found_labels = np.where(wrong, rng.integers(1, classes + 1, size=len(found)), labels[found])
        alarms = int(rng.integers(0, 4))
        corner = rng.uniform(0, 140, size=(alarms, 2))
        alarm_boxes = np.concatenate(
            [corner, corner + rng.uniform(6, 60, size=(alarms, 2))], axis=1
        )
        all_boxes = np.concatenate([shifted, alarm_boxes]).reshape(-1, 4)
        all_labels = np.concatenate([found_labels, rng.integers(1, classes + 1, size=alarms)])
        scores = rng.uniform(0.01, 1, size=len(all_labels))
        preds.append(
            {
                "boxes": torch.tensor(all_boxes, dtype=torch.float32),
                "scores": torch.tensor(scores, dtype=torch.float32),
                "labels": torch.tensor(all_labels, dtype=torch.int64),
            }
        )
    return preds, truths


def assert_cocoeval_numbers(metric: MeanAveragePrecision, seed: int) -> None:
    """map, map_50 and map_75 are COCOeval's stats[0:3] on a random set (``random_coco_case``)."""
    preds, truths = random_coco_case(np.random.default_rng(seed))
    scores = torch.cat([p["scores"] for p in preds])
    # tied scores in different images have no defined order: COCOeval's PR curve then depends on
    # the order the images are listed in, which differs between the two
    assert scores.unique().numel() == scores.numel()
    metric.update(preds, truths)
    result = metric.compute()
    ap, ap50, ap75 = cocoeval_stats(preds, truths, size=200)[:3]
    assert 0 < ap < ap50 < 1
    assert result["map"].item() == pytest.approx(ap, abs=1e-6)
    assert result["map_50"].item() == pytest.approx(ap50, abs=1e-6)
    assert result["map_75"].item() == pytest.approx(ap75, abs=1e-6)


# torchmetrics' default recall thresholds are float32 ``torch.linspace`` values (recall 0.2 is
# 0.20000000298...), pycocotools' float64 ``np.linspace``: a recall that lands exactly on a
# threshold (1 of 5 boxes found) falls on the other side of it, and AP moved by up to ~3e-3 (16 of
# 40 random sets, seed 1 among them) until coco_metric() took COCOeval's thresholds.
@pytest.mark.parametrize("seed", range(6))
def test_coco_metric_agrees_with_cocoeval_on_random_sets(seed: int) -> None:
    assert_cocoeval_numbers(coco_metric(), seed)


class TinyDetector(nn.Module):
    """Stand-in SSD: a linear map of the mean colour to every prior's offsets and class logits."""

    def __init__(self, priors: Tensor, num_classes: int) -> None:
        super().__init__()
        self.register_buffer("priors", priors)
        self.num_classes = num_classes
        self.head = nn.Linear(3, priors.shape[0] * (4 + num_classes))

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        out = self.head(images.mean(dim=(2, 3)))  # (B, P * (4 + C))
        out = out.view(images.shape[0], self.priors.shape[0], 4 + self.num_classes)
        return out[..., :4], out[..., 4:]


def grid_priors() -> Tensor:
    """4 x 4 centres, two sizes: 32 (cx, cy, w, h) priors."""
    centres = (torch.arange(4) + 0.5) / 4
    cy, cx = torch.meshgrid(centres, centres, indexing="ij")
    grid = torch.stack([cx.flatten(), cy.flatten()], dim=1)  # (16, 2)
    return torch.cat([torch.cat([grid, torch.full((16, 2), s)], dim=1) for s in (0.25, 0.5)])


# two objects and a difficult one, the same in every image; images are 200 high, 100 wide
TARGET = {
    "boxes": torch.tensor([[0.0, 0.0, 0.25, 0.25], [0.5, 0.5, 1.0, 1.0], [0.5, 0.0, 0.75, 0.25]]),
    "labels": torch.tensor([1, 2, 1]),
    "difficult": torch.tensor([False, False, True]),
    "image_id": 0,
    "orig_size": (200, 100),
}


def collate(samples: list[tuple[Tensor, dict]]) -> tuple[Tensor, list[dict]]:
    return torch.stack([image for image, _ in samples]), [target for _, target in samples]


def loader(images: int = 4) -> DataLoader:
    samples = [(torch.rand(3, 16, 16), {**TARGET, "image_id": i}) for i in range(images)]
    return DataLoader(samples, batch_size=2, collate_fn=collate)


def oracle() -> TinyDetector:
    """A detector that outputs the matched targets of ``TARGET`` whatever the image."""
    net = TinyDetector(grid_priors(), num_classes=3)
    locations, labels = match_priors(TARGET["boxes"], TARGET["labels"], net.priors)
    logits = 20.0 * F.one_hot(labels, 3) - 10.0  # probability ~1 for the matched class
    with torch.no_grad():
        net.head.weight.zero_()
        net.head.bias.copy_(torch.cat([locations, logits], dim=1).flatten())
    return net


def trainer(**kwargs: int) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_perfect_detections_score_one() -> None:
    task = DetectionTask(oracle(), SGD)
    (val,) = trainer().validate(task, loader(), verbose=False)
    assert val["val/map"] == pytest.approx(1.0)
    assert val["val/loss"] == pytest.approx(0.0, abs=1e-6) and val["val/loss_loc"] == 0.0
    (test,) = trainer().test(task, loader(), verbose=False)
    for key in ("test/map", "test/map_coco", "test/map50", "test/map75"):
        assert test[key] == pytest.approx(1.0), key


def test_metrics_see_pixel_boxes() -> None:
    task = DetectionTask(oracle(), SGD)
    images, targets = next(iter(loader(2)))
    preds, truths = task.detections(*task(images), targets)
    # normalised x by the width 100, y by the height 200
    assert truths[0]["boxes"][0].tolist() == [0.0, 0.0, 25.0, 50.0]
    assert truths[0]["iscrowd"].tolist() == [0, 0, 1]
    found = preds[0]["boxes"][preds[0]["labels"] == 2]
    assert torch.allclose(found, torch.tensor([[50.0, 100, 100, 200]]))


def test_training_steps_update_the_network() -> None:
    torch.manual_seed(0)
    task = DetectionTask(TinyDetector(grid_priors(), num_classes=3), SGD)
    before = task.net.head.bias.clone()
    fit = trainer(max_steps=2, limit_val_batches=0)
    fit.fit(task, loader())
    assert math.isfinite(fit.callback_metrics["train/loss"].item())
    assert {"train/loss_loc", "train/loss_cls"} <= set(fit.callback_metrics)
    assert not torch.equal(before, task.net.head.bias)


def test_network_needs_priors() -> None:
    with pytest.raises(TypeError, match="priors"):
        DetectionTask(nn.Linear(3, 3), SGD)
