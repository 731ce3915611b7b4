"""``src.ops.triton.fastest``: the measured choice of ``impl="auto"``, kept per key."""

from __future__ import annotations

import logging

import pytest
import torch

import src.ops.triton as dispatch


def test_fastest_times_once_per_key_and_says_so_once(monkeypatch, caplog) -> None:
    times = {"kernel": 1.0, "eager": 2.0}
    timed: list[str] = []

    def fake_cuda_time(fn) -> float:
        return fn()

    def candidates() -> dict:
        def make(name: str):
            def run() -> float:
                timed.append(name)
                return times[name]

            return run

        return {name: make(name) for name in times}

    monkeypatch.setattr(dispatch, "cuda_time", fake_cuda_time)
    dispatch._say_first_timing.cache_clear()
    cache: dict = {}
    with caplog.at_level(logging.INFO, logger="src.ops.triton"):
        assert dispatch.fastest(cache, "a", candidates, None, deterministic="eager") == "kernel"
        times["kernel"] = 3.0
        assert dispatch.fastest(cache, "a", candidates, None, deterministic="eager") == "kernel"
        assert dispatch.fastest(cache, "b", candidates, None, deterministic="eager") == "eager"
    assert timed == ["kernel", "eager", "kernel", "eager"]  # two keys, each timed once
    said = [r.message for r in caplog.records if "first call of each shape" in r.message]
    assert len(said) == 1


def test_deterministic_mode_times_nothing(monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "cuda_time", lambda fn: pytest.fail("timed"))
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert dispatch.fastest({}, "a", lambda: {"x": None}, None, deterministic="x") == "x"
    finally:
        torch.use_deterministic_algorithms(deterministic)
