from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.ops.awd_dropout import call_with_weight_drop, embedding_dropout, locked_dropout
from src.ops.pru import PRU


class WeightProbe(nn.Module):
    """Returns the weight it sees, so a test can read what DropConnect handed it."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(rows, cols))

    def forward(self, scale: Tensor) -> Tensor:
        return self.weight * scale


def test_locked_dropout_shares_the_mask_over_time() -> None:
    torch.manual_seed(0)
    mask = locked_dropout(torch.ones(4, 7, 2000), 0.3, training=True)  # (B, T, C)
    assert torch.equal(mask, mask[:, :1].expand_as(mask))
    assert torch.allclose(mask[:, 0].unique(), torch.tensor([0.0, 1 / 0.7]))
    assert (mask[:, 0] == 0).float().mean().item() == pytest.approx(0.3, abs=0.02)
    x = torch.randn(4, 7, 2000)
    torch.manual_seed(1)
    same_mask = locked_dropout(torch.ones(4, 7, 2000), 0.3, training=True)
    torch.manual_seed(1)
    assert torch.equal(locked_dropout(x, 0.3, training=True), x * same_mask)
    assert torch.equal(locked_dropout(x, 0.3, training=False), x)
    assert torch.equal(locked_dropout(x, 0.0, training=True), x)
    # any leading dims: the time axis is dim -2
    assert locked_dropout(torch.randn(2, 3, 5, 6), 0.5, training=True).shape == (2, 3, 5, 6)


def test_embedding_dropout_drops_whole_rows() -> None:
    torch.manual_seed(0)
    weight = torch.randn(3000, 8, requires_grad=True)
    dropped = embedding_dropout(weight, 0.25, training=True)
    zero_rows = (dropped == 0).all(dim=1)
    kept = ~zero_rows
    assert torch.allclose(dropped[kept], weight[kept] / 0.75)
    assert zero_rows.float().mean().item() == pytest.approx(0.25, abs=0.03)
    dropped.sum().backward()
    assert torch.allclose(weight.grad, kept.float().unsqueeze(1).expand(-1, 8) / 0.75)
    assert embedding_dropout(weight, 0.25, training=False) is weight
    tokens = torch.tensor([[1, 2, 1]])
    looked_up = F.embedding(tokens, embedding_dropout(weight, 0.5, training=True))
    assert torch.equal(looked_up[0, 0], looked_up[0, 2])  # one decision per word


def test_weight_drop_zeroes_and_scales_the_used_weight() -> None:
    torch.manual_seed(0)
    probe = WeightProbe(300, 200)
    raw = probe.weight
    used = call_with_weight_drop(probe, ["weight"], 0.4, torch.tensor(1.0))
    dropped = used == 0
    assert dropped.float().mean().item() == pytest.approx(0.4, abs=0.01)
    assert torch.allclose(used[~dropped], raw[~dropped] / 0.6)
    again = call_with_weight_drop(probe, ["weight"], 0.4, torch.tensor(1.0))
    assert not torch.equal(again == 0, dropped)  # a fresh mask per call
    used.sum().backward()
    assert torch.allclose(raw.grad, (~dropped).float() / 0.6)
    # the module keeps its parameter
    assert probe.weight is raw and isinstance(probe.weight, nn.Parameter)
    probe.eval()
    assert torch.equal(call_with_weight_drop(probe, ["weight"], 0.4, torch.tensor(1.0)), raw)
    probe.train()
    assert torch.equal(call_with_weight_drop(probe, ["weight"], 0.0, torch.tensor(1.0)), raw)


def test_weight_drop_on_an_lstm_matches_the_lstm_with_the_dropped_weight() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 8, batch_first=True)
    x = torch.randn(2, 5, 3)
    hx = (torch.randn(1, 2, 8), torch.randn(1, 2, 8))
    with torch.no_grad():
        before = lstm(x, hx)[0]
    torch.manual_seed(1)
    out, (h, c) = call_with_weight_drop(lstm, ["weight_hh_l0"], 0.5, x, hx)
    reference = nn.LSTM(3, 8, batch_first=True)
    reference.load_state_dict(lstm.state_dict())
    torch.manual_seed(1)  # the same mask
    with torch.no_grad():
        reference.weight_hh_l0.copy_(F.dropout(lstm.weight_hh_l0, 0.5, training=True))
    ref_out, (ref_h, ref_c) = reference(x, hx)
    assert torch.allclose(out, ref_out, atol=1e-6)
    assert torch.allclose(h, ref_h, atol=1e-6) and torch.allclose(c, ref_c, atol=1e-6)
    out.sum().backward()
    grad = lstm.weight_hh_l0.grad
    assert grad is not None and grad.abs().sum() > 0
    assert lstm.weight_ih_l0.grad.abs().sum() > 0
    with torch.no_grad():
        # after the call the LSTM runs on its own weights again
        assert torch.equal(lstm(x, hx)[0], before)
        assert not torch.allclose(before, ref_out)
        lstm.eval()
        assert torch.equal(call_with_weight_drop(lstm, ["weight_hh_l0"], 0.5, x, hx)[0], before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN needs a CUDA device")
def test_weight_drop_on_a_cudnn_lstm() -> None:
    """cuDNN compacts the dropped weights silently, and the LSTM's own weights stay flattened."""
    torch.manual_seed(0)
    lstm = nn.LSTM(16, 32, batch_first=True).cuda()
    x = torch.randn(4, 10, 16, device="cuda")
    with torch.no_grad():
        before = lstm(x)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = call_with_weight_drop(lstm, ["weight_hh_l0"], 0.5, x)
        out.sum().backward()
        with torch.no_grad():
            after = lstm(x)[0]
    assert not [w for w in caught if "contiguous chunk" in str(w.message)]
    assert lstm.weight_hh_l0.grad.abs().sum() > 0
    assert not torch.allclose(out, before)
    torch.testing.assert_close(after, before)


def test_weight_drop_on_the_pru_context_weight() -> None:
    torch.manual_seed(0)
    pru = PRU(4, 8, groups=2, batch_first=True)
    name = "cells.0.context.glt.weight"
    x = torch.randn(2, 5, 4)
    out, _ = call_with_weight_drop(pru, [name], 0.5, x, None)
    other, _ = call_with_weight_drop(pru, [name], 0.5, x, None)
    assert not torch.allclose(out, other)
    out.sum().backward()
    assert pru.get_parameter(name).grad.abs().sum() > 0
    pru.eval()
    assert torch.equal(call_with_weight_drop(pru, [name], 0.5, x, None)[0], pru(x)[0])


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_probability_checked(p: float) -> None:
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\)"):
        locked_dropout(torch.ones(1, 2, 3), p, training=True)
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\)"):
        embedding_dropout(torch.ones(2, 3), p, training=True)
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\)"):
        call_with_weight_drop(WeightProbe(2, 2), ["weight"], p, torch.tensor(1.0))
