from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from src.optim.schedules import inverse_sqrt, warmup_cosine, warmup_cosine_period, warmup_linear


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
    from src.optim.schedules import cyclic_warm_restarts

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
    assert (
        state["halve_at"] == [10] and state["steps_per_epoch"] == 2
    )  # plain numbers in checkpoints
    with pytest.raises(ValueError, match="eta_max"):
        cyclic_warm_restarts(
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), 10, epochs=2
        )


def _rates(factory: Callable[..., Any], lr: float, steps: int, **kwargs: Any) -> list[float]:
    """The lr of each of ``steps`` optimiser updates, the scheduler stepped after each."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    scheduler = factory(optimizer, **kwargs)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_inverse_sqrt_follows_fairseq() -> None:
    rates = _rates(inverse_sqrt, 5e-4, 17, total_steps=17, warmup_steps=4, warmup_init_lr=1e-7)
    # warm-up: 1e-7 + k (5e-4 - 1e-7) / 4, then 5e-4 sqrt(4 / k)
    assert rates[:5] == pytest.approx([1e-7, 1.25075e-4, 2.5005e-4, 3.75025e-4, 5e-4], rel=1e-12)
    assert rates[9] == pytest.approx(5e-4 * 2 / 3, rel=1e-12)
    assert rates[16] == pytest.approx(2.5e-4, rel=1e-12)
    # IWSLT'14 (Wu et al.): 4,000 warm-up updates, 50,000 in all
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=5e-4)
    multiplier = inverse_sqrt(optimizer, 50_000).lr_lambdas[0]
    assert 5e-4 * multiplier(50_000) == pytest.approx(1.4142136e-4, rel=1e-7)
    assert 5e-4 * multiplier(2_000) == pytest.approx(1e-7 + 0.5 * (5e-4 - 1e-7), rel=1e-12)
    with pytest.raises(ValueError, match="warmup_steps >= 1"):
        inverse_sqrt(optimizer, 10, warmup_steps=0)


def test_warmup_linear_follows_the_official_schedule() -> None:
    rates = _rates(
        warmup_linear, 1.0, 13, total_steps=10, warmup_steps=3, warmup_init_lr=0.1, end_lr=0.2
    )
    # the official construction: linspace(init, peak, W) + linspace(peak, end, total - W + 1)
    official = np.concatenate((np.linspace(0.1, 1.0, 3), np.linspace(1.0, 0.2, 8))).tolist()
    assert rates[:11] == pytest.approx(official, abs=1e-12)
    assert rates[:4] == pytest.approx([0.1, 0.55, 1.0, 1.0], abs=1e-12)
    assert rates[6] == pytest.approx(1.0 - 3 / 7 * 0.8, abs=1e-12)
    assert rates[10:] == pytest.approx([0.2, 0.2, 0.2], abs=1e-12)  # end_lr after the run
    # WMT'16 En-Ro (lr 7e-4 for d_m 512): half-way through the decay
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=7e-4)
    multiplier = warmup_linear(optimizer, 100_000, warmup_steps=10_000).lr_lambdas[0]
    assert 7e-4 * multiplier(55_000) == pytest.approx(0.5 * (7e-4 + 1e-7), rel=1e-12)
    assert 7e-4 * multiplier(100_000) == pytest.approx(1e-7, rel=1e-9)
    # a debug run shorter than the warm-up warms up in total_steps - 1 updates, then ends
    assert _rates(warmup_linear, 1.0, 3, total_steps=2, warmup_steps=10, end_lr=0.5) == (
        pytest.approx([1e-7, 1.0, 0.5], abs=1e-12)
    )


def test_warmup_cosine_period_follows_fairseq() -> None:
    rates = _rates(
        warmup_cosine_period,
        1.0,
        12,
        total_steps=12,
        warmup_steps=4,
        warmup_init_lr=0.0,
        min_lr=0.1,
    )
    # warm-up k / 4, then 0.1 + 0.45 (1 + cos(pi t / 8)) over the remaining 8 updates
    assert rates[:5] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0], abs=1e-12)
    assert rates[8] == pytest.approx(0.55, abs=1e-12)
    expected = [0.1 + 0.45 * (1 + math.cos(math.pi * t / 8)) for t in range(8)]
    assert rates[4:] == pytest.approx(expected, abs=1e-12)


def test_cosine_periods_of_the_wmt14_scripts() -> None:
    peak = 0.004  # d_m = 512
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    # En-Fr: period fixed at 70,000, training stops 40,000 updates after warm-up
    en_fr = warmup_cosine_period(optimizer, 50_000, warmup_steps=10_000, period=70_000)
    end = en_fr.lr_lambdas[0](50_000)
    assert peak * end == pytest.approx(
        1e-7 + 0.5 * (peak - 1e-7) * (1 + math.cos(4 * math.pi / 7)), rel=1e-12
    )
    assert end == pytest.approx(0.388755, abs=1e-6) and round(end, 2) == 0.39
    assert peak * en_fr.lr_lambdas[0](10_000) == pytest.approx(peak, rel=1e-12)
    assert peak * en_fr.lr_lambdas[0](5_000) == pytest.approx(1e-7 + 0.5 * (peak - 1e-7))
    # En-De: period = 30,000 - 10,000, down to the 1e-7 floor
    en_de = warmup_cosine_period(optimizer, 30_000, warmup_steps=10_000)
    assert en_de.lr_lambdas[0].period == 20_000
    assert peak * en_de.lr_lambdas[0](20_000) == pytest.approx(0.5 * (peak + 1e-7), rel=1e-12)
    assert peak * en_de.lr_lambdas[0](29_999) == pytest.approx(1e-7, abs=1e-10)
    state = en_fr.state_dict()["lr_lambdas"][0]  # plain numbers in checkpoints
    assert (state["period"], state["warmup_steps"], state["min_lr"]) == (70_000, 10_000, 1e-7)
    with pytest.raises(ValueError, match="above the final lr"):
        warmup_cosine_period(optimizer, 10, warmup_steps=2, min_lr=0.01)
