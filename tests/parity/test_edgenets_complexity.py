"""Params, MACs and state-dict layout of every width against the official EdgeNets numbers.

``complexity.json``: parameters must equal the official count less ``unused_params`` (ESPNetv2's
never-called ``level5_0.inp_reinf``, which we do not build); MACs of ``utils.complexity`` (conv +
linear + matmul) within 2% of the official conv + linear multiply-adds. ``state_dict_shapes.json``:
our key map covers every official key (dropped ones aside) and every one of our keys, shape for
shape, for every classification width and every segmentation weight file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

import pytest
import torch

from src.compat.edgenets import official_key_map
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.models.segmentation import dicenet_segmentation, espnetv2_segmentation
from src.utils.complexity import Complexity, count_params, measure
from tests.parity.reference import reference_dir

CLASSIFIERS = {"dicenet": DiCENet, "espnetv2": ESPNetv2}
SEGMENTATION = {"dicenet": dicenet_segmentation, "espnetv2": espnetv2_segmentation}
HYPOTHETICAL = {"dicenet_0.1_commented_out": 0.1, "espnetv2_1.75_not_in_repo": 1.75}
CLASSES = {"pascal": 21, "city": 20}
NAME = re.compile(r"(dicenet|espnetv2)_s_(\d+(?:\.\d+)?)_([a-z]+)")


@pytest.fixture(autouse=True)
def _native_cpu_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN builds a primitive per new convolution shape; with the hundreds of small grouped
    convolutions of these networks that dominates CPU test time (seconds vs. tens of ms)."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


@cache
def _json(name: str) -> dict[str, Any]:
    path = reference_dir() / "edgenets" / name
    if not path.is_file():
        pytest.skip(f"no {path}; set REFERENCE_DIR to the official-implementation fixtures")
    return json.loads(path.read_text())


def classification_cases() -> list:
    path = reference_dir() / "edgenets" / "complexity.json"
    if not path.is_file():
        return [pytest.param(None, None, None, marks=pytest.mark.skip(reason=f"no {path}"))]
    data = json.loads(path.read_text())
    cases = [
        pytest.param(family, float(s), entry, id=f"{family}-{s}")
        for family, widths in data["classification_224x224_1000classes"].items()
        if family in CLASSIFIERS
        for s, entry in widths.items()
    ]
    for name, s in HYPOTHETICAL.items():
        entry = data["classification_hypothetical_configs"][name]
        cases.append(pytest.param(name.split("_")[0], s, entry, id=name))
    return cases


@pytest.mark.parametrize(("family", "scale", "entry"), classification_cases())
def test_classification_params_and_macs(family: str, scale: float, entry: dict) -> None:
    model = CLASSIFIERS[family](scale, num_classes=1000)
    assert count_params(model) == entry["params"] - entry.get("unused_params", 0)
    result = _measure_on_meta(model, (1, 3, 224, 224))
    official = entry["macs_all_conv_and_linear_M"] * 1e6
    assert abs(result.macs / official - 1) < 0.02, (result.macs, official)


def _measure_on_meta(model: torch.nn.Module, shape: Sequence[int]) -> Complexity:
    """MACs from shapes alone: the counter's formulas need no data, so the model runs on the meta
    device (its parameter count is taken before; meta tensors have no distinct storage)."""
    return measure(model.to("meta"), torch.zeros(tuple(shape), device="meta"))


def _check_layout(model: torch.nn.Module, shapes: dict[str, list[int]]) -> None:
    key_map, ignored = official_key_map(model)
    ours = model.state_dict()
    assert sorted(set(shapes) - set(ignored)) == sorted(key_map)
    assert sorted(target for target, _ in key_map.values()) == sorted(ours)
    wrong = {
        official: (shape, list(ours[key_map[official][0]].shape))
        for official, shape in shapes.items()
        if official in key_map and list(ours[key_map[official][0]].shape) != shape
    }
    assert not wrong


def test_classification_state_dict_layouts() -> None:
    entries = _json("state_dict_shapes.json")["classification_official_construction"]
    checked = 0
    for name, shapes in entries.items():
        match = NAME.match(name)
        if match is None or match.group(1) not in CLASSIFIERS:
            continue
        _check_layout(CLASSIFIERS[match.group(1)](float(match.group(2))), shapes)
        checked += 1
    assert checked >= 14


def test_segmentation_layouts_and_params() -> None:
    groups = _json("state_dict_shapes.json")["segmentation_weight_files"]
    complexity = _json("complexity.json")["segmentation_native_resolution"]
    for name, group in groups.items():
        family, scale, dataset = NAME.match(name).groups()
        model = SEGMENTATION[family](float(scale), CLASSES[dataset])
        _check_layout(model, group["shapes"])
        for resolution in group["resolutions_with_identical_shapes"]:
            entry = complexity.get(f"{name}_{resolution}")
            if entry is not None:
                assert count_params(model) == entry["params"] - entry.get("unused_params", 0)


@pytest.mark.parametrize(
    "name",
    ["dicenet_s_0.2_pascal_256x256", "dicenet_s_1.0_city_512x256", "espnetv2_s_1.0_pascal_256x256"],
)
def test_segmentation_macs(name: str) -> None:
    """Convolution MACs within 2% of the official conv MACs at the native resolution.

    The official counter counts neither resizing nor linear layers. DiCE resizes its height- and
    width-wise branches (e.g. 32 -> 28 at level 3 of a 256-pixel input) with small matrix
    products (export-friendly), which our counter does count (as ``mm``/``bmm``); the EPP's
    interpolations are not counted by either. So the totals differ for DiCENet by exactly those
    products, and the convolutions must agree."""
    entry = _json("complexity.json")["segmentation_native_resolution"][name]
    family, scale, dataset = NAME.match(name).groups()
    model = SEGMENTATION[family](float(scale), CLASSES[dataset])
    result = _measure_on_meta(model, entry["input_tensor_shape"])
    official = entry["conv_macs"]
    assert abs(result.macs_conv / official - 1) < 0.02, (result.macs_conv, official)
    resize = result.macs - result.macs_conv
    assert set(result.macs_by_op) <= {"convolution", "mm", "bmm"}
    assert (resize > 0) == (family == "dicenet")
