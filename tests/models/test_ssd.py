"""SSD: the official priors (recomputed from the generator's formula and against torchvision's
DefaultBoxGenerator), output shapes, gradients, and the model zoo's parameter and MAC counts."""

from __future__ import annotations

import math
from itertools import product

import pytest
import torch
from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
from torchvision.models.detection.image_list import ImageList
from torchvision.ops import box_convert

from src.compat.edgenets import load_official, official_key_map
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.models.ssd import SSD
from src.models.ssd_priors import prior_box_sizes, prior_feature_sizes, ssd_priors
from src.utils.complexity import count_params, measure


@pytest.fixture(autouse=True)
def _native_cpu_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN builds a primitive per new convolution shape; with the many small grouped
    convolutions of these networks that dominates CPU test time."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def official_priors(size: int, strides: list[int]) -> torch.Tensor:
    """The official ``PriorBox.forward`` loop, written out with the SSD300/512 configuration."""
    sizes = [
        int(k)
        for k in torch.linspace(
            math.ceil(0.1 * size), math.ceil(1.05 * size), 7, dtype=torch.float64
        )
    ]
    priors = []
    for k, stride in enumerate(strides):
        scale = size / stride
        for i, j in product(range(math.ceil(size / stride)), repeat=2):
            cx, cy = (j + 0.5) / scale, (i + 0.5) / scale
            w = sizes[k] / size
            big = math.sqrt(sizes[k] * sizes[k + 1]) / size
            priors += [[cx, cy, w, w], [cx, cy, big, big]]
            for ratio in (2, 3):
                r = math.sqrt(ratio)
                priors += [[cx, cy, w * r, w / r], [cx, cy, w / r, w * r]]
    return torch.tensor(priors).clamp_(0.0, 1.0)


@pytest.mark.parametrize(
    ("size", "strides", "count", "maps", "sizes"),
    [
        (
            300,
            [8, 16, 32, 64, 100, 300],
            11_640,
            (38, 19, 10, 5, 3, 1),
            (30, 77, 125, 172, 220, 267, 315),
        ),
        (
            512,
            [8, 16, 32, 64, 128, 512],
            32_742,
            (64, 32, 16, 8, 4, 1),
            (52, 133, 214, 295, 376, 457, 538),
        ),
    ],
)
def test_priors_match_the_official_generator(size, strides, count, maps, sizes) -> None:
    priors = ssd_priors(size)
    assert priors.shape == (count, 4) and priors.dtype == torch.float32
    assert prior_feature_sizes(size) == maps and prior_box_sizes(size) == sizes
    torch.testing.assert_close(priors, official_priors(size, strides), rtol=0, atol=1e-7)
    assert priors.min() >= 0 and priors.max() <= 1


