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
