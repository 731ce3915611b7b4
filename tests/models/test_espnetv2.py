"""ESPNetv2: every width builds, runs forward+backward on small and non-square inputs, exposes
its features; HFF, the input shortcut and the branch convolution are options (Tables 2.4, 2.5)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from src.kernels.eesp import depthwise_branches
from src.models.espnetv2 import ESPNETV2_WIDTHS, EESPAblation, ESPNetv2, ESPNetv2Backbone
from src.utils.complexity import count_params


@pytest.fixture(autouse=True)
def _native_cpu_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN builds a primitive per new convolution shape; with the hundreds of small grouped
    convolutions of these networks that dominates CPU test time (seconds vs. tens of ms)."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


@pytest.mark.parametrize("scale", [0.5])
def test_forward_backward_small_input(scale: float) -> None:
    model = ESPNetv2(scale, num_classes=7)
    logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 7)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    # only the never-applied PReLU of the four strided EESPs is frozen (kept as official)
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    assert frozen == [f"backbone.level{i}_0.eesp.act.weight" for i in (2, 3, 4, 5)]


def test_one_channel_32x32_and_non_square() -> None:
    assert ESPNetv2(0.5, num_classes=10, in_chans=1)(torch.randn(2, 1, 32, 32)).shape == (2, 10)
    with torch.no_grad():
        assert ESPNetv2(1.0, num_classes=3).eval()(torch.randn(1, 3, 64, 96)).shape == (1, 3)


def test_features_match_feature_info() -> None:
    model = ESPNetv2(1.0, num_classes=3).eval()
    with torch.no_grad():
        features = model.forward_features(torch.randn(1, 3, 64, 96))
    assert [(f.shape[1], 64 // f.shape[2], 96 // f.shape[3]) for f in features] == [
        (info.channels, info.stride, info.stride) for info in model.feature_info
    ]
    assert [info.channels for info in model.feature_info] == [32, 64, 128, 256, 512]
    encoder = ESPNetv2Backbone(1.0, depth=4)
    assert encoder.level5_0 is None and len(encoder(torch.randn(1, 3, 32, 32))) == 4


def test_unknown_width_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"s=0\.75.*0\.5, 1\.0, 1\.25, 1\.5, 1\.75, 2\.0"):
        ESPNetv2(0.75)
    assert sorted(ESPNETV2_WIDTHS) == [0.5, 1.0, 1.25, 1.5, 1.75, 2.0]


def test_level5_builds_no_image_shortcut() -> None:
    model = ESPNetv2(1.0)
    assert model.backbone.level5_0.image_shortcut is None
    assert all(getattr(model.backbone, f"level{i}_0").image_shortcut is not None for i in (2, 3, 4))


def test_input_shortcut_option() -> None:
    with_lrsc, without = ESPNetv2(1.0), ESPNetv2(1.0, input_shortcut=False)
    # three shortcuts: 3x3 CBR 3->3 (81 + 6 + 3) and 1x1 CB 3->c (3c + 2c) at c = 64, 128, 256
    assert count_params(with_lrsc) - count_params(without) == 3 * 90 + 5 * (64 + 128 + 256)
    assert without(torch.randn(2, 3, 32, 32)).shape == (2, 1000)


def test_image_shortcuts_pool_each_level_once_and_match_full_image_pooling() -> None:
    """The backbone pools the image once per level (4 pools at depth 5); the down-samplers given
    the full image (the official code's pooling, 9 pools) give the same features bit for bit."""
    torch.manual_seed(0)
    backbone = ESPNetv2Backbone(0.5).eval()
    x = torch.randn(2, 3, 50, 37)  # odd sizes: every halving rounds up

    class CountPools(TorchDispatchMode):
        pools = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is torch.ops.aten.avg_pool2d.default and args[0].shape[1] == 3:
                CountPools.pools += 1
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), CountPools():
        features = backbone(x)
    assert CountPools.pools == 4
    with torch.no_grad():
        out1 = backbone.level1(x)
        out2 = backbone.level2_0(out1, x)
        out3 = backbone.level3(backbone.level3_0(out2, x))
        out4 = backbone.level4(backbone.level4_0(out3, x))
    for got, want in zip(features, (out1, out2, out3, out4), strict=False):
        assert torch.equal(got, want)
    assert [f.shape[-2:] for f in features] == [(25, 19), (13, 10), (7, 5), (4, 3), (2, 2)]


def test_hff_off_changes_output_not_parameters() -> None:
    torch.manual_seed(0)
    hff = ESPNetv2(0.5, num_classes=5).eval()
    no_hff = ESPNetv2(0.5, num_classes=5, hff=False).eval()
    no_hff.load_state_dict(hff.state_dict())
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(hff(x), no_hff(x))
    assert isinstance(no_hff.backbone.level2_0.eesp, EESPAblation)


@pytest.mark.parametrize("conv_type", ["depthwise", "dilated"])
def test_conv_types(conv_type: str) -> None:
    model = ESPNetv2(0.5, num_classes=4, conv_type=conv_type)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    unit = model.backbone.level3[0]
    if conv_type == "depthwise":
        assert unit.dilations == (1, 1, 1, 1)
    else:
        assert unit.transform[0].groups == 1 and unit.dilations == (1, 2, 3, 4)
    with pytest.raises(ValueError, match="conv_type must be one of"):
        ESPNetv2(0.5, conv_type="separable")


@pytest.mark.parametrize("conv_type", ["depthwise_dilated", "depthwise", "dilated"])
def test_ablation_inference_matches_the_training_time_forward(conv_type: str) -> None:
    """Inference (eval, no autograd: the CPU's folded path) gives the eval forward with autograd
    on (the plain modules), for every branch type: the fused pyramid kernel computes depth-wise
    branches only, so the dense "dilated" ablation takes the eager pyramid."""
    torch.manual_seed(0)
    model = ESPNetv2(0.5, num_classes=4, conv_type=conv_type).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        folded = model(x)
    plain = model(x)
    torch.testing.assert_close(folded, plain, rtol=1e-4, atol=1e-4)
    assert depthwise_branches(model.backbone.level3[0]) == (conv_type != "dilated")
