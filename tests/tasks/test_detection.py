"""SSD matching, encoding, loss and post-processing against hand-computed values; the COCO metric
against pycocotools; the detection task end to end with a stand-in network."""

from __future__ import annotations

import functools
import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torchvision.models.detection._utils import BoxCoder
from torchvision.ops import box_convert, box_iou

from src.models.ssd_priors import ssd_priors
from src.tasks.detection import (
    DetectionTask,
    coco_metric,
    decode,
    encode,
    match_priors,
    multibox_loss,
    postprocess,
)

SGD = functools.partial(torch.optim.SGD, lr=0.1)


def random_priors(count: int, generator: torch.Generator) -> Tensor:
    """(cx, cy, w, h) priors inside the unit square."""
    centres = 0.2 + 0.6 * torch.rand(count, 2, generator=generator)
    sizes = 0.05 + 0.3 * torch.rand(count, 2, generator=generator)
    return torch.cat([centres, sizes], dim=1)


def test_encoding_is_torchvision_box_coder_10_10_5_5() -> None:
    generator = torch.Generator().manual_seed(0)
    priors = random_priors(20, generator)
    boxes = box_convert(random_priors(20, generator), "cxcywh", "xyxy")
    coder = BoxCoder(weights=(10.0, 10.0, 5.0, 5.0))
    corners = box_convert(priors, "cxcywh", "xyxy")
    codes = encode(boxes, priors)
    assert torch.allclose(codes, coder.encode_single(boxes, corners), atol=1e-5)
    assert torch.allclose(decode(codes, priors), boxes, atol=1e-6)
    locations = torch.randn(3, 20, 4, generator=generator)  # any leading dims
    expected = coder.decode_single(locations.reshape(-1, 4), corners.repeat(3, 1)).reshape(3, 20, 4)
    assert torch.allclose(decode(locations, priors), expected, atol=1e-6)


# (cx, cy, w, h): the four quadrants, the whole image, and a box inside the top-left quadrant
PRIORS = torch.tensor(
    [
        [0.25, 0.25, 0.5, 0.5],
        [0.75, 0.25, 0.5, 0.5],
        [0.25, 0.75, 0.5, 0.5],
        [0.75, 0.75, 0.5, 0.5],
        [0.5, 0.5, 1.0, 1.0],
        [0.25, 0.25, 0.5, 0.4],
    ]
)


def test_matching_thresholds_and_forces_each_box_onto_its_best_prior() -> None:
    boxes = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 0.7, 0.7]])
    locations, labels = match_priors(boxes, torch.tensor([3, 1]), PRIORS)
    # prior 0: IoU 1; prior 5: IoU 0.8; prior 4: IoU 0.25 < 0.45; prior 3: IoU 0.16 with the small
    # box, its best prior, so forced
    assert labels.tolist() == [3, 0, 0, 1, 0, 3]
    assert locations[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    # centre (0.6 - 0.75) / 0.5 / 0.1, size log(0.2 / 0.5) / 0.2
    size = 5 * math.log(0.4)
    assert locations[3].tolist() == pytest.approx([-3.0, -3.0, size, size])
    assert locations[5].tolist() == pytest.approx([0.0, 0.0, 0.0, 5 * math.log(1.25)])


def test_matching_conflicts_and_empty_images() -> None:
    # both boxes overlap prior 0 most (IoU 1 and 0.9): the later one keeps it
    boxes = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.5, 0.45]])
    locations, labels = match_priors(boxes, torch.tensor([1, 2]), PRIORS)
    assert labels[0].item() == 2
    assert torch.allclose(locations[0], encode(boxes[1:], PRIORS[:1])[0])
    locations, labels = match_priors(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), PRIORS)
    assert labels.tolist() == [0] * 6 and not locations.any()


def test_matching_equals_the_official_loop_on_random_boxes() -> None:
    generator = torch.Generator().manual_seed(1)
    priors = random_priors(200, generator)
    boxes = box_convert(random_priors(12, generator), "cxcywh", "xyxy")
    boxes = torch.cat([boxes, boxes[:3] + 0.01])  # near-duplicates that claim the same priors
    labels = torch.randint(1, 5, (15,), generator=generator)
    # assign_priors as written in the official code: a Python loop over the boxes
    iou = box_iou(box_convert(priors, "cxcywh", "xyxy"), boxes)
    best_iou, best_gt = iou.max(dim=1)
    best_prior = iou.argmax(dim=0)
    for gt_index, prior_index in enumerate(best_prior.tolist()):
        best_gt[prior_index] = gt_index
    best_iou[best_prior] = 2.0
    expected_labels = labels[best_gt].masked_fill(best_iou < 0.45, 0)
    locations, matched = match_priors(boxes, labels, priors)
    assert len(set(best_prior.tolist())) < 15  # some boxes claim the same prior
    assert torch.equal(matched, expected_labels)
    assert torch.allclose(locations, encode(boxes[best_gt], priors))


