"""The prediction entry point: segmentation overlay (its ``predict`` function, in this process) and
classification top-k (``python predict.py`` as a subprocess, the command a user types)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.commands.predict import (
    LEGEND_PAD,
    LEGEND_ROW,
    describe_detections,
    detection_rows,
    predict,
    voc_palette,
)
from tests.conftest import ROOT, compose_config
from tests.parity.reference import reference_dir

WEIGHTS = "espnetv2_s_0.5_pascal_256x256"


def run_predict(*overrides: str) -> subprocess.CompletedProcess:
    """``python predict.py *overrides`` from the repository root; fails on a non-zero exit."""
    command = [sys.executable, str(ROOT / "predict.py"), *overrides]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"predict.py failed:\n{result.stdout}\n{result.stderr}"
    return result


def edgenets_files(image_name: str) -> tuple[Path, Path, Path]:
    """Weights, image and official masks under ``$REFERENCE_DIR/edgenets``, or skip saying where."""
    folder = reference_dir() / "edgenets"
    files = (
        folder / "weights" / f"{WEIGHTS}.pth",
        folder / "images" / image_name,
        folder / "seg_pascal" / f"{WEIGHTS}.npz",
    )
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        pytest.skip(
            f"EdgeNets reference files absent: {missing}; "
            "set REFERENCE_DIR to the folder holding edgenets/"
        )
    return files


# sample8 is the documented example (all background in the official mask); sample5 has objects
@pytest.mark.parametrize("image_name", ["sample8.jpg", "sample5.jpg"])
def test_segmentation_overlay_matches_official_mask(tmp_path: Path, image_name: str) -> None:
    weights, image_path, masks = edgenets_files(image_name)
    output = tmp_path / "out.png"
    overrides = [
        "data=voc_seg", "model=espnetv2_seg", "model.scale=0.5", f"task.init_checkpoint={weights}",
        f"image={image_path}", "size=[256,256]", f"output={output}",
        "alpha=1.0",  # pure class colours, so the overlay's colours name the predicted classes
    ]  # fmt: skip
    result = predict(compose_config("predict", overrides, tmp_path))
    assert result["task"] == "segmentation" and result["output"] == str(output)

    with Image.open(image_path) as image:
        width, height = image.size
    with Image.open(output) as written:
        assert written.mode == "RGB"
        pixels = np.asarray(written)  # (H + legend, W, 3)
    assert pixels.shape[1] == width
    # the image, then one legend row or more
    assert pixels.shape[0] >= height + LEGEND_ROW + 2 * LEGEND_PAD
    image_colours, counts = np.unique(pixels[:height].reshape(-1, 3), axis=0, return_counts=True)
    image_colours = [tuple(c) for c in image_colours.tolist()]
    fractions = dict(zip(image_colours, counts / counts.sum()))

    reference = np.load(masks)
    # (256, 256) class ids
    official = reference["mask"][list(reference["images"]).index(image_name)]
    ids, id_counts = np.unique(official, return_counts=True)
    objects = {i: c for i, c in zip(ids.tolist(), id_counts.tolist()) if i != 0}
    palette = [tuple(c) for c in voc_palette(21).tolist()]
    legend = {tuple(c) for c in pixels[height:].reshape(-1, 3).tolist()}
    if objects:
        dominant = palette[max(objects, key=objects.get)]
        assert dominant in fractions, f"main class colour {dominant} missing: {fractions}"
        assert dominant in legend
    else:
        # the official mask is all background: so (up to PIL/JPEG decoding) is ours
        assert fractions.get(palette[0], 0.0) > 0.99, fractions
        assert palette[0] in legend


def test_classification_top_k(tmp_path: Path) -> None:
    image_path = tmp_path / "digit.png"
    grey = np.zeros((64, 48), dtype=np.uint8)
    grey[8:56, 20:28] = 255  # a bright vertical stroke, roughly a "1"
    Image.fromarray(grey).save(image_path)
    result = run_predict(
        "model=timm",
        "data=digits",
        f"image={image_path}",
        f"paths.log_dir={tmp_path / 'logs'}",
        "allow_random=true",  # the table's format is under test, not the weights
    )

    lines = result.stdout.splitlines()
    header = next(
        i for i, line in enumerate(lines) if line.split()[:3] == ["rank", "class", "probability"]
    )
    rows = [line.split() for line in lines[header + 1 : header + 6]]
    assert [int(rank) for rank, _, _ in rows] == [1, 2, 3, 4, 5]
    assert all(name in {str(d) for d in range(10)} for _, name, _ in rows)
    assert len({name for _, name, _ in rows}) == 5
    probabilities = [float(p) for _, _, p in rows]
    assert all(0.0 <= p <= 1.0 for p in probabilities)
    assert probabilities == sorted(probabilities, reverse=True)
    assert sum(probabilities) <= 1.0 + 1e-4  # rounded to 4 decimals


def listed_in(line: str) -> int:
    """How many (class, score, box) entries a detection log line lists."""
    return len(re.findall(r"\('[^']*', [\d.]+, \[", line))


def test_detections_are_listed_in_clipped_pixels_with_a_true_count() -> None:
    width, height = 384, 303
    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(25, 4, generator=generator) * 2.0 - 0.5  # normalised, many outside [0, 1]
    boxes = torch.cat(
        [corners[:, :2].minimum(corners[:, 2:]), corners[:, :2].maximum(corners[:, 2:])], 1
    )
    boxes[0] = torch.tensor([0.25, 0.5, 0.75, 1.2])
    found = {
        "boxes": boxes,
        "scores": torch.linspace(0.9, 0.5, 25),
        "labels": torch.ones(25, dtype=torch.long),
    }
    rows = detection_rows(found, ("background", "coin"), (width, height))
    assert len(rows) == 25
    assert rows[0] == (
        "coin",
        0.9,
        [96.0, 151.5, 288.0, 303.0],
    )  # scaled to the image, clipped to it
    assert all(
        0 <= x1 <= x2 <= width and 0 <= y1 <= y2 <= height for _, _, (x1, y1, x2, y2) in rows
    )
    assert any(v in (0.0, width, height) for _, _, box in rows[1:] for v in box), (
        "no box was clipped"
    )

    line = describe_detections(rows, 0.5, (width, height))
    assert line.startswith("top 10 of 25 detections scoring >= 0.5") and listed_in(line) == 10
    line = describe_detections(rows[:3], 0.5, (width, height))
    assert line.startswith("3 detections scoring >= 0.5") and listed_in(line) == 3
    assert describe_detections([], 0.5, (width, height)) == "no detections scoring >= 0.5"


def test_detection_draws_tagged_boxes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An SSD (random weights) on a photograph: the boxes it keeps are drawn on the image."""
    from skimage import data

    image_path = tmp_path / "coins.png"
    Image.fromarray(data.coins()).save(image_path)
    output = tmp_path / "boxes.png"
    overrides = [
        "data=coins_det", "model.scale=0.5", f"image={image_path}", f"output={output}",
        "allow_random=true", "score_threshold=0.45",
    ]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="predict"):
        result = predict(compose_config("predict", overrides, tmp_path))
    assert result["task"] == "detection" and result["output"] == str(output)
    assert result["detections"], "an untrained two-class SSD scores many priors near 0.5"
    assert all(name == "coin" and score >= 0.45 for name, score, _ in result["detections"])
    # boxes in pixels of the 384 x 303 photograph, clipped to it (priors at the border reach past
    # it)
    height, width = data.coins().shape
    assert all(
        0 <= x1 <= x2 <= width and 0 <= y1 <= y2 <= height
        for _, _, (x1, y1, x2, y2) in result["detections"]
    )
    (line,) = [r.getMessage() for r in caplog.records if "detections scoring" in r.getMessage()]
    count = len(result["detections"])
    shown = min(count, 10)
    assert (
        line.startswith(f"top 10 of {count} " if count > 10 else f"{count} ")
        and listed_in(line) == shown
    )
    with Image.open(image_path) as original, Image.open(output) as drawn:
        assert drawn.size == original.size and drawn.mode == "RGB"
        changed = np.any(np.asarray(drawn) != np.asarray(original.convert("RGB")), axis=-1)
    assert changed.mean() > 0.001  # boxes were drawn
