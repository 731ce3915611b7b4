from __future__ import annotations

import json
import subprocess
import sys

import torch
import torchvision
from torch import nn

from src.utils.complexity import count_params, measure
from tests.conftest import ROOT


def test_macs_count_each_multiply_add_once() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.Flatten(), nn.Linear(8 * 5 * 5, 4)
    )
    result = measure(model, torch.zeros(1, 3, 5, 5))
    conv = 8 * 5 * 5 * 3 * 3 * 3  # outputs x (kernel x input channels)
    assert result.macs_conv == conv
    assert result.macs == conv + 8 * 5 * 5 * 4
    assert result.params == 8 * 3 * 3 * 3 + 8 * 5 * 5 * 4 + 4


def test_published_torchvision_counts() -> None:
    """torchvision's model cards: ResNet-18 1.81 GMACs ("GFLOPS"), 11.69 M parameters."""
    result = measure(torchvision.models.resnet18(), torch.zeros(1, 3, 224, 224))
    assert result.params == 11_689_512
    assert abs(result.macs / 1e9 - 1.81) < 0.01


def test_shared_parameters_count_once() -> None:
    linear = nn.Linear(4, 4)
    assert count_params(nn.Sequential(linear, linear)) == 20


def test_complexity_script_prints_table_then_json() -> None:
    command = [
        sys.executable,
        "complexity.py",
        "model=torchvision",
        "model.name=mobilenet_v2",
        "data=imagenet",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["params"] == 3_504_872  # torchvision's card: 3.5 M
    assert abs(result["macs"] / 1e6 - 300.77) < 0.01  # torchvision's card: 0.30 GFLOPS
    assert result["input_shape"] == [1, 3, 224, 224]
    assert any(line.startswith("MACs") for line in lines[:-1])
