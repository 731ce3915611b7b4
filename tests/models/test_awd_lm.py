from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.compat.pru import load_official
from src.models.awd_lm import AWDLanguageModel, AWDOutput
from src.utils.complexity import count_params
from tests.parity.reference import reference_dir

V, E, M = 50, 16, 32
NO_DROPOUT = dict(
    dropout=0.0, dropout_hidden=0.0, dropout_input=0.0, dropout_embedding=0.0, weight_drop=0.0
)

# (rnn, g, K, M) -> total parameters of the official RNNModel (emsize 400, 3 layers, tied) on PTB
# (V = 10,000) and WikiText-2 (V = 33,278); thesis Table 4.1 prints them rounded to millions
OFFICIAL_COUNTS = {
    ("lstm", 1, 1, 1000): (19_869_200, 29_203_678),
    ("lstm", 1, 1, 1200): (25_792_400, 35_126_878),
    ("lstm", 1, 1, 1400): (32_675_600, 42_010_078),
    ("pru", 1, 2, 1000): (18_969_200, 28_303_678),
    ("pru", 2, 2, 1200): (18_512_400, 27_846_878),
    ("pru", 4, 2, 1400): (18_895_600, 28_230_078),
}
VOCAB = {"PTB": 10_000, "WT2": 33_278}


def small(rnn: str, **kwargs) -> AWDLanguageModel:
    options = dict(rnn=rnn, embedding_dim=E, hidden_size=M, num_layers=3, groups=4, levels=2)
    return AWDLanguageModel(V, **{**options, **kwargs})


def on_meta(
    num_embeddings: int, rnn: str, groups: int, levels: int, hidden: int
) -> AWDLanguageModel:
    """The official configuration (emsize 400, 3 layers, tied), built without allocating."""
    with torch.device("meta"):
        return AWDLanguageModel(
            num_embeddings,
            rnn=rnn,
            groups=groups,
            levels=levels,
            hidden_size=hidden,
            embedding_dim=400,
            num_layers=3,
        )


def inputs_of(module: nn.Module) -> list[Tensor]:
    """A list that a forward pre-hook fills with the module's first input on every call."""
    seen: list[Tensor] = []
    module.register_forward_pre_hook(lambda _, args: seen.append(args[0].detach().clone()))
    return seen


@pytest.mark.parametrize("rnn", ["pru", "lstm"])
@pytest.mark.parametrize("tie_weights", [True, False])
def test_shapes(rnn: str, tie_weights: bool) -> None:
    model = small(rnn, tie_weights=tie_weights)
    last = E if tie_weights else M
    assert model.layer_sizes == ((E, M), (M, M), (M, last))
    out = model(torch.randint(0, V, (3, 7)))
    assert isinstance(out, AWDOutput)
    assert out.logits.shape == (3, 7, V)
    assert out.raw_output.shape == out.dropped_output.shape == (3, 7, last)
    assert [tuple(t.shape) for h in out.hidden for t in h] == [
        (1, 3, M),
        (1, 3, M),
        (1, 3, M),
        (1, 3, M),
        (1, 3, last),
        (1, 3, last),
    ]
    assert [tuple(t.shape) for h in model.init_hidden(3) for t in h] == [
        (1, 3, M),
        (1, 3, M),
        (1, 3, M),
        (1, 3, M),
        (1, 3, last),
        (1, 3, last),
    ]
    assert (model.decoder.weight is model.embedding.weight) == tie_weights


@pytest.mark.parametrize("rnn", ["pru", "lstm"])
def test_carried_hidden_equals_one_long_sequence(rnn: str) -> None:
    torch.manual_seed(0)
    model = small(rnn).double().eval()
    tokens = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        whole = model(tokens)
        first = model(tokens[:, :4])
        second = model(tokens[:, 4:], first.hidden)
    logits = torch.cat([first.logits, second.logits], dim=1)
    assert torch.allclose(logits, whole.logits, atol=1e-12)
    for (h, c), (h_ref, c_ref) in zip(second.hidden, whole.hidden):
        assert torch.allclose(h, h_ref, atol=1e-12) and torch.allclose(c, c_ref, atol=1e-12)
    with torch.no_grad():  # hidden=None is the zero state
        assert torch.equal(model(tokens, model.init_hidden(2)).logits, whole.logits)


@pytest.mark.parametrize("rnn", ["pru", "lstm"])
def test_eval_is_deterministic_and_training_is_not(rnn: str) -> None:
    torch.manual_seed(0)
    model = small(rnn)
    tokens = torch.randint(0, V, (2, 6))
    with torch.no_grad():
        assert not torch.allclose(model(tokens).logits, model(tokens).logits)
        model.eval()
        assert torch.equal(model(tokens).logits, model(tokens).logits)
        assert torch.equal(model(tokens).raw_output, model(tokens).dropped_output)


