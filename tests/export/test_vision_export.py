"""ONNX export of every vision model config: dynamic batch (and image size where the network takes
other sizes), parity against eager PyTorch at the export size and two others."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from src.export.onnx import export_onnx, graph_inputs, op_counts, parity, session
from src.export.vision import other_sizes, vision_spec
from tests.conftest import ROOT

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TOLERANCE = 1e-4  # fp32 max abs error against eager
# the dynamo exporter takes 1-2 minutes for a network of DiCE units on 2 cores: run with -m heavy
HEAVY = [pytest.mark.slow, pytest.mark.heavy]

# (config, image side, overrides): small widths; the side is two steps of the output stride
CASES = [
    pytest.param("dicenet", 32, {"scale": 0.2, "stem_stride": 1}, id="dicenet-0.2", marks=HEAVY),
    pytest.param("dicenet", 64, {"scale": 2.0}, id="dicenet-2.0", marks=HEAVY),
    pytest.param("espnetv2", 64, {"scale": 0.5}, id="espnetv2"),
    pytest.param("dice_mobilenet", 64, {"scale": 0.5}, id="dice_mobilenet", marks=HEAVY),
    pytest.param("dice_resnet", 64, {"scale": 0.5}, id="dice_resnet", marks=HEAVY),
    pytest.param("dicenet_seg", 64, {"scale": 0.5}, id="dicenet_seg", marks=HEAVY),
    pytest.param("espnetv2_seg", 64, {"scale": 0.5}, id="espnetv2_seg", marks=HEAVY),
    pytest.param("ssd", 300, {"scale": 0.5}, id="ssd"),
]


def build(name: str, side: int, overrides: dict) -> torch.nn.Module:
    cfg = OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml")
    cfg.num_classes = 5
    for key, value in {"in_chans": 3, "input_size": side, "image_size": side}.items():
        if key in cfg:
            cfg[key] = value
    cfg.update(overrides)
    torch.manual_seed(0)
    return instantiate(cfg).eval()


@pytest.mark.parametrize(("name", "side", "overrides"), CASES)
def test_export_matches_eager(tmp_path, name: str, side: int, overrides: dict) -> None:
    net = build(name, side, overrides)
    spec = vision_spec(net, torch.randn(2, 3, side, side))
    path = export_onnx(spec, tmp_path / f"{name}.onnx")
    ops = op_counts(path)
    assert not [op for op in ops if "::" in op], ops  # standard ONNX operators only
    (image,) = graph_inputs(path)
    runner = session(path)
    generator = torch.Generator().manual_seed(1)
    checks = [parity(runner, spec, (torch.randn(3, 3, side, side, generator=generator),))]
    if name == "ssd":
        assert image["dynamic"] == [0]
        assert spec.output_names == ["locations", "scores"]
        assert any("NMS" in note for note in spec.notes)
    elif name.endswith("_seg"):  # at the exported image size (the EPP decoder's resize tables)
        assert image["dynamic"] == [0]
        assert other_sizes(spec) == []
    else:
        assert image["dynamic"] == [0, 2, 3]
        sizes = other_sizes(spec)
        assert len(sizes) == 2 and all(h != w for h, w in sizes)
        for height, width in sizes:
            x = torch.randn(1, 3, height, width, generator=generator)
            checks.append(parity(runner, spec, (x,)))
    for check in checks:
        assert check["max_abs"] <= TOLERANCE, check
        assert check["max_rel"] <= TOLERANCE, check


def test_a_fixed_size_spec_has_a_dynamic_batch_only() -> None:
    net = build("espnetv2", 64, {"scale": 0.5})
    spec = vision_spec(net, torch.randn(2, 3, 64, 64), fixed_size=True)
    assert spec.dynamic == {"image": {0: "batch"}} and other_sizes(spec) == []
    assert any("fixed_size" in note for note in spec.notes)
    dynamic = vision_spec(net, torch.randn(2, 3, 64, 64))
    assert dynamic.dynamic == {"image": {0: "batch", 2: "height", 3: "width"}}


@pytest.mark.slow  # about 25 s: a small DiCENet at 32x32, unlike the heavy exports above
def test_a_fixed_size_dicenet_graph_has_no_resize_products(tmp_path) -> None:
    # input_size 32 builds the DiCE units for the maps a 32x32 image gives: at that one size
    # their resizes are identities, left out of the graph. The example is one image: torch.export
    # makes a dimension of size 1 the constant 1, and the exporter's fallbacks fail on DiCE units
    # ("Invalid ranges [2:1]"), so export_onnx traces it repeated to two; the batch stays dynamic
    net = build("dicenet", 32, {"scale": 0.2, "stem_stride": 1})
    spec = vision_spec(net, torch.randn(1, 3, 32, 32), fixed_size=True)
    path = export_onnx(spec, tmp_path / "dicenet.onnx")
    (image,) = graph_inputs(path)
    assert image["dynamic"] == [0]
    assert "MatMul" not in op_counts(path)
    runner = session(path)
    for batch in (1, 3):
        check = parity(runner, spec, (torch.randn(batch, 3, 32, 32),))
        assert check["max_abs"] <= TOLERANCE, check