def test_prior_rows_at_300() -> None:
    priors = ssd_priors(300)
    c = 0.5 / 37.5  # first centre of the stride-8 map: (0 + 0.5) / (300 / 8)
    s2, s3 = math.sqrt(2), math.sqrt(3)
    big = math.sqrt(30 * 77) / 300
    first = [
        [c, c, 0.1, 0.1],
        [c, c, big, big],
        [c, c, 0.1 * s2, 0.1 / s2],
        [c, c, 0.1 / s2, 0.1 * s2],
        [c, c, 0.1 * s3, 0.1 / s3],
        [c, c, 0.1 / s3, 0.1 * s3],
    ]
    torch.testing.assert_close(priors[:6], torch.tensor(first))
    # second location of the first map moves along x (row-major over (i, j))
    torch.testing.assert_close(priors[6, :2], torch.tensor([1.5 / 37.5, c]))
    # the 1x1 map: centre 0.5; min 267 px, max 315 px; the elongated boxes clamped to 1
    top = math.sqrt(267 * 315) / 300
    last = [
        [0.5, 0.5, 0.89, 0.89],
        [0.5, 0.5, top, top],
        [0.5, 0.5, 1.0, 0.89 / s2],
        [0.5, 0.5, 0.89 / s2, 1.0],
        [0.5, 0.5, 1.0, 0.89 / s3],
        [0.5, 0.5, 0.89 / s3, 1.0],
    ]
    torch.testing.assert_close(priors[-6:], torch.tensor(last))
    # the last centre of the stride-8 map is exactly the right/bottom edge: 37.5 / 37.5
    assert priors[6 * 38 * 38 - 1, :2].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("size", "strides"), [(300, [8, 16, 32, 64, 100, 300]), (512, [8, 16, 32, 64, 128, 512])]
)
def test_priors_equal_torchvision_default_boxes(size, strides) -> None:
    """torchvision clamps w and h only. At 300 the stride-32 map has 10 cells but 300 / 32 =
    9.375 centre steps, so its last column and row have centres 9.5 / 9.375 = 1.0133, which the
    official clamp moves to 1 (4 px); everything else agrees."""
    sizes = prior_box_sizes(size)
    generator = DefaultBoxGenerator(
        [[2, 3]] * 6, scales=[s / size for s in sizes], steps=strides, clip=True
    )
    maps = [torch.zeros(1, 1, n, n) for n in prior_feature_sizes(size)]
    boxes = generator(ImageList(torch.zeros(1, 3, size, size), [(size, size)]), maps)[0]
    priors = ssd_priors(size)
    theirs = box_convert(boxes / size, "xyxy", "cxcywh")
    differ = (theirs - priors).abs().amax(dim=1) > 1e-5
    if size == 512:
        assert not differ.any()
    else:
        start = 6 * (38 * 38 + 19 * 19)
        cell = (torch.arange(len(priors)) - start).div(6, rounding_mode="floor")  # per location
        row, col = cell.div(10, rounding_mode="floor"), cell % 10
        edge = (cell >= 0) & (cell < 100) & ((row == 9) | (col == 9))
        assert torch.equal(differ, edge) and int(edge.sum()) == 6 * 19
        torch.testing.assert_close(theirs[edge].clamp(0, 1), priors[edge], rtol=0, atol=1e-5)
    torch.testing.assert_close(theirs[~differ], priors[~differ], rtol=0, atol=1e-5)


def test_unknown_image_size_and_backbone_raise() -> None:
    with pytest.raises(ValueError, match="300, 512"):
        ssd_priors(320)
    with pytest.raises(ValueError, match="espnetv2"):
        SSD(21, backbone="vgg", scale=0.5)
    with pytest.raises(ValueError, match="valid widths"):
        SSD(21, scale=3.0)


def test_espnetv2_ssd300_shapes_and_gradients() -> None:
    torch.manual_seed(0)
    model = SSD(5, scale=0.5, image_size=300)
    features = model.forward_features(torch.randn(1, 3, 300, 300))
    assert [tuple(f.shape[1:]) for f in features] == [
        (64, 38, 38),
        (128, 19, 19),
        (1024, 10, 10),
        (512, 5, 5),
        (256, 3, 3),
        (128, 1, 1),
    ]
    locations, logits = model(torch.randn(1, 3, 300, 300))
    assert locations.shape == (1, 11_640, 4) and logits.shape == (1, 11_640, 5)
    assert model.priors.shape == (11_640, 4) and model.num_classes == 5
    (locations.square().mean() + logits.logsumexp(-1).mean()).backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []
    with pytest.raises(ValueError, match="300x300"):
        model(torch.randn(1, 3, 256, 256))


def test_dicenet_ssd300_shapes() -> None:
    model = SSD(3, backbone="dicenet", scale=0.2, image_size=300)
    locations, logits = model(torch.randn(1, 3, 300, 300))
    assert locations.shape == (1, 11_640, 4) and logits.shape == (1, 11_640, 3)
    logits.sum().backward()
    assert model.cls_heads[0].weight.grad is not None
    assert model.backbone.level3[0].dice.dim_conv.weight_height.grad is not None


def test_init_is_xavier_uniform() -> None:
    """Every conv weight within xavier's bound sqrt(6 / (fan_in + fan_out))."""
    model = SSD(21, scale=0.5)
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            w = module.weight
            fan_in, fan_out = w.shape[1] * w[0, 0].numel(), w.shape[0] * w[0, 0].numel()
            assert w.abs().max() <= math.sqrt(6 / (fan_in + fan_out))


