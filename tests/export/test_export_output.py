"""``python export.py`` end to end, as a user runs it: what it prints (short, with the summary; the
ONNX libraries' records in the log file only), export without the dataset (generated inputs,
``images=``), and the peak memory of an int8 export of DiCENet s=1.0 at 224x224."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import ROOT

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

MAX_CONSOLE_LINES = 40
PEAK_RSS_LIMIT_GB = 4.0


def run_export(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``python export.py <overrides>`` with its run directory (and log file) under ``tmp_path``."""
    command = [sys.executable, "export.py", *overrides, f"hydra.run.dir={tmp_path / 'run'}"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)


def write_pictures(folder: Path, count: int) -> None:
    """``count`` pictures of random pixels in a few sizes and formats."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    sizes = [(300, 200), (180, 260), (224, 224), (500, 375)]
    for index in range(count):
        width, height = sizes[index % len(sizes)]
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"picture{index:02d}.{'png' if index % 2 else 'jpg'}")


@pytest.mark.slow
def test_int8_export_prints_progress_and_a_summary(tmp_path) -> None:
    out = tmp_path / "espnet"
    done = run_export(
        tmp_path, "model=espnetv2", "model.scale=0.5", "allow_random=true", "quantize=int8",
        f"out={out}",
    )  # fmt: skip
    console = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(console) <= MAX_CONSOLE_LINES, "\n".join(console)
    stages = ["export: wrote", "check: parity at 1 size(s) on dataset",
              "calibrate: min/max of 128 images", "quantize: wrote",
              "measure: accuracy eager"]  # fmt: skip
    for stage in stages:
        assert any(stage in line and line.endswith(" s)") for line in console), stage
    summary = done.stdout[done.stdout.index("exported ESPNetv2") :].splitlines()
    assert summary[1] == "parity against eager PyTorch on 16 images of the validation split:"
    assert summary[2].startswith("  32x32      max abs ")
    assert summary[3] == "int8: calibrated on 128 images of the training split"
    assert summary[4].startswith("  on the validation split: accuracy eager ")
    assert [line.split()[0] for line in summary[6:9]] == [
        str(out.with_suffix(suffix)) for suffix in (".onnx", ".int8.onnx", ".json")
    ]
    assert summary[9].startswith("took ")
    card = json.loads(out.with_suffix(".json").read_text())
    assert card["parity_inputs"] == "dataset"
    assert card["int8"]["calibration_images"] == 128
    # the ONNX libraries' records went to the log file, none to the console
    logged = (tmp_path / "run" / "export.log").read_text().splitlines()
    chatter = [line for line in logged if "][onnx" in line]
    assert chatter, "no ONNX library record reached the log file"
    assert not [line for line in console if "][onnx" in line or "Replaced initializer" in line]


@pytest.mark.slow
def test_sizing_a_network_needs_no_dataset(tmp_path) -> None:
    """docs/deploy.md's command: ESPNetv2 for ImageNet without an ImageNet folder."""
    out = tmp_path / "espnetv2"
    done = run_export(
        tmp_path, "model=espnetv2", "model.scale=0.5", "data=imagenet",
        f"data.root={tmp_path / 'no_imagenet'}", "allow_random=true", f"out={out}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "parity is checked on generated inputs" in done.stdout + done.stderr
    card = json.loads(out.with_suffix(".json").read_text())
    assert card["parity_inputs"] == "generated"
    assert card["parity"]["inputs"] == (
        "16 generated inputs (standard-normal tensors of shape [3, 224, 224])"
    )
    (image,) = card["inputs"]
    assert image["shape"] == ["batch", 3, "32*height_steps", "32*width_steps"]
    assert image["dynamic"] == [0, 2, 3]
    assert [check["shapes"][0][2:] for check in card["parity"]["checks"]] == [
        [224, 224], [256, 288], [192, 256],
    ]  # fmt: skip
    assert max(check["max_abs"] for check in card["parity"]["checks"]) <= 1e-4
    assert card["params"] == 1_239_962  # 1000 classes, 3 channels


@pytest.mark.slow
def test_int8_export_of_dicenet_at_224_fits_in_4_gb(tmp_path) -> None:
    """DiCENet s=1.0 for ImageNet, calibrated on ``images=`` pictures: the export's peak resident
    memory, measured in a fresh interpreter so that no other child of the test run counts."""
    pictures, out = tmp_path / "pictures", tmp_path / "dicenet"
    write_pictures(pictures, 20)
    overrides = [
        "model=dicenet", "model.scale=1.0", "data=imagenet", f"data.root={tmp_path / 'none'}",
        "allow_random=true", "quantize=int8", f"images={pictures}", f"out={out}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    measure = (
        "import resource, subprocess, sys; "
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stderr.write(done.stdout + done.stderr); "
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", measure, sys.executable, "export.py", *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=3000,
    )  # fmt: skip
    returncode, peak_kb = (int(word) for word in done.stdout.split())
    assert returncode == 0, done.stderr[-3000:]
    peak_gb = peak_kb / 1e6  # ru_maxrss is in kilobytes on Linux
    assert peak_gb <= PEAK_RSS_LIMIT_GB, f"peak resident memory {peak_gb:.2f} GB"
    card = json.loads(out.with_suffix(".json").read_text())
    assert card["parity_inputs"] == "folder"
    assert card["int8"]["calibration_images"] == 20
    assert card["int8"]["calibrated_on"] == f"images of {pictures}"
    assert card["int8"]["metric"]["int8_vs_fp32"]["images"] == 20