@pytest.mark.parametrize("variational", [True, False])
def test_locked_masks_are_constant_over_time(variational: bool) -> None:
    torch.manual_seed(0)
    halves = dict(dropout=0.5, dropout_hidden=0.5, dropout_input=0.5)
    model = small("pru", **{**NO_DROPOUT, **halves, "variational": variational})
    layer_inputs = [inputs_of(rnn) for rnn in model.rnns]
    tokens = torch.full((4, 12), 3)  # one word: the embedding output is the same at every step
    with torch.no_grad():
        out = model(tokens)
    embedded = model.embedding.weight[3].detach()
    mask_input = layer_inputs[0][0] / embedded  # (B, T, E)
    kept_hidden = layer_inputs[1][0] != 0  # (B, T, M), the first layer's output is never 0
    kept_output = out.dropped_output != 0
    assert torch.allclose(out.dropped_output[kept_output], out.raw_output[kept_output] / 0.5)
    for mask in (mask_input != 0, kept_hidden, kept_output):
        assert 0.3 < mask.float().mean().item() < 0.7
        constant = torch.equal(mask, mask[:, :1].expand_as(mask))
        assert constant == variational
    assert torch.allclose(mask_input[mask_input != 0], torch.tensor(2.0))


def test_embedding_dropout_zeroes_whole_rows() -> None:
    torch.manual_seed(0)
    model = small("lstm", **{**NO_DROPOUT, "dropout_embedding": 0.5})
    seen = inputs_of(model.rnns[0])
    tokens = torch.arange(V).repeat(2, 2)  # every word four times in the batch
    with torch.no_grad():
        model(tokens)
    x, weight = seen[0], model.embedding.weight.detach()
    dropped = (x == 0).all(dim=-1)  # (B, T)
    assert 0.3 < dropped.float().mean().item() < 0.7
    for word in range(V):
        where = tokens == word
        assert dropped[where].all() or not dropped[where].any()  # a word is dropped everywhere
        if not dropped[where].any():
            assert torch.allclose(x[where], weight[word] / 0.5)
    model.eval()
    with torch.no_grad():
        model(tokens)
    assert torch.equal(seen[1], F.embedding(tokens, weight))


@pytest.mark.parametrize(
    ("rnn", "name"), [("lstm", "weight_hh_l0"), ("pru", "cells.0.context.glt.weight")]
)
def test_weight_drop_reaches_the_recurrent_weight(rnn: str, name: str) -> None:
    torch.manual_seed(0)
    model = small(rnn, **{**NO_DROPOUT, "weight_drop": 0.5})
    tokens = torch.randint(0, V, (2, 6))
    first, second = model(tokens), model(tokens)
    assert not torch.allclose(first.logits, second.logits)
    first.logits.sum().backward()
    for rnn_layer in model.rnns:
        weight = rnn_layer.get_parameter(name)
        assert isinstance(weight, nn.Parameter) and weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, model(tokens).logits)


@pytest.mark.parametrize("rnn", ["pru", "lstm"])
def test_gradients_reach_every_parameter(rnn: str) -> None:
    torch.manual_seed(0)
    probabilities = dict(
        dropout=0.1, dropout_hidden=0.1, dropout_input=0.1, dropout_embedding=0.1, weight_drop=0.2
    )
    model = small(rnn, **probabilities)
    tokens = torch.randint(0, V, (3, 5))
    out = model(tokens)
    F.cross_entropy(out.logits.flatten(0, 1), tokens.flatten()).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_official_initialisation() -> None:
    torch.manual_seed(0)
    model = small("pru")
    assert model.embedding.weight.abs().max() <= 0.1
    assert torch.equal(model.decoder.bias, torch.zeros(V))
    cell = model.rnns[1].cells[0]
    for linear in cell.pyramid.transforms:
        w = linear.weight  # (4 m_k, n_k), orthogonal columns or rows
        small_side = min(w.shape)
        gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
        assert torch.allclose(gram, torch.eye(small_side), atol=1e-5)
        assert torch.equal(linear.bias, torch.zeros_like(linear.bias))
    glt = cell.context.glt.weight.flatten(1)  # (g, M/g * 4M/g): orthogonal rows
    assert torch.allclose(glt @ glt.T, torch.eye(4), atol=1e-5)
    assert cell.context.glt.bias.abs().sum() == 0


def test_parameter_counts_written_here() -> None:
    for (rnn, g, k, hidden), counts in OFFICIAL_COUNTS.items():
        for vocab, expected in zip(VOCAB.values(), counts):
            assert count_params(on_meta(vocab, rnn, g, k, hidden)) == expected, (rnn, g, k, hidden)


def official_rows() -> list:
    path = reference_dir() / "pru" / "params.json"
    if not path.is_file():
        reason = f"no {path}; set REFERENCE_DIR to the folder holding pru/params.json"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    rows = json.loads(path.read_text())["rows"]
    return [pytest.param(row, id=f"{row['dataset']}-{row_name(row)}") for row in rows]


def row_name(row: dict) -> str:
    if row["model"] == "LSTM":
        return f"lstm-M{row['M(hidden)']}"
    return f"pru-g{row['g']}-K{row['K']}-M{row['M(hidden)']}"


