"""Official DeLighT parity: encoder and decoder layers built from the fixtures' config and weights.

Each fixture (README of the reference folder) holds the official layer's eval-mode output in
float32 and, from the same layer cast to float64 (softmax included), ``output_float64``. The
decoder fixtures with encoder attention also hold its probabilities, (T, B, S).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from src.compat.delight import (
    decoder_layer_from_official,
    encoder_layer_from_official,
    from_official,
)
from src.models.delight_block import DeLighTDecoderBlock, DeLighTEncoderBlock
from tests.parity.reference import fixtures, load

# measured: float64 ~2e-15, float32 ~1e-6
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
REFERENCE = {torch.float64: "output_float64", torch.float32: "output"}


def _check_structure(block: torch.nn.Module, config: dict) -> None:
    assert list(block.dextra.plan.groups) == config["dextra"]["groups_per_layer"]
    assert [(layer["in"], layer["out"]) for layer in config["dextra"]["glt_layers"]] == list(
        zip(block.dextra.plan.in_widths, block.dextra.plan.out_widths, strict=True)
    )
    assert block.normalize_before == config["normalize_before"]
    assert sum(p.numel() for p in block.parameters()) == config["num_params"]


def _cast(inputs: dict, dtype: torch.dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("path", fixtures("delight", "encoder_layer_*.pt"))
def test_encoder_layer_matches_official(path: Path, dtype: torch.dtype) -> None:
    data = load(path)
    block = encoder_layer_from_official(data["state_dict"], data["config"]).to(dtype).eval()
    _check_structure(block, data["config"])
    inputs = _cast(data["input"], dtype)
    with torch.no_grad():
        y = block(inputs["x"], inputs.get("encoder_padding_mask"))
    expected = data[REFERENCE[dtype]]
    assert y.dtype == dtype and y.shape == expected.shape
    assert (y - expected).abs().max().item() <= TOLERANCE[dtype]


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("path", fixtures("delight", "decoder_layer_*.pt"))
def test_decoder_layer_matches_official(path: Path, dtype: torch.dtype, need_weights: bool) -> None:
    """Both attention paths: the explicit one (with probabilities) and the fused kernel."""
    data = load(path)
    config = data["config"]
    block = decoder_layer_from_official(data["state_dict"], config).to(dtype).eval()
    assert block.cross_attention == (not config["no_encoder_attn"])
    _check_structure(block, config)
    inputs = _cast(data["input"], dtype)
    with torch.no_grad():
        y, weights = block(
            inputs["x"],
            inputs.get("encoder_out"),
            inputs.get("encoder_padding_mask"),
            self_attn_mask=inputs.get("self_attn_mask"),
            need_weights=need_weights,
        )
    expected = data[REFERENCE[dtype]]
    if isinstance(expected, dict):
        expected, expected_weights = expected["x"], expected["encoder_attn_weights"]
        if need_weights:
            assert weights.shape == expected_weights.shape  # (T, B, S)
            assert (weights - expected_weights).abs().max().item() <= TOLERANCE[dtype]
    if not need_weights or not block.cross_attention:
        assert weights is None
    assert y.dtype == dtype and y.shape == expected.shape
    assert (y - expected).abs().max().item() <= TOLERANCE[dtype]


@pytest.mark.parametrize("path", fixtures("delight", "decoder_layer_*.pt"))
def test_decoder_layer_defaults_to_the_causal_mask(path: Path) -> None:
    data = load(path)
    block = decoder_layer_from_official(data["state_dict"], data["config"]).double().eval()
    inputs = _cast(data["input"], torch.float64)
    with torch.no_grad():
        y, _ = block(inputs["x"], inputs.get("encoder_out"), inputs.get("encoder_padding_mask"))
    expected = data["output_float64"]
    expected = expected["x"] if isinstance(expected, dict) else expected
    assert (y - expected).abs().max().item() <= TOLERANCE[torch.float64]


@pytest.mark.parametrize(
    "path", fixtures("delight", "encoder_layer_*.pt") + fixtures("delight", "decoder_layer_*.pt")
)
def test_from_official_dispatches_layers(path: Path) -> None:
    data = load(path)
    expected = DeLighTEncoderBlock if path.name.startswith("encoder") else DeLighTDecoderBlock
    assert type(from_official(data["state_dict"], data["config"])) is expected


@pytest.mark.parametrize("path", fixtures("delight", "decoder_layer_*.pt"))
def test_every_official_tensor_is_consumed(path: Path) -> None:
    data = load(path)
    state_dict = dict(data["state_dict"], **{"self_attn.unused.weights": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"not mapped: \['self_attn.unused.weights'\]"):
        decoder_layer_from_official(state_dict, data["config"])
    state_dict = {k: v for k, v in data["state_dict"].items() if k != "fc1.bias"}
    with pytest.raises(ValueError, match="fc1.bias missing"):
        decoder_layer_from_official(state_dict, data["config"])
