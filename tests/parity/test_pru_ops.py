"""PRU ops against the official implementation's outputs (fixtures in ``$REFERENCE_DIR/pru``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor

from src.compat.pru import context_from_official, pru_from_official, pyramidal_from_official
from tests.parity.reference import fixtures, load

GATE_ORDER = ("f", "g", "i", "o")
FLOAT32_TOL = 1e-5
FLOAT64_TOL = 1e-12


def stacked(gates: dict[str, Tensor]) -> Tensor:
    """The official dict of gate pre-activations, each (B, M), as (B, 4, M) in (f, g, i, o)."""
    return torch.stack([gates[name] for name in GATE_ORDER], dim=-2)


def max_error(a: Tensor, b: Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


@pytest.mark.parametrize("path", fixtures("pru", "pyramidal_*.pt"))
def test_pyramidal_transform(path: Path) -> None:
    data = load(path)
    module = pyramidal_from_official(data["state_dict"], data["config"]).eval()
    assert module.residual == data["config"]["residual_active"]
    assert list(module.level_out_features) == data["config"]["level_out_dims_per_gate"]
    assert sum(p.numel() for p in module.parameters()) == data["config"]["num_params"]
    x = data["input"].squeeze(1)  # official (B, 1, N), a dummy channel dim -> (B, N)
    with torch.no_grad():
        assert max_error(module(x), stacked(data["output"])) <= FLOAT32_TOL
        out64 = module.double()(x.double())
    assert max_error(out64, stacked(data["output_float64"])) <= FLOAT64_TOL


@pytest.mark.parametrize("path", fixtures("pru", "context_glt_*.pt"))
def test_context_transform(path: Path) -> None:
    data = load(path)
    module = context_from_official(data["state_dict"], data["config"]).eval()
    assert sum(p.numel() for p in module.parameters()) == data["config"]["num_params"]
    h = data["input"][0]  # official (1, B, M), the batch on dim 1 -> (B, M)
    with torch.no_grad():
        assert max_error(module(h), stacked(data["output"])) <= FLOAT32_TOL
        out64 = module.double()(h.double())
    assert max_error(out64, stacked(data["output_float64"])) <= FLOAT64_TOL


@pytest.mark.parametrize("path", fixtures("pru", "pru_*.pt"))
def test_pru_layer(path: Path) -> None:
    data = load(path)
    layer = pru_from_official(data["state_dict"], data["config"]).eval()
    assert sum(p.numel() for p in layer.parameters()) == data["config"]["num_params"]
    x, hx = data["input"], tuple(data["hidden_in"])  # (T, B, N); (h_0, c_0) each (1, B, M)
    with torch.no_grad():
        out, (h, c) = layer(x, hx)
        assert max_error(out, data["output"]) <= FLOAT32_TOL
        assert max_error(h, data["hidden_out"][0]) <= FLOAT32_TOL
        assert max_error(c, data["hidden_out"][1]) <= FLOAT32_TOL
        layer = layer.double()
        out, (h, c) = layer(x.double(), tuple(t.double() for t in hx))
    assert max_error(out, data["output_float64"]) <= FLOAT64_TOL
    assert max_error(h, data["hidden_out_float64"][0]) <= FLOAT64_TOL
    assert max_error(c, data["hidden_out_float64"][1]) <= FLOAT64_TOL


@pytest.mark.parametrize("path", fixtures("pru", "pru_*.pt"))
def test_pru_layer_batch_first(path: Path) -> None:
    data = load(path)
    time_major = pru_from_official(data["state_dict"], data["config"]).eval().double()
    batch_first = (
        pru_from_official(data["state_dict"], data["config"], batch_first=True).eval().double()
    )
    x, hx = data["input"].double(), tuple(t.double() for t in data["hidden_in"])
    with torch.no_grad():
        out, (h, c) = time_major(x, hx)
        out_bf, (h_bf, c_bf) = batch_first(x.transpose(0, 1), hx)  # (T, B, N) -> (B, T, N)
    assert max_error(out_bf.transpose(0, 1), out) <= FLOAT64_TOL
    assert max_error(h_bf, h) <= FLOAT64_TOL
    assert max_error(c_bf, c) <= FLOAT64_TOL
    assert max_error(out_bf.transpose(0, 1), data["output_float64"]) <= FLOAT64_TOL