@pytest.mark.parametrize(
    ("classes", "params", "zoo"), [(21, 4_745_668, 4.75e6), (81, 5_807_668, 5.81e6)]
)
def test_espnetv2_ssd_parameters_match_the_model_zoo(classes, params, zoo) -> None:
    """Model zoo: 4.75 M (VOC) and 5.81 M (COCO) for ESPNetv2-SSD s = 2.0."""
    with torch.device("meta"):
        model = SSD(classes, scale=2.0)
    n = count_params(model)
    assert n == params
    assert abs(n - zoo) / zoo < 0.01


@pytest.mark.parametrize(
    ("classes", "size", "macs", "zoo"),
    [
        (21, 300, 913_125_567, 0.9),
        (21, 512, 2_519_261_184, 2.5),
        (81, 300, 1_164_307_647, 1.1),
        (81, 512, 3_216_774_144, 3.2),
    ],
)
def test_espnetv2_ssd_macs_match_the_model_zoo(classes, size, macs, zoo) -> None:
    """Convolution MACs (the EdgeNets convention); the zoo's "FLOPs" are them truncated to one
    decimal (1.164 B is listed as 1.1 B)."""
    with torch.device("meta"):
        model = SSD(classes, scale=2.0, image_size=size)
        images = torch.zeros(1, 3, size, size)
    counted = measure(model, images)
    assert counted.macs_conv == counted.macs == macs
    assert math.floor(macs / 1e8) / 10 == zoo


def test_classification_espnetv2_weights_load_into_the_backbone() -> None:
    """The classifier's ``backbone.*`` and ``head_conv.*`` are the detector's, name and shape."""
    classifier = ESPNetv2(0.5, num_classes=10)
    model = SSD(21, scale=0.5)
    result = model.load_state_dict(classifier.state_dict(), strict=False)
    assert result.unexpected_keys == ["classifier.weight", "classifier.bias"]
    assert not [k for k in result.missing_keys if k.startswith(("backbone.", "head_conv."))]
    torch.testing.assert_close(model.head_conv[3].weight, classifier.head_conv[3].weight)


def test_backbone_from_an_official_file(tmp_path) -> None:
    """An official-format ESPNetv2 ImageNet file (our classifier's tensors under the official names)
    initialises backbone and head_conv; the neck and heads keep their initialisation."""
    torch.manual_seed(0)
    classifier = ESPNetv2(0.5, num_classes=1000)
    ours = classifier.state_dict()
    key_map, _ = official_key_map(classifier)
    path = tmp_path / "espnetv2_s_0.5_imagenet_224x224.pth"
    torch.save({f"module.{official}": ours[name] for official, (name, _) in key_map.items()}, path)
    torch.manual_seed(1)
    fresh = SSD(21, scale=0.5)
    torch.manual_seed(1)
    model = SSD(21, scale=0.5)
    load_official(model, path)
    state, initial = model.state_dict(), fresh.state_dict()
    loaded = [k for k in state if k.startswith(("backbone.", "head_conv."))]
    assert len(loaded) > 100
    for key in loaded:
        torch.testing.assert_close(state[key], ours[key], rtol=0, atol=0)
    for key in ("fusion.0.project.0.weight", "cls_heads.0.weight", "extra6.layer.1.0.weight"):
        torch.testing.assert_close(state[key], initial[key], rtol=0, atol=0)


def test_backbone_from_a_classifier_of_this_project() -> None:
    """This project's DiCENet classifier (10 classes) fills the DiCENet-SSD's backbone; one of
    another scale is refused with the mismatch named."""
    classifier = DiCENet(0.5, num_classes=10)
    model = SSD(2, backbone="dicenet", scale=0.5)
    load_official(model, classifier.state_dict())
    for key, value in classifier.state_dict().items():
        if key.startswith("backbone."):
            torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0)
    with pytest.raises(
        KeyError, match=r"does not fit the dicenet s=1.0 backbone: .* differ in shape"
    ):
        load_official(SSD(2, backbone="dicenet", scale=1.0), classifier.state_dict())
