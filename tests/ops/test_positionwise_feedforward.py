"""Transformer-XL's position-wise feed-forward sublayer: its formula in both norm placements, its
parameter count, any leading dims."""

from __future__ import annotations

import pytest
import torch

from src.ops.positionwise_feedforward import PositionwiseFeedForward

D, INNER = 8, 32


@pytest.mark.parametrize("pre_norm", [False, True])
def test_formula(pre_norm: bool) -> None:
    torch.manual_seed(0)
    ff = PositionwiseFeedForward(D, INNER, dropout=0.3, pre_norm=pre_norm).double().eval()
    x = torch.randn(2, 5, D, dtype=torch.float64)

    def y(t: torch.Tensor) -> torch.Tensor:
        return ff.linear_2(torch.relu(ff.linear_1(t)))

    expected = x + y(ff.norm(x)) if pre_norm else ff.norm(x + y(x))
    torch.testing.assert_close(ff(x), expected, rtol=0, atol=1e-12)


def test_parameters_and_leading_dims() -> None:
    ff = PositionwiseFeedForward(D, INNER)
    assert sum(p.numel() for p in ff.parameters()) == 2 * D * INNER + INNER + 3 * D
    assert ff(torch.randn(7, D)).shape == (7, D)
    assert ff(torch.randn(2, 3, 4, D)).shape == (2, 3, 4, D)


def test_dropout_only_in_training() -> None:
    ff = PositionwiseFeedForward(D, INNER, dropout=0.5)
    x = torch.randn(4, 6, D)
    ff.eval()
    torch.testing.assert_close(ff(x), ff(x), rtol=0, atol=0)
    ff.train()
    torch.manual_seed(1)
    first = ff(x)
    torch.manual_seed(2)
    assert not torch.equal(first, ff(x))
