"""How ``export.py quantize=int8`` scores an SSD: VOC07 mAP of each file on the labelled split,
agreement with fp32's confident detections on unlabelled images, the calibration images of a
training split smaller than one batch, and the end-to-end int8 export (heavy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import Tensor

from src.commands.export import export, int8_metrics, metric_text, one_at_a_time
from src.datamodules.loading import resumable_loader
from src.export.detection_checks import detection_agreement, detection_map, matched
from src.export.images import BATCH, ExportImages, training_images
from src.tasks.detection import DetectionTask
from tests.conftest import compose_config
from tests.tasks.test_detection import SGD, loader, oracle


def detections(boxes: list[list[float]], labels: list[int]) -> dict[str, Tensor]:
    count = len(boxes)
    return {
        "boxes": torch.tensor(boxes).reshape(count, 4),
        "scores": torch.linspace(0.9, 0.6, count),
        "labels": torch.tensor(labels, dtype=torch.long),
    }


def test_matching_is_one_to_one_within_a_class() -> None:
    reference = detections([[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30]], [1, 1, 2])
    # one box over both class-1 references (IoU 1 and 0.82), and the class-2 one found as class 1
    assert matched(reference, detections([[0, 0, 10, 10], [20, 20, 30, 30]], [1, 1])) == 1
    # a second class-1 box and the class-2 one at IoU 0.62 (10x10 against 10x11 moved down 2)
    candidate = detections([[0, 0, 10, 10], [1, 0, 11, 10], [20, 22, 30, 33]], [1, 1, 2])
    assert matched(reference, candidate) == 3
    candidate = detections([[0, 0, 10, 10], [1, 0, 11, 10], [20, 25, 30, 35]], [1, 1, 2])
    assert matched(reference, candidate) == 2  # IoU 0.33 is a miss
    assert matched(reference, detections([], [])) == 0


def shifted(net: torch.nn.Module, by: float) -> torch.nn.Module:
    """The oracle with its boxes moved right by ``by`` prior widths (encoded x offset + by/0.1)."""

    def predict(images: Tensor) -> tuple[Tensor, Tensor]:
        locations, logits = net(images)
        return locations + torch.tensor([by / 0.1, 0.0, 0.0, 0.0]), logits

    return predict


def test_detection_map_is_the_tasks_voc_map() -> None:
    task = DetectionTask(oracle(), SGD)
    perfect = {"map": pytest.approx(100.0), "map_coco": pytest.approx(100.0)}
    assert detection_map(task, task.net, loader()) == perfect
    # a quarter prior width off, every box at IoU 0.6: a VOC hit, a COCO hit at IoU 0.5 and 0.55
    # of its ten thresholds; 0.6 widths off: no hit
    assert detection_map(task, shifted(task.net, 0.25), loader()) == {
        "map": pytest.approx(100.0),
        "map_coco": pytest.approx(20.0),
    }
    assert detection_map(task, shifted(task.net, 0.6), loader()) == {
        "map": pytest.approx(0.0),
        "map_coco": pytest.approx(0.0),
    }


def test_agreement_counts_fp32s_confident_detections_int8_finds() -> None:
    task = DetectionTask(oracle(), SGD)
    images = [batch for batch, _ in loader(4)]
    same = detection_agreement(task, task.net, task.net, images)
    # 3 boxes (the difficult one too: no labels here) per image, scores ~1
    assert (same["detections"], same["int8_detections"], same["images"]) == (12, 12, 4)
    assert same["agreement"] == same["precision"] == pytest.approx(100.0)

    def no_class_2(batch: Tensor) -> tuple[Tensor, Tensor]:
        """Class 2's priors called background."""
        locations, logits = task.net(batch)
        logits = logits.clone()
        logits[..., 0] = torch.maximum(logits[..., 0], logits[..., 2])
        logits[..., 2] = -30.0
        return locations, logits

    found = detection_agreement(task, task.net, no_class_2, images)
    assert (found["detections"], found["int8_detections"]) == (12, 8)
    assert found["agreement"] == pytest.approx(100.0 * 8 / 12)
    assert found["precision"] == pytest.approx(100.0)
    text = metric_text({"int8_vs_fp32": found})
    assert text == (
        "int8 finds 66.67% of fp32's 12 detections scoring >= 0.5 on 4 images "
        "(100.00% of its own 8 match fp32's)"
    )


def test_int8_metrics_of_a_detector_per_file() -> None:
    """The command's detection branch: mAP of eager, the fp32 and the int8 predictor; the
    program's one-image outputs batched as the tuple SSD returns."""
    task = DetectionTask(oracle(), SGD)
    images = ExportImages(
        source="dataset", description="", check=torch.zeros(1, 3, 16, 16),
        calibration=None, calibration_source=None, labelled=lambda: loader(4),
    )  # fmt: skip
    program = one_at_a_time(lambda image: list(task.net(image)), (3, 16, 16))
    locations, logits = program(torch.rand(3, 3, 16, 16))
    assert locations.shape == (3, 32, 4) and logits.shape == (3, 32, 3)
    cfg = OmegaConf.create({"calibration_images": 8})
    metrics = int8_metrics(cfg, task, images, "detection", program, shifted(task.net, 0.6), "onnx")
    assert metrics == {
        "eager": {"map": pytest.approx(100.0), "map_coco": pytest.approx(100.0)},
        "fp32_onnx": {"map": pytest.approx(100.0), "map_coco": pytest.approx(100.0)},
        "int8_onnx": {"map": pytest.approx(0.0), "map_coco": pytest.approx(0.0)},
    }
    assert metric_text(metrics) == (
        "map eager 100.00%, fp32_onnx 100.00%, int8_onnx 0.00%; "
        "map_coco eager 100.00%, fp32_onnx 100.00%, int8_onnx 0.00%"
    )


def test_a_training_split_smaller_than_a_batch_calibrates_on_every_image() -> None:
    class Split:
        def train_dataloader(self) -> torch.utils.data.DataLoader:
            samples = [(torch.full((3, 4, 4), float(i)), i) for i in range(5)]
            return resumable_loader(samples, BATCH, 0, shuffle=True, pin_memory=False)

    assert len(list(Split().train_dataloader())) == 0  # the training loader drops it
    batches = list(training_images(Split()))
    assert sorted(torch.cat(batches)[:, 0, 0, 0].tolist()) == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.heavy  # an SSD300 export, int8 calibration and three mAP passes: about a minute
def test_ssd_int8_export_reports_map_per_file(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    overrides = [
        "experiment=detection/ssd_demo", f"data.root={tmp_path / 'coins'}", "data.num_train=6",
        "data.num_test=3", "allow_random=true", "quantize=int8", "calibration_images=6",
        f"out={tmp_path / 'ssd'}",
    ]  # fmt: skip
    card = export(compose_config("export", overrides, tmp_path))
    metric = card["int8"]["metric"]
    assert card["int8"]["calibration_images"] == 6  # fewer than a training batch
    assert set(metric) == {"eager", "fp32_onnx", "int8_onnx"}
    for key in ("map", "map_coco"):
        assert metric["fp32_onnx"][key] == pytest.approx(metric["eager"][key], abs=1e-6)
        assert 0.0 <= metric["int8_onnx"][key] <= 100.0
    saved = json.loads((tmp_path / "ssd.json").read_text())
    assert saved["int8"]["metric"] == metric
