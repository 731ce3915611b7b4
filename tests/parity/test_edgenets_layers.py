"""Every EdgeNets layer fixture (DiCE, StridedDICE, the DiCENet unit, EESP, the down-sampler):
build our op from the official constructor arguments, load the official weights, and match the
official eval-mode output within 1e-5 (float32), through each inference path: the modules as
defined (autograd on), and the folded path with DiCE and the EESP pyramid in the fused C++
kernels or in eager calls."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from src.compat.edgenets import from_official
from tests.helpers import use_inference_path
from tests.parity.reference import fixtures, load

LAYERS = fixtures("edgenets", "layers/*.pt")


@pytest.mark.parametrize("inference", ["as_defined", "kernel", "eager"])
@pytest.mark.parametrize("path", LAYERS)
def test_layer_matches_official(
    path: Path, inference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixture = load(path)
    config = {**fixture["config"], "layer": fixture["layer"]}
    module = from_official(fixture["state_dict"], config).eval()
    inputs = [fixture["input"]] + ([fixture["input2"]] if "input2" in fixture else [])
    if inference != "as_defined":
        use_inference_path(inference, monkeypatch)
    with torch.set_grad_enabled(inference == "as_defined"):
        out = module(*inputs).detach()
    expected = fixture["output"]
    assert out.shape == expected.shape
    error = (out - expected).abs().max().item()
    assert error <= 1e-5, f"{fixture['name']}: max abs error {error:.3g}"


@pytest.mark.parametrize("path", LAYERS)
def test_converter_lists_missing_and_unexpected_keys(path: Path) -> None:
    fixture = load(path)
    state_dict = dict(fixture["state_dict"])
    dropped = next(iter(state_dict))
    del state_dict[dropped]
    state_dict["not_an_official.weight"] = torch.zeros(1)
    config = {**fixture["config"], "layer": fixture["layer"]}
    with pytest.raises(KeyError) as info:
        from_official(state_dict, config)
    assert dropped in str(info.value) and "not_an_official.weight" in str(info.value)


def test_unknown_layer_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown official layer 'nn_layers.nope'"):
        from_official({}, {"layer": "nn_layers.nope"})
