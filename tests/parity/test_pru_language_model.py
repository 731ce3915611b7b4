"""The AWD language model on official ``RNNModel`` state dicts (github.com/sacmehta/PRU).

The fixtures (``$REFERENCE_DIR/pru/pru_*.pt``) hold single official PRU layers. Each is placed in
an official-layout state dict of a 3-layer model (layer 0, or layer 1, the M -> M one, when the
fixture's input and hidden sizes are equal), the other entries random; the state dict must load
strictly (:func:`src.compat.pru.load_official`) and the model's own layer must reproduce the
fixture.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.compat.pru import load_official, pru_from_official
from src.models.awd_lm import AWDLanguageModel
from tests.parity.reference import fixtures, load

FLOAT32_TOL = 1e-5
FLOAT64_TOL = 1e-12
VOCAB = 23
EMBEDDING_DIM = 32  # when the fixture's layer is the middle one
GATES = 4


def max_error(a: Tensor, b: Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def random_official_pru_layer(
    prefix: str, n: int, m: int, groups: int, levels: int, generator: torch.Generator
) -> dict[str, Tensor]:
    """An official PRU layer's tensors, random: level k maps ceil(n / 2^k) inputs to
    4 ceil(m / 2^(k+1)) outputs (level 0 also the remainder); the GLT is (g, m/g, 4m/g)."""
    widths = [math.ceil(m / 2 ** (k + 1)) for k in range(levels)]
    widths[0] += m - sum(widths)
    state = {}
    for k, width in enumerate(widths):
        shape = (GATES * width, math.ceil(n / 2**k))
        state[f"{prefix}pt.pyramid.{k}.weight"] = torch.randn(shape, generator=generator) * 0.2
        state[f"{prefix}pt.pyramid.{k}.bias"] = torch.randn(GATES * width, generator=generator)
    width = m // groups
    glt_shape = (groups, width, GATES * width)
    state[f"{prefix}glt.W"] = torch.randn(glt_shape, generator=generator) * 0.2
    state[f"{prefix}glt.bias"] = torch.randn(groups, GATES * width, generator=generator)
    return state


def official_model_with(data: dict) -> tuple[dict[str, Tensor], int, dict]:
    """An official 3-layer RNNModel state dict holding the fixture's layer, that layer's index,
    and the AWDLanguageModel arguments of the same model."""
    config = data["config"]
    n, m, groups, levels = (config[key] for key in ("input_size", "hidden_size", "groups", "K"))
    index = 1 if n == m else 0
    embedding_dim = EMBEDDING_DIM if n == m else n
    sizes = [(embedding_dim, m), (m, m), (m, embedding_dim)]
    generator = torch.Generator().manual_seed(0)
    encoder = torch.rand(VOCAB, embedding_dim, generator=generator) * 0.2 - 0.1
    state = {
        "encoder.weight": encoder,
        "decoder.weight": encoder,  # tied
        "decoder.bias": torch.randn(VOCAB, generator=generator),
    }
    for layer, (n_l, m_l) in enumerate(sizes):
        prefix = f"rnns.{layer}."
        if layer == index:
            state.update({prefix + key: value for key, value in data["state_dict"].items()})
        else:
            state.update(random_official_pru_layer(prefix, n_l, m_l, groups, levels, generator))
    arguments = dict(
        rnn="pru",
        embedding_dim=embedding_dim,
        hidden_size=m,
        num_layers=3,
        groups=groups,
        levels=levels,
    )
    return state, index, arguments


def converted_model(data: dict) -> tuple[AWDLanguageModel, dict[str, Tensor], int]:
    state, index, arguments = official_model_with(data)
    model = AWDLanguageModel(VOCAB, **arguments)
    load_official(model, state)
    return model.eval(), state, index


@pytest.mark.parametrize("path", fixtures("pru", "pru_*.pt"))
def test_model_layer_reproduces_the_official_layer(path: Path) -> None:
    data = load(path)
    model, _, index = converted_model(data)
    layer = model.rnns[index]
    assert sum(p.numel() for p in layer.parameters()) == data["config"]["num_params"]
    x = data["input"].transpose(0, 1)  # official (T, B, N) -> (B, T, N)
    hx = tuple(data["hidden_in"])  # (h_0, c_0), each (1, B, M) as in the official code
    with torch.no_grad():
        out, (h, c) = layer(x, hx)
        assert max_error(out.transpose(0, 1), data["output"]) <= FLOAT32_TOL
        assert max_error(h, data["hidden_out"][0]) <= FLOAT32_TOL
        assert max_error(c, data["hidden_out"][1]) <= FLOAT32_TOL
        model.double()
        out, (h, c) = layer(x.double(), tuple(t.double() for t in hx))
    assert max_error(out.transpose(0, 1), data["output_float64"]) <= FLOAT64_TOL
    assert max_error(h, data["hidden_out_float64"][0]) <= FLOAT64_TOL
    assert max_error(c, data["hidden_out_float64"][1]) <= FLOAT64_TOL


@pytest.mark.parametrize("path", fixtures("pru", "pru_*.pt"))
def test_model_is_embedding_layers_decoder(path: Path) -> None:
    """The converted model (eval) against the official layers loaded one by one and composed."""
    data = load(path)
    model, state, _ = converted_model(data)
    model.double()
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(tokens)
        x = F.embedding(tokens, state["encoder.weight"].double()).transpose(0, 1)  # (T, B, E)
        for layer in range(3):
            prefix = f"rnns.{layer}."
            own = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
            x, _ = pru_from_official(own, {}).double()(x)  # zero initial state
        x = x.transpose(0, 1)  # (B, T, E)
        logits = F.linear(x, state["decoder.weight"].double(), state["decoder.bias"].double())
    assert max_error(out.raw_output, x) <= FLOAT64_TOL
    assert max_error(out.logits, logits) <= FLOAT64_TOL


def test_lstm_model_from_official_layout() -> None:
    """The official LSTM RNNModel's names are nn.LSTM's: the converted model is the composition."""
    torch.manual_seed(0)
    sizes = [(8, 12), (12, 12), (12, 8)]
    layers = [nn.LSTM(n, m, 1).double() for n, m in sizes]  # official: time-major
    encoder = torch.rand(VOCAB, 8, dtype=torch.float64) * 0.2 - 0.1
    state = {"encoder.weight": encoder, "decoder.weight": encoder}
    state["decoder.bias"] = torch.randn(VOCAB, dtype=torch.float64)
    for index, lstm in enumerate(layers):
        state.update({f"rnns.{index}.{k}": v for k, v in lstm.state_dict().items()})
    model = AWDLanguageModel(VOCAB, rnn="lstm", embedding_dim=8, hidden_size=12).double()
    load_official(model, state)
    tokens = torch.randint(0, VOCAB, (3, 5))
    with torch.no_grad():
        out = model.eval()(tokens)
        x = F.embedding(tokens, encoder).transpose(0, 1)  # (T, B, E)
        for lstm in layers:
            x, _ = lstm(x)
        logits = F.linear(x.transpose(0, 1), encoder, state["decoder.bias"])
    assert max_error(out.logits, logits) <= FLOAT64_TOL
