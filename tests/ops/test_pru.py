from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor, nn

from src.ops.pru import PRU, GroupedContextTransform, PRUCell
from tests.helpers import autograd_node_names, require_cpu_kernels
from tests.parity.reference import reference_dir

PARAMS_JSON = reference_dir() / "pru" / "params.json"


def params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_context_transform_rearranges_group_blocks() -> None:
    """Gate q is the concatenation over groups j of block q of h_j @ W_j + b_j."""
    ctx = GroupedContextTransform(6, groups=3)
    h = torch.randn(5, 6)
    out = ctx(h)  # (5, 4, 6)
    per_group = [
        h_j @ w_j + b_j for h_j, w_j, b_j in zip(h.chunk(3, -1), ctx.glt.weight, ctx.glt.bias)
    ]
    expected = torch.stack(
        [torch.cat([y.chunk(4, -1)[q] for y in per_group], -1) for q in range(4)], 1
    )
    assert torch.allclose(out, expected, atol=1e-6)
    assert ctx(torch.randn(2, 3, 6)).shape == (2, 3, 4, 6)
    assert ctx(torch.randn(6)).shape == (4, 6)


def test_context_transform_errors() -> None:
    with pytest.raises(
        ValueError, match=r"hidden_size \(10\) must be positive and divisible by groups \(4\)"
    ):
        GroupedContextTransform(10, groups=4)
    with pytest.raises(ValueError, match=r"expected 8 context features, got shape \(2, 6\)"):
        GroupedContextTransform(8, groups=2)(torch.randn(2, 6))


def test_cell_and_layer_agree() -> None:
    """The layer's loop (pyramid precomputed, GLT as a strided view) is the cell step by step."""
    torch.manual_seed(0)
    layer = PRU(6, 8, groups=2, levels=2).double()
    cell = layer.cells[0]
    x = torch.randn(4, 3, 6, dtype=torch.float64)
    h0, c0 = torch.randn(1, 3, 8, dtype=torch.float64), torch.randn(1, 3, 8, dtype=torch.float64)
    out, (h_n, c_n) = layer(x, (h0, c0))
    h, c = h0[0], c0[0]
    for t in range(4):
        h, c = cell(x[t], (h, c))
        assert torch.allclose(out[t], h, atol=1e-12)
    assert torch.allclose(h_n[0], h, atol=1e-12) and torch.allclose(c_n[0], c, atol=1e-12)
    assert cell(x[0])[0].shape == (3, 8)  # zero state by default
    assert cell(x[0, 0])[0].shape == (8,)


def test_layer_gathers_the_step_gradients_once() -> None:
    """The pyramid output's per-step gradients are gathered by one node over all T steps: an index
    per step would each write a zero-filled gradient of all T steps (quadratic in T)."""
    layer = PRU(6, 8, groups=2, impl="reference")
    out, _ = layer(torch.randn(5, 3, 6, requires_grad=True))
    kinds = autograd_node_names(out)
    assert "SelectBackward0" not in kinds
    assert kinds.count("UnbindBackward0") == 5 + 1  # each step's gate split, and the steps


def test_layer_runs_the_recurrence_in_one_node_on_the_cpu() -> None:
    require_cpu_kernels()
    out, _ = PRU(6, 8, groups=2)(torch.randn(5, 3, 6, requires_grad=True))
    kinds = autograd_node_names(out)
    assert kinds.count("PRURecurrenceCpuBackward") == 1 and "UnbindBackward0" not in kinds


def test_layer_shapes_and_state() -> None:
    layer = PRU(6, 8, num_layers=3, groups=4, levels=3)
    out, (h, c) = layer(torch.randn(5, 2, 6))
    assert out.shape == (5, 2, 8) and h.shape == c.shape == (3, 2, 8)
    assert torch.equal(out[-1], h[-1])
    out2, _ = layer(torch.randn(5, 2, 6), (h, c))
    assert out2.shape == (5, 2, 8)
    unbatched, (h1, c1) = layer(torch.randn(5, 6))
    assert unbatched.shape == (5, 8) and h1.shape == c1.shape == (3, 8)
    no_bias = PRU(6, 8, groups=2, bias=False)
    assert all(p.dim() > 1 for p in no_bias.parameters())
    assert no_bias(torch.randn(5, 2, 6))[0].shape == (5, 2, 8)
    batch_first = PRU(6, 8, num_layers=2, batch_first=True)
    out, (h, _) = batch_first(torch.randn(2, 5, 6))
    assert out.shape == (2, 5, 8) and h.shape == (2, 2, 8)


def test_dropout_between_layers_only() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 2, 6)
    single = PRU(6, 8, dropout=0.5).train()
    assert torch.equal(single(x)[0], single(x)[0])  # nothing to drop with one layer
    stacked = PRU(6, 8, num_layers=2, dropout=0.5)
    assert not torch.equal(stacked.train()(x)[0], stacked(x)[0])
    assert torch.equal(stacked.eval()(x)[0], stacked(x)[0])


def test_layer_errors() -> None:
    with pytest.raises(ValueError, match="num_layers must be positive, got 0"):
        PRU(6, 8, num_layers=0)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\], got 1.5"):
        PRU(6, 8, dropout=1.5)
    with pytest.raises(ValueError, match=r"got shape \(5, 2, 7\)"):
        PRU(6, 8)(torch.randn(5, 2, 7))
    state = torch.zeros(1, 3, 8)
    with pytest.raises(
        ValueError, match=r"expected h_0 and c_0 of shape \(2, 3, 8\), got \(1, 3, 8\)"
    ):
        PRU(6, 8, num_layers=2)(torch.randn(5, 3, 6), (state, state))


