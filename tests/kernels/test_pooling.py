from __future__ import annotations

import pytest
import torch
from torch import nn

from src.kernels.pooling import AvgPool2d, MaxPool2d


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(MaxPool2d(3, 2, 1), nn.MaxPool2d(3, 2, 1)), (AvgPool2d(3, 2, 1), nn.AvgPool2d(3, 2, 1))],
)
@pytest.mark.parametrize("shape", [(1, 5, 9, 9), (3, 4, 8, 11)])
def test_channels_last_pooling_equals_torch(
    ours: nn.Module, theirs: nn.Module, shape: tuple[int, ...]
) -> None:
    x = torch.randn(*shape, requires_grad=True)
    y = ours(x)
    assert y.is_contiguous()  # back in the NCHW layout of the input
    expected = theirs(x)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    grad = torch.randn_like(y)
    (ours_grad,) = torch.autograd.grad(y, x, grad)
    (their_grad,) = torch.autograd.grad(expected, x, grad)
    torch.testing.assert_close(ours_grad, their_grad)
