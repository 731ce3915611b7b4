from __future__ import annotations

import pytest
import torch

from src.models.hub import timm_model, torchvision_model
from src.utils.complexity import count_params


def test_timm_model_by_name() -> None:
    model = timm_model("resnet10t", num_classes=7, in_chans=1)
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 7)


def test_torchvision_model_adapts_input_channels() -> None:
    model = torchvision_model("shufflenet_v2_x0_5", num_classes=10, in_chans=1)
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 10)
    rgb = torchvision_model("shufflenet_v2_x0_5", num_classes=10)
    # only the first convolution changes: 24 filters of 3x3 lose 2 input channels each
    assert count_params(rgb) - count_params(model) == 24 * 2 * 3 * 3


def test_unknown_names_raise_with_suggestions() -> None:
    with pytest.raises(ValueError, match="resnet18"):
        timm_model("resnet_18", num_classes=10)
    with pytest.raises(ValueError, match="shufflenet_v2_x1_0"):
        torchvision_model("shufflenet", num_classes=10)


def test_weights_file_round_trip_and_key_errors(tmp_path) -> None:
    source = timm_model("resnet10t", num_classes=10, in_chans=1)
    path = tmp_path / "weights.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}}, path)
    loaded = timm_model("resnet10t", num_classes=10, in_chans=1, weights=str(path))
    for key, value in source.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key])
    with pytest.raises(
        KeyError, match=r"does not fit ResNet: \d+ tensors differ in shape .*; \d+ of the network's"
    ):
        timm_model("resnet18", num_classes=10, in_chans=1, weights=str(path))
    with pytest.raises(FileNotFoundError, match="nothing.pth"):
        timm_model("resnet10t", num_classes=10, weights=str(tmp_path / "nothing.pth"))
