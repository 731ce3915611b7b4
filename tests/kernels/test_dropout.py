"""The hashed dropout of the CPU (``src/kernels/dropout/__init__.py``): the masks' rate and
independence, the kept values' scale, the backward's mask equal to the forward's, the seed from
PyTorch's generator, masks independent of the thread count, and ``F.dropout`` where the kernel does
not apply."""

from __future__ import annotations

import math

import pytest
import torch

from src.kernels.dropout import dropout
from tests.helpers import require_cpu_kernels


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_cpu_kernels()


@pytest.mark.parametrize("p", [0.02, 0.1, 0.5, 0.9])
def test_each_element_is_dropped_at_rate_p_and_the_kept_ones_scaled(p: float) -> None:
    torch.manual_seed(0)
    n = 1_000_000
    x = torch.rand(n) + 0.5  # no zeros of its own
    y = dropout(x, p)
    kept = y != 0
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs((1 - kept.double().mean().item()) - p) < 6 * sigma
    assert torch.equal(y[kept], x[kept] * torch.tensor(1 / (1 - p), dtype=torch.float32))
    # neighbours (and elements a row apart) are uncorrelated, to the sampling noise
    mask = kept.double()
    for lag in (1, 64, 1000):
        corr = torch.corrcoef(torch.stack([mask[:-lag], mask[lag:]]))[0, 1].item()
        assert abs(corr) < 6 / math.sqrt(n), (lag, corr)


def test_the_backward_applies_the_forwards_mask() -> None:
    torch.manual_seed(0)
    x = torch.randn(300, 70, requires_grad=True)
    y = dropout(x, 0.3)
    assert type(y.grad_fn).__name__ == "HashedDropoutBackward"
    probe = torch.randn_like(y)
    y.backward(probe)
    scale = torch.tensor(1 / 0.7, dtype=torch.float32)
    assert torch.equal(x.grad, torch.where(y != 0, probe * scale, torch.zeros(())))


def test_the_seed_comes_from_the_default_generator() -> None:
    x = torch.ones(10_000)
    torch.manual_seed(3)
    first, second = dropout(x, 0.5), dropout(x, 0.5)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.5), first)
    assert not torch.equal(first, second)  # each call draws a new seed


def test_masks_do_not_depend_on_the_thread_count() -> None:
    x = torch.randn(200_000)
    threads, masks = torch.get_num_threads(), []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            torch.manual_seed(7)
            masks.append(dropout(x, 0.2))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(masks[0], m) for m in masks[1:])


def test_identity_outside_training_and_f_dropout_elsewhere() -> None:
    x = torch.randn(8, 5, requires_grad=True)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0) is x
    assert type(dropout(x.double(), 0.3).grad_fn).__name__ != "HashedDropoutBackward"
    assert type(dropout(x.bfloat16(), 0.3).grad_fn).__name__ != "HashedDropoutBackward"
    strided = torch.randn(8, 10)[:, ::2]  # any layout: the kernel reads a contiguous copy
    assert dropout(strided, 0.5).shape == (8, 5)


def test_the_kernels_reject_what_they_cannot_read() -> None:
    seed = torch.ones(1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="dropout_forward: x must be float32"):
        torch.ops.lightnets_cpu.dropout_forward(torch.ones(3, dtype=torch.float64), 0.5, seed)
    with pytest.raises(RuntimeError, match=r"dropout_forward: p must be in \[0, 1\), got 1"):
        torch.ops.lightnets_cpu.dropout_forward(torch.ones(3), 1.0, seed)
    with pytest.raises(RuntimeError, match="dropout_backward: grad_y must be contiguous"):
        torch.ops.lightnets_cpu.dropout_backward(torch.ones(3, 4).t(), 0.5, seed)
    for bad in (torch.ones(1), torch.ones(2, dtype=torch.int64)):
        with pytest.raises(RuntimeError, match="dropout_forward: seed must be a one-element int64"):
            torch.ops.lightnets_cpu.dropout_forward(torch.ones(3), 0.5, bad)
