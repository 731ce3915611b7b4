"""The hybrid detection schedule against EdgeNets' HybirdLR values for the 300 x 300 recipe."""

from __future__ import annotations

import pytest
import torch

from src.optim.schedules import hybrid


def per_epoch_rates(lr: float, epochs: int, steps_per_epoch: int, **kwargs: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    scheduler = hybrid(optimizer, total_steps=epochs * steps_per_epoch, epochs=epochs, **kwargs)
    rates = []
    for step in range(epochs * steps_per_epoch):
        if step % steps_per_epoch == 0:
            rates.append(optimizer.param_groups[0]["lr"])
        else:  # constant within an epoch
            assert optimizer.param_groups[0]["lr"] == rates[-1]
        optimizer.step()
        scheduler.step()
    return rates


def test_recipe_schedule() -> None:
    rates = per_epoch_rates(0.01, epochs=100, steps_per_epoch=2, clr_max=61, cycle=5)
    # epoch 0 at lr; epochs 1-60: 5x..1x lr, 12 cycles; epochs 61-99: lr * (1 - (e - 60) / 40)
    expected = [0.01] + [0.05, 0.04, 0.03, 0.02, 0.01] * 12
    expected += [0.01 * (1 - (e - 60) / 40) for e in range(61, 100)]
    assert rates == pytest.approx(expected)
    assert rates[61] == pytest.approx(0.00975) and rates[99] == pytest.approx(0.00025)


def test_short_runs_and_bad_arguments() -> None:
    # a debug run shorter than the cyclic part stays cyclic
    rates = per_epoch_rates(0.005, epochs=3, steps_per_epoch=1)
    assert rates == pytest.approx([0.005, 0.025, 0.02])
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.01)
    with pytest.raises(ValueError, match="cycle=0"):
        hybrid(optimizer, total_steps=10, epochs=2, cycle=0)