@pytest.mark.parametrize("row", official_rows())
def test_parameter_counts_equal_the_official_ones(row: dict) -> None:
    lstm = row["model"] == "LSTM"
    assert row["emsize"] == 400 and row["layers"] == 3
    rnn, groups, levels = ("lstm", 1, 1) if lstm else ("pru", row["g"], row["K"])
    model = on_meta(row["vocab"], rnn, groups, levels, row["M(hidden)"])
    assert count_params(model) == row["total_params"]
    breakdown = row["breakdown"]
    assert model.embedding.weight.numel() == breakdown["embedding(tied with decoder.weight)"]
    assert model.decoder.bias.numel() == breakdown["decoder.bias"]
    for layer, rnn in enumerate(model.rnns):
        assert count_params(rnn) == breakdown[f"rnn_layer_{layer}"]
    for layer, shapes in enumerate(row.get("pyramid_per_layer", [])):
        cell = model.rnns[layer].cells[0]
        assert list(cell.pyramid.level_in_features) == shapes["level_in_dims"]
        assert list(cell.pyramid.level_out_features) == shapes["level_out_dims_per_gate"]
        assert cell.pyramid.residual == shapes["residual_active"]
        assert list(cell.context.glt.weight.shape) == shapes["glt_W_shape"]


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match=r"rnn must be one of \('pru', 'lstm'\), got 'gru'"):
        AWDLanguageModel(V, rnn="gru")
    with pytest.raises(ValueError, match=r"weight_drop must be in \[0, 1\), got 1.0"):
        AWDLanguageModel(V, weight_drop=1.0, embedding_dim=8, hidden_size=8)
    with pytest.raises(ValueError, match="must be positive"):
        AWDLanguageModel(V, num_layers=0)
    model = small("lstm")
    with pytest.raises(ValueError, match=r"expected tokens \(B, T\), got shape \(4,\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"expected 3 \(h, c\) pairs, got 2"):
        model(torch.zeros(1, 4, dtype=torch.long), model.init_hidden(1)[:2])


def official_names(key: str) -> str:
    """This model's name of a tensor -> the official ``RNNModel``'s (github.com/sacmehta/PRU)."""
    key = key.replace("embedding.weight", "encoder.weight")
    key = key.replace("cells.0.pyramid.transforms.", "pt.pyramid.")
    return key.replace("cells.0.context.glt.weight", "glt.W").replace(
        "cells.0.context.glt.", "glt."
    )


@pytest.mark.parametrize("rnn", ["pru", "lstm"])
def test_official_names_load_and_unknown_keys_are_refused(rnn: str) -> None:
    torch.manual_seed(0)
    source = AWDLanguageModel(V, rnn=rnn, embedding_dim=E, hidden_size=M, num_layers=3, groups=2)
    official = {official_names(k): v.clone() for k, v in source.state_dict().items()}
    assert "encoder.weight" in official and "decoder.bias" in official
    if rnn == "pru":
        assert {"rnns.0.glt.W", "rnns.2.pt.pyramid.1.bias"} <= official.keys()
    else:
        assert "rnns.1.weight_hh_l0" in official
    model = AWDLanguageModel(V, rnn=rnn, embedding_dim=E, hidden_size=M, num_layers=3, groups=2)
    load_official(model, official)
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    bad = dict(official, **{"rnns.0.module.weight_hh_l0_raw": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"'rnns.0.module.weight_hh_l0_raw' is not a parameter"):
        load_official(model, bad)
    with pytest.raises(KeyError, match=r"missing \['decoder.bias'\]"):
        load_official(model, {k: v for k, v in official.items() if k != "decoder.bias"})


def test_table_4_2_options_reach_the_pyramids() -> None:
    """One 600-wide layer (thesis Table 4.2): the equal split and the residual switch."""

    def unit(**kwargs) -> AWDLanguageModel:
        with torch.device("meta"):
            return AWDLanguageModel(
                10_000, rnn="pru", embedding_dim=600, hidden_size=600, num_layers=1, groups=1,
                levels=2, **kwargs,
            )  # fmt: skip

    official, paper = unit(), unit(pyramid_split="paper")
    assert count_params(official.rnns) == 2_704_800  # the code's split (3M/4 + M/4)
    assert count_params(paper.rnns) == 2_524_800  # thesis: 2.5 M
    assert official.rnns[0].cells[0].pyramid.residual  # N == M
    assert not unit(residual=False).rnns[0].cells[0].pyramid.residual
    # in a 3-layer model only the middle layer (M -> M) has a residual; False removes it there
    three = small("pru", residual=False, **NO_DROPOUT)
    assert [rnn.cells[0].pyramid.residual for rnn in three.rnns] == [False, False, False]
    default = small("pru", **NO_DROPOUT)
    assert [rnn.cells[0].pyramid.residual for rnn in default.rnns] == [False, True, False]
