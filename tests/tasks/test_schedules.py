from __future__ import annotations

import math

import pytest
import torch

from src.tasks.schedules import warmup_cosine


def learning_rates(total: int, warmup: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = warmup_cosine(optimizer, total_steps=total, warmup_steps=warmup)
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_warmup_then_cosine() -> None:
    rates = learning_rates(total=20, warmup=4)
    # LinearLR from 1/warmup of the peak, reaching the peak when the cosine starts
    assert rates[:4] == pytest.approx([0.25, 0.4375, 0.625, 0.8125])
    # cosine over the remaining 16 steps, from the peak
    assert rates[4:] == pytest.approx([0.5 * (1 + math.cos(math.pi * t / 16)) for t in range(16)])


def test_no_warmup_and_short_runs() -> None:
    assert learning_rates(total=4, warmup=0) == pytest.approx([1.0, 0.8535534, 0.5, 0.1464466])
    assert len(learning_rates(total=1, warmup=10)) == 1
    with pytest.raises(ValueError, match="total_steps"):
        learning_rates(total=0, warmup=0)


def test_cyclic_warm_restarts_follows_eq_2_1() -> None:
    from src.tasks.schedules import cyclic_warm_restarts

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    # 12 epochs of 2 steps; halved from epoch 10 on
    scheduler = cyclic_warm_restarts(optimizer, total_steps=24, epochs=12, halve_at=[10])
    per_epoch = []
    for step in range(24):
        if step % 2 == 0:
            per_epoch.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert per_epoch == pytest.approx([0.5, 0.4, 0.3, 0.2, 0.1, 0.5, 0.4, 0.3, 0.2, 0.1, 0.25, 0.2])
    state = scheduler.state_dict()["lr_lambdas"][0]
    assert state["halve_at"] == [10] and state["steps_per_epoch"] == 2  # plain numbers in checkpoints
    with pytest.raises(ValueError, match="eta_max"):
        cyclic_warm_restarts(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), 10, epochs=2)
