"""SSD's box code against hand-computed values, torchvision and the official code: the encoding is
torchvision's ``BoxCoder(10, 10, 5, 5)``, matching equals the official loop, the multibox loss and
post-processing (thresholds, NMS, top-k) give the values worked out by hand, and one
``batched_nms`` keeps what the official per-class ``nms`` loop keeps."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torchvision.models.detection._utils import BoxCoder
from torchvision.ops import box_convert, box_iou, nms

from src.models.ssd_boxes import decode, encode, match_priors, multibox_loss, postprocess
from src.models.ssd_priors import ssd_priors


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


def official_box_predictor(
    locations: Tensor, logits: Tensor, priors: Tensor, score_threshold: float, top_k: int
) -> dict[int, tuple[Tensor, Tensor]]:
    """EdgeNets' ``BoxPredictor.predict`` for one image (``utilities/nms.py``): per foreground
    class, the scores above the threshold, torchvision's ``nms`` at 0.45, the ``top_k`` best."""
    scores = logits.softmax(dim=-1)[0]  # (P, C)
    boxes = decode(locations, priors)[0]  # (P, 4)
    found = {}
    for label in range(1, scores.shape[1]):
        probs = scores[:, label]
        mask = probs > score_threshold
        keep = nms(boxes[mask], probs[mask], 0.45)[:top_k]
        found[label] = (boxes[mask][keep], probs[mask][keep])
    return found


def test_postprocess_equals_the_official_per_class_nms() -> None:
    """One ``batched_nms`` over all classes keeps, class by class, what the official loop of
    per-class ``nms`` keeps, in the same order."""
    generator = torch.Generator().manual_seed(3)
    priors = ssd_priors(300)
    locations = torch.randn(1, priors.shape[0], 4, generator=generator) * 0.3
    logits = torch.randn(1, priors.shape[0], 5, generator=generator) * 2
    (found,) = postprocess(locations, logits, priors, score_threshold=0.3, max_per_class=50)
    official = official_box_predictor(locations, logits, priors, 0.3, 50)
    assert sum(len(scores) for _, scores in official.values()) == len(found["scores"]) > 100
    for label, (boxes, scores) in official.items():
        mine = found["labels"] == label
        assert torch.equal(found["scores"][mine], scores)
        assert torch.equal(found["boxes"][mine], boxes)
    assert torch.equal(found["scores"], found["scores"].sort(descending=True).values)
