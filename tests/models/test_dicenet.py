"""DiCENet: every width builds, runs forward+backward on small and non-square inputs, exposes its
features; the DiCE-unit ablations are options of the same network."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from src.compat.edgenets import load_official
from src.models.dicenet import DICENET_WIDTHS, DiCENet, DiCENetBackbone
from src.utils.complexity import count_params
from tests.conftest import compose_config

# official EdgeNets DiCENet s=1.0, 224x224, 1000 classes (model-zoo README: 1.81 M)
DICENET_1_0_PARAMS = 1_805_604
# DiCENet of conf/recipe/digits_dicenet.yaml: s=0.5, stem_stride=2, 1 channel, 10 classes, DiCE
# layers built for 32x32
DIGITS_DICENET_PARAMS = 195_698


@pytest.fixture(autouse=True)
def _native_cpu_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN builds a primitive per new convolution shape; with the hundreds of small grouped
    convolutions of these networks that dominates CPU test time (seconds vs. tens of ms)."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def _forward_backward(model: torch.nn.Module, x: torch.Tensor, num_classes: int) -> None:
    logits = model(x)
    assert logits.shape == (x.shape[0], num_classes)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_forward_backward_small_input(scale: float) -> None:
    _forward_backward(DiCENet(scale, num_classes=7), torch.randn(2, 3, 32, 32), 7)


def test_one_channel_32x32_and_non_square() -> None:
    _forward_backward(DiCENet(0.2, num_classes=10, in_chans=1), torch.randn(2, 1, 32, 32), 10)
    model = DiCENet(0.5, num_classes=5, input_size=(64, 96)).eval()
    assert model(torch.randn(1, 3, 64, 96)).shape == (1, 5)
    assert model.backbone.level3[0].dice.dim_conv.height == 8
    assert model.backbone.level3[0].dice.dim_conv.width == 12


def test_features_match_feature_info() -> None:
    model = DiCENet(0.75, num_classes=3).eval()
    with torch.no_grad():
        features = model.forward_features(torch.randn(1, 3, 64, 96))
    assert [(f.shape[1], 64 // f.shape[2], 96 // f.shape[3]) for f in features] == [
        (info.channels, info.stride, info.stride) for info in model.feature_info
    ]
    assert [info.channels for info in model.feature_info] == [24, 24, 86, 172, 344]
    encoder = DiCENetBackbone(1.0, depth=4)
    assert encoder.level5 is None and len(encoder(torch.randn(1, 3, 32, 32))) == 4


def test_unknown_width_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"s=0\.3.*0\.1, 0\.2, 0\.5"):
        DiCENet(0.3)
    assert len(DICENET_WIDTHS) == 10
    with pytest.raises(TypeError):
        DICENET_WIDTHS[3.0] = (1,)  # type: ignore[index]


def test_dropout_rule() -> None:
    assert DiCENet(1.0).dropout == 0.1 and DiCENet(1.25).dropout == 0.2
    assert DiCENet(1.0, dropout=0.3).dropout == 0.3


@pytest.mark.parametrize(
    ("spatial", "fusion", "reduce"),
    [
        ("dwise", "pointwise", "pointwise"),  # separable convolution (Table 3.2 baseline)
        ("dimconv", "pointwise", "pointwise"),
        ("dwise", "se", "pointwise"),
        ("dimconv", "pointwise_se", "pointwise"),
        ("dwise", "dimfuse", "pointwise"),
        ("dimconv", "dimfuse", "dimfuse"),  # Table 3.3 R5
    ],
)
def test_ablations_run(spatial: str, fusion: str, reduce: str) -> None:
    model = DiCENet(0.2, num_classes=4, spatial=spatial, fusion=fusion, reduce=reduce)
    _forward_backward(model, torch.randn(2, 3, 32, 32), 4)


def test_ablations_change_the_unit_only() -> None:
    base = DiCENet(0.5, num_classes=4)
    separable = DiCENet(0.5, num_classes=4, spatial="dwise", fusion="pointwise")
    assert type(base.backbone.level1) is type(separable.backbone.level1)
    assert type(base.backbone.level3[1].dice).__name__ == "DiCE"
    assert type(separable.backbone.level3[1].dice).__name__ == "SpatialFusionBlock"
    with pytest.raises(ValueError, match="fusion must be one of"):
        DiCENet(0.5, fusion="dense")


def test_official_loader_reports_missing_and_unexpected_keys() -> None:
    model = DiCENet(0.2, num_classes=10)
    expected = r"missing \['level1\.cbr\.0\.weight'.* and \d+ more, unexpected \['extra'\]"
    with pytest.raises(KeyError, match=expected) as error:
        load_official(model, {"extra": torch.zeros(1)})
    assert len(str(error.value).splitlines()) == 1 and len(str(error.value)) < 400
    with pytest.raises(FileNotFoundError, match="no_such.pth"):
        load_official(model, "/nonexistent/no_such.pth")
    ablated = DiCENet(0.2, spatial="dwise")
    with pytest.raises(ValueError, match="ablation"):
        load_official(ablated, {})


def test_init_weights_is_deterministic_under_seed() -> None:
    torch.manual_seed(0)
    a = DiCENet(0.2)
    torch.manual_seed(0)
    b = DiCENet(0.2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    bn = a.backbone.level1[1]
    assert torch.equal(bn.weight, torch.ones_like(bn.weight))


def test_default_stem_is_the_imagenet_one() -> None:
    model = DiCENet(1.0)
    assert count_params(model) == DICENET_1_0_PARAMS
    assert isinstance(model.backbone.level2, torch.nn.MaxPool2d)
    assert [info.stride for info in model.feature_info] == [2, 4, 8, 16, 32]
    with torch.no_grad():
        assert model.eval().forward_features(torch.randn(1, 3, 32, 32))[-1].shape[2:] == (1, 1)


def test_digits_configuration_keeps_level5_above_1x1() -> None:
    cfg = compose_config(overrides=["data=digits", "model=dicenet"])
    model = instantiate(cfg.model)
    assert model.backbone.stem_stride == 2 and isinstance(model.backbone.level2, torch.nn.Identity)
    assert count_params(model) == DIGITS_DICENET_PARAMS
    x = torch.randn(2, 1, 32, 32)
    _forward_backward(model, x, 10)
    with torch.no_grad():
        features = model.eval().forward_features(x)
    assert [tuple(f.shape[2:]) for f in features] == [(16, 16), (16, 16), (8, 8), (4, 4), (2, 2)]
    assert [info.stride for info in model.feature_info] == [2, 2, 4, 8, 16]
    assert model.backbone.level3[0].dice.dim_conv.height == 8


def test_stem_stride_1_and_invalid_values() -> None:
    model = DiCENet(0.2, num_classes=10, in_chans=1, input_size=32, stem_stride=1)
    assert [info.stride for info in model.feature_info] == [1, 1, 2, 4, 8]
    assert model.forward_features(torch.randn(1, 1, 32, 32))[-1].shape == (1, 128, 4, 4)
    with pytest.raises(ValueError, match=r"stem_stride must be one of \[1, 2, 4\], got 3"):
        DiCENet(0.2, stem_stride=3)