def test_multibox_loss_hand_computed() -> None:
    # image 0: prior 0 is class 1, priors 1-7 background with logits (a, 0, 0), whose background
    # loss log(e^a + 2) - a falls with a; image 1 has no object, so none of its priors counts
    a = torch.tensor([3.0, -1.0, 0.0, 4.0, -2.0, 1.0, 2.0])
    logits = torch.zeros(2, 8, 3)
    logits[0, 0] = torch.tensor([0.0, 2.0, 0.0])
    logits[0, 1:, 0] = a
    logits[1, :, 0] = -5.0
    labels = torch.zeros(2, 8, dtype=torch.int64)
    labels[0, 0] = 1
    locations = torch.randn(2, 8, 4) * 10  # only the positive's count
    locations[0, 0] = torch.tensor([0.5, -0.5, 1.5, 0.0])
    loc, cls = multibox_loss(locations, logits, torch.zeros(2, 8, 4), labels)
    # 3 negatives: a = -2, -1, 0
    expected_cls = math.log(2 + math.e**2) - 2
    expected_cls += sum(math.log(math.exp(v) + 2) - v for v in (-2.0, -1.0, 0.0))
    assert cls.item() == pytest.approx(expected_cls, rel=1e-6)
    assert loc.item() == pytest.approx(0.125 + 0.125 + 1.0)  # smooth L1, beta 1
    # the same image twice: sums and positives double
    twice = [0, 0]
    loc2, cls2 = multibox_loss(locations[twice], logits[twice], torch.zeros(2, 8, 4), labels[twice])
    assert (loc2.item(), cls2.item()) == pytest.approx((loc.item(), cls.item()))
    # no object in the batch: zero losses, not a division by zero
    loc0, cls0 = multibox_loss(locations[1:], logits[1:], torch.zeros(1, 8, 4), labels[1:])
    assert loc0.item() == 0.0 and cls0.item() == 0.0


def test_postprocess_thresholds_nms_and_top_k() -> None:
    priors = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.31, 0.3, 0.2, 0.2], [0.7, 0.7, 0.2, 0.2]])
    # class probabilities; priors 0 and 1 overlap at IoU 0.9
    probabilities = torch.tensor([[0.1, 0.8, 0.1], [0.31, 0.6, 0.09], [0.395, 0.6, 0.005]])
    logits = probabilities.log()[None]
    (found,) = postprocess(torch.zeros(1, 3, 4), logits, priors)
    corners = box_convert(priors, "cxcywh", "xyxy")
    # class 1: prior 1 (0.6) suppressed by prior 0 (0.8); class 2: prior 1 (0.09) suppressed by
    # prior 0 (0.1), prior 2 (0.005) below 0.01; best score first
    assert found["labels"].tolist() == [1, 1, 2]
    assert found["scores"].tolist() == pytest.approx([0.8, 0.6, 0.1])
    assert torch.allclose(found["boxes"], corners[[0, 2, 0]])
    (top1,) = postprocess(torch.zeros(1, 3, 4), logits, priors, max_per_class=1)
    assert top1["labels"].tolist() == [1, 2]
    assert top1["scores"].tolist() == pytest.approx([0.8, 0.1])
    # one candidate per class enters NMS: the best of each, nothing left to suppress
    (pre1,) = postprocess(torch.zeros(1, 3, 4), logits, priors, pre_nms_top_k=1)
    assert pre1["labels"].tolist() == [1, 2]
    assert pre1["scores"].tolist() == pytest.approx([0.8, 0.1])
    assert torch.allclose(pre1["boxes"], corners[[0, 0]])


def test_pre_nms_top_k_on_an_untrained_network() -> None:
    """Random logits over the 11,640 priors, every score above 0.01: greedy NMS decides each
    candidate by the better ones only, so with 400 candidates per class the detections are the
    first ones of the unlimited run's, class by class (here all 200 a class keeps)."""
    torch.manual_seed(0)
    classes = 6
    priors = ssd_priors(300)
    locations, logits = torch.randn(1, 11_640, 4) * 0.1, torch.randn(1, 11_640, classes)
    (full,) = postprocess(locations, logits, priors)
    (limited,) = postprocess(locations, logits, priors, pre_nms_top_k=400)
    assert len(limited["scores"]) == len(full["scores"]) == 200 * (classes - 1)
    for label in range(1, classes):
        mine, theirs = (d["labels"] == label for d in (limited, full))
        kept = int(mine.sum())
        assert 0 < kept <= 200
        torch.testing.assert_close(limited["scores"][mine], full["scores"][theirs][:kept])
        torch.testing.assert_close(limited["boxes"][mine], full["boxes"][theirs][:kept])


def coco_fixture() -> tuple[list[dict], list[dict]]:
    """Two 100 x 100 images, two classes; detections at several IoUs (0.91, 0.83, 0.83, 0.66,
    none on a COCO threshold), a miss and false alarms."""
    truths = [
        {"boxes": torch.tensor([[10.0, 10, 50, 50], [60, 60, 90, 95]]),
         "labels": torch.tensor([1, 2])},
        {"boxes": torch.tensor([[0.0, 0, 30, 40], [50, 10, 80, 30]]),
         "labels": torch.tensor([1, 1])},
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


def test_coco_metric_agrees_with_cocoeval() -> None:
    preds, truths = coco_fixture()
    metric = coco_metric()
    metric.update(preds, truths)
    result = metric.compute()
    annotations = []
    for i, target in enumerate(truths):
        for box, label in zip(target["boxes"], target["labels"]):
            x, y, w, h = xywh(box)
            annotations.append(
                {"id": len(annotations) + 1, "image_id": i, "category_id": int(label),
                 "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0}
            )
    ground_truth = COCO()
    ground_truth.dataset = {
        "images": [{"id": i, "width": 100, "height": 100} for i in range(len(truths))],
        "annotations": annotations,
        "categories": [{"id": 1}, {"id": 2}],
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
    ap, ap50, ap75 = evaluation.stats[:3]
    assert 0 < ap < ap75 < ap50 < 1  # the fixture tells the thresholds apart
    assert result["map"].item() == pytest.approx(ap, abs=1e-6)
    assert result["map_50"].item() == pytest.approx(ap50, abs=1e-6)
    assert result["map_75"].item() == pytest.approx(ap75, abs=1e-6)


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
    preds, truths = task._detect(*task(images), targets)
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