@pytest.mark.parametrize("residual", [False, True])
def test_lstm_equivalence_only_without_residual(residual: bool) -> None:
    """g = K = 1 is an LSTM (gates re-ordered, weights transposed) unless N == M (residual)."""
    torch.manual_seed(0)
    n, m = (8, 8) if residual else (5, 8)
    pru = PRU(n, m, groups=1, levels=1).double()
    lstm = nn.LSTM(n, m).double()
    cell = pru.cells[0]
    # official order (f, g, i, o) -> nn.LSTM's (i, f, g, o)
    order = torch.tensor([2, 0, 1, 3])
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(
            cell.pyramid.transforms[0].weight.view(4, m, n)[order].reshape(4 * m, n)
        )
        lstm.bias_ih_l0.copy_(cell.pyramid.transforms[0].bias.view(4, m)[order].reshape(4 * m))
        lstm.weight_hh_l0.copy_(
            cell.context.glt.weight[0].t().reshape(4, m, m)[order].reshape(4 * m, m)
        )
        lstm.bias_hh_l0.copy_(cell.context.glt.bias[0].view(4, m)[order].reshape(4 * m))
    assert params(pru) == params(lstm)
    x = torch.randn(6, 2, n, dtype=torch.float64)
    state = (torch.randn(1, 2, m, dtype=torch.float64), torch.randn(1, 2, m, dtype=torch.float64))
    out, (h, c) = pru(x, state)
    out_lstm, (h_lstm, c_lstm) = lstm(x, state)
    assert torch.allclose(out, out_lstm, atol=1e-12) != residual
    assert torch.allclose(c, c_lstm, atol=1e-12) != residual


def _gradcheck_module(module: nn.Module, *inputs: Tensor) -> None:
    names = [name for name, _ in module.named_parameters()]

    def run(*args: Tensor) -> Tensor | tuple[Tensor, ...]:
        values = dict(zip(names, args[len(inputs) :]))
        return torch.func.functional_call(module, values, args[: len(inputs)])

    assert torch.autograd.gradcheck(run, (*inputs, *module.parameters()), fast_mode=True)


def test_gradcheck_context_transform() -> None:
    torch.manual_seed(0)
    ctx = GroupedContextTransform(4, groups=2).double()
    _gradcheck_module(ctx, torch.randn(3, 4, dtype=torch.float64, requires_grad=True))


def test_gradcheck_cell() -> None:
    torch.manual_seed(0)
    cell = PRUCell(3, 4, groups=2, levels=2).double()
    x, h, c = (torch.randn(2, d, dtype=torch.float64, requires_grad=True) for d in (3, 4, 4))

    def step(x: Tensor, h: Tensor, c: Tensor, *values: Tensor) -> tuple[Tensor, Tensor]:
        names = [name for name, _ in cell.named_parameters()]
        return torch.func.functional_call(cell, dict(zip(names, values)), (x, (h, c)))

    assert torch.autograd.gradcheck(step, (x, h, c, *cell.parameters()), fast_mode=True)


def test_gradcheck_layer() -> None:
    torch.manual_seed(0)
    layer = PRU(3, 4, num_layers=2, groups=2).double()
    x = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    state = tuple(torch.randn(2, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))

    def run(x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out, (h_n, c_n) = layer(x, (h, c))
        return out, h_n, c_n

    assert torch.autograd.gradcheck(run, (x, *state), fast_mode=True)


def _official_rows() -> list:
    if not PARAMS_JSON.is_file():
        return [
            pytest.param(
                None, marks=pytest.mark.skip(reason=f"no {PARAMS_JSON}; set REFERENCE_DIR")
            )
        ]
    rows = json.loads(PARAMS_JSON.read_text())["rows"]
    return [
        pytest.param(row, id=f"{row['dataset']}-{row['model'].split()[0]}-M{row['M(hidden)']}")
        for row in rows
    ]


@pytest.mark.parametrize("row", _official_rows())
def test_param_counts_match_thesis_table_4_1(row: dict) -> None:
    """Official RNNModel counts: tied embedding V x emsize, decoder bias V, and the layers
    400 -> M, M -> M, M -> 400.

    LSTM rows are checked with PRU g = K = 1, which has the LSTM's parameters (the residual has
    none).
    """
    hidden, emsize, vocab = row["M(hidden)"], row["emsize"], row["vocab"]
    is_lstm = row["model"] == "LSTM"
    groups, levels = (1, 1) if is_lstm else (row["g"], row["K"])
    sizes = [emsize] + [hidden] * (row["layers"] - 1) + [emsize]
    with torch.device("meta"):  # counts only: no memory, no initialisation
        cells = [PRUCell(n, m, groups=groups, levels=levels) for n, m in zip(sizes[:-1], sizes[1:])]
    layer_counts = [params(cell) for cell in cells]
    assert layer_counts == [row["breakdown"][f"rnn_layer_{i}"] for i in range(row["layers"])]
    assert vocab * emsize + vocab + sum(layer_counts) == row["total_params"]


def test_param_counts_thesis_table_4_2() -> None:
    """One 600 -> 600 layer: the code has 2,704,800 PRU parameters, the thesis prints 2.5 M."""
    if not PARAMS_JSON.is_file():
        pytest.skip(f"no {PARAMS_JSON}; set REFERENCE_DIR")
    rows = {
        row["row"].split()[0]: row
        for row in json.loads(PARAMS_JSON.read_text())["thesis_table_4_2_single_layer_600"]
    }
    with torch.device("meta"):
        assert params(PRUCell(600, 600, groups=1, levels=1)) == rows["R1"]["recurrent_unit_params"]
        assert params(PRUCell(600, 600, groups=1, levels=2)) == rows["R4"]["recurrent_unit_params"]
