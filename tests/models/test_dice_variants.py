"""The DiCE unit in the MobileNet and ResNet layouts of thesis Fig. 3.5."""

from __future__ import annotations

import pytest
import torch

from src.models.dice_variants import DiCEBottleneck, DiCELayoutNet, dice_mobilenet, dice_resnet


@pytest.fixture(autouse=True)
def _native_cpu_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN builds a primitive per new convolution shape; with the hundreds of small grouped
    convolutions of these networks that dominates CPU test time (seconds vs. tens of ms)."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


@pytest.mark.parametrize("build", [dice_mobilenet, dice_resnet])
def test_forward_backward(build) -> None:
    model = build(0.5, num_classes=6)
    logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 6)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    with torch.no_grad():
        assert build(0.2, num_classes=10, in_chans=1)(torch.randn(2, 1, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("build", [dice_mobilenet, dice_resnet])
def test_features_match_feature_info(build) -> None:
    model = build(0.5, num_classes=3).eval()
    with torch.no_grad():
        features = model.forward_features(torch.randn(1, 3, 64, 96))
    assert [(f.shape[1], 64 // f.shape[2], 96 // f.shape[3]) for f in features] == [
        (info.channels, info.stride, info.stride) for info in model.feature_info
    ]


def test_resnet_units_are_residual_bottlenecks() -> None:
    model = dice_resnet(1.0)
    first, second = model.level3[1], model.level3[2]
    assert isinstance(first, DiCEBottleneck) and not isinstance(first.shortcut, torch.nn.Identity)
    assert isinstance(second.shortcut, torch.nn.Identity)


def test_resnet_ablation_and_errors() -> None:
    model = dice_resnet(0.2, num_classes=4, spatial="dwise", fusion="pointwise", reduce="dimfuse")
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    with pytest.raises(ValueError, match="layout must be one of"):
        DiCELayoutNet("vgg")
    with pytest.raises(ValueError, match="valid widths"):
        dice_mobilenet(0.3)
