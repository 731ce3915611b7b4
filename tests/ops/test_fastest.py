"""``src.kernels.dispatch.fastest``: the measured choice of ``impl="auto"``, kept per key."""

from __future__ import annotations

import logging

import pytest
import torch

from src.kernels import dispatch, environment


def _timed_candidates(times: dict[str, float], timed: list[str]):
    def candidates() -> dict:
        def make(name: str):
            def run() -> float:
                timed.append(name)
                return times[name]

            return run

        return {name: make(name) for name in times}

    return candidates


def test_fastest_times_once_per_key_and_says_so_once(monkeypatch, caplog) -> None:
    times = {"kernel": 1.0, "eager": 2.0}
    timed: list[str] = []
    candidates = _timed_candidates(times, timed)
    monkeypatch.setattr(dispatch, "cuda_time", lambda fn: fn())
    dispatch._say_first_timing.cache_clear()
    cache: dict = {}
    with caplog.at_level(logging.INFO, logger="src.kernels.dispatch"):
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


def test_choices_timed_on_cuda_are_kept_for_later_processes(monkeypatch, tmp_path) -> None:
    """A ChoiceCache keeps what cuda_time measured on disk; a later process (a new cache, the
    file read anew) takes it without timing; another signature (GPU, versions, kernels) times."""
    from src.kernels import choices

    store = tmp_path / "choices.json"
    monkeypatch.setenv(environment.CHOICES_ENV, str(store))
    monkeypatch.setattr(dispatch, "cuda_time", lambda fn: fn())
    monkeypatch.setattr(choices, "signature", lambda: "GPU A | torch x | triton y | k1")
    timed: list[str] = []
    times = {"triton": 1.0, "reference": 2.0}
    first = choices.ChoiceCache("op")
    key = (64, 32, torch.bfloat16, None, "cuda:0")
    assert dispatch.fastest(first, key, _timed_candidates(times, timed), None, deterministic="x") == "triton"
    assert timed == ["triton", "reference"] and store.exists()

    times.update(triton=3.0)  # a later process would measure otherwise, but does not measure
    later = choices.ChoiceCache("op")
    assert dispatch.fastest(later, key, _timed_candidates(times, timed), None, deterministic="x") == "triton"
    assert timed == ["triton", "reference"] and later[key] == "triton"
    # another op's cache, another key: each its own entry
    other = choices.ChoiceCache("other_op")
    assert dispatch.fastest(other, key, _timed_candidates(times, timed), None, deterministic="x") == "reference"
    assert len(timed) == 4

    monkeypatch.setattr(choices, "signature", lambda: "GPU B | torch x | triton y | k1")
    elsewhere = choices.ChoiceCache("op")
    assert dispatch.fastest(elsewhere, key, _timed_candidates(times, timed), None, deterministic="x") == "reference"
    assert len(timed) == 6


def test_injected_timers_and_a_disabled_store_write_nothing(monkeypatch, tmp_path) -> None:
    from src.kernels import choices

    store = tmp_path / "choices.json"
    monkeypatch.setenv(environment.CHOICES_ENV, str(store))
    cache = choices.ChoiceCache("op")
    timed: list[str] = []
    fake = lambda fn: fn()  # noqa: E731
    assert dispatch.fastest(cache, 1, _timed_candidates({"a": 1.0, "b": 2.0}, timed), fake, deterministic="a") == "a"
    assert not store.exists()  # a test's timer: the process only
    monkeypatch.setenv(environment.CHOICES_ENV, "0")
    monkeypatch.setattr(dispatch, "cuda_time", fake)
    assert dispatch.fastest(choices.ChoiceCache("op"), 1, _timed_candidates({"a": 1.0, "b": 2.0}, timed), None, deterministic="a") == "a"
    assert not store.exists()


def test_the_signature_names_the_device_versions_and_kernels() -> None:
    from src.kernels import choices

    text = choices.signature()
    assert f"torch {torch.__version__}" in text and "triton" in text
    assert len(text.rsplit("| ", 1)[-1]) == 16
