"""``src.kernels.choose``: each rule of its order, the capture rule under ``torch.compile`` and a
CUDA stream capture, the count of measurements, and the machine's store.

The candidates here are stand-ins that report what ran; a timer or measurement that must not run
fails the test if it does."""

from __future__ import annotations

import logging

import pytest
import torch

from src.kernels import (
    capture_for_export,
    choices,
    choose,
    chosen,
    dispatch,
    environment,
    forget,
    timings,
)


def _candidates(times: dict[str, float], ran: list[str]):
    """Candidates that record their name when called and return their time."""

    def candidates() -> dict:
        def make(name: str):
            def run() -> float:
                ran.append(name)
                return times[name]

            return run

        return {name: make(name) for name in times}

    return candidates


def _untimed() -> dict:
    pytest.fail("candidates built: something was timed")


def _no_timer(fn) -> float:
    pytest.fail("timed")


@pytest.fixture
def store(fresh_choices, monkeypatch, tmp_path):
    """The machine's store in tmp_path, the committed tables off (no architecture), the CPU's
    paths measured, CUDA timing stood in for by running the candidate (its return value is its
    time); yields the store's path."""
    path = tmp_path / "choices.json"
    monkeypatch.setenv(environment.CHOICES_ENV, str(path))
    monkeypatch.setattr(environment, "_mode", "auto")
    monkeypatch.setattr(choices, "architecture", lambda: None)
    monkeypatch.setattr(dispatch, "cuda_time", lambda fn: fn())
    forget()
    return path


def test_times_once_per_key_and_says_so_once(store, caplog) -> None:
    times = {"kernel": 1.0, "eager": 2.0}
    ran: list[str] = []
    with caplog.at_level(logging.INFO, logger="src.kernels.dispatch"):
        assert choose("op", "a", _candidates(times, ran), default="eager") == "kernel"
        times["kernel"] = 3.0
        assert choose("op", "a", _candidates(times, ran), default="eager") == "kernel"
        assert choose("op", "b", _candidates(times, ran), default="eager") == "eager"
    assert ran == ["kernel", "eager", "kernel", "eager"]  # two keys, each timed once
    assert timings() == 2 and chosen("op") == {"a": "kernel", "b": "eager"}
    said = [r.message for r in caplog.records if "first call of each shape" in r.message]
    assert len(said) == 1


def test_export_takes_the_reference_before_anything(store, monkeypatch) -> None:
    monkeypatch.setenv(environment.GLT_WEIGHT_GRAD_ENV, "bmm")  # a forcing variable loses too
    with capture_for_export():
        assert choose("op", 1, _untimed, default="kernel") == "reference"
        assert choose("group_linear.weight_grad", 1, _untimed, default="splitk",
                      reference="bmm") == "bmm"  # fmt: skip
        assert choose("op", 1, _untimed, default="ours", reference="aten", device="cpu") == "aten"
    assert timings() == 0


def test_a_forcing_variable_comes_before_deterministic_mode_and_the_caches(
    store, monkeypatch
) -> None:
    op = "group_linear.weight_grad"
    times = {"splitk": 1.0, "bmm": 2.0}
    timer = lambda fn: fn()  # noqa: E731
    assert choose(op, 1, _candidates(times, []), default="splitk", timer=timer) == "splitk"
    monkeypatch.setenv(environment.GLT_WEIGHT_GRAD_ENV, "bmm")
    torch.use_deterministic_algorithms(True)
    try:
        assert choose(op, 1, _untimed, default="splitk") == "bmm"
    finally:
        torch.use_deterministic_algorithms(False)
    monkeypatch.setenv(environment.GLT_WEIGHT_GRAD_ENV, "auto")
    assert choose(op, 1, _untimed, default="splitk") == "splitk"  # the process's again
    monkeypatch.setenv(environment.GLT_WEIGHT_GRAD_ENV, "cublas")
    with pytest.raises(ValueError, match="GLT_WGRAD='cublas'; choose auto, splitk or bmm"):
        choose(op, 1, _untimed, default="splitk")


def test_deterministic_mode_takes_the_default_over_every_kept_choice(store) -> None:
    times = {"kernel": 1.0, "eager": 2.0}
    assert choose("op", "a", _candidates(times, []), default="eager") == "kernel"
    torch.use_deterministic_algorithms(True)
    try:
        assert choose("op", "a", _untimed, default="eager", timer=_no_timer) == "eager"
        assert choose("op", "b", _untimed, default="eager") == "eager"
    finally:
        torch.use_deterministic_algorithms(False)
    assert timings() == 1


def test_the_process_choice_comes_before_the_committed_table_and_the_store(
    store, monkeypatch
) -> None:
    times = {"kernel": 1.0, "eager": 2.0}
    assert choose("op", "a", _candidates(times, []), default="eager") == "kernel"
    monkeypatch.setattr(choices, "committed", lambda op, key, arch: "eager")
    monkeypatch.setattr(choices, "stored", lambda op, key, device: "eager")
    assert choose("op", "a", _untimed, default="eager") == "kernel"


def test_the_committed_table_comes_before_the_store_and_any_timing(store, monkeypatch) -> None:
    monkeypatch.setattr(choices, "architecture", lambda: "sm_90")
    monkeypatch.setattr(
        choices, "committed_table", lambda arch: {"op": ({repr((1, 2)): "eager"}, "kernel")}
    )
    monkeypatch.setattr(choices, "stored", lambda op, key, device: pytest.fail("store read"))
    assert choose("op", (1, 2), _untimed, default="x", timer=_no_timer) == "eager"  # its key
    assert choose("op", (3, 4), _untimed, default="x", timer=_no_timer) == "kernel"  # op-wide
    assert timings() == 0 and chosen("op") == {(1, 2): "eager", (3, 4): "kernel"}
    # the CPU has no committed table
    assert choose("op", (1, 2), _candidates({"ours": 2.0, "aten": 1.0}, []), default="ours",
                  reference="aten", device="cpu", timer=lambda fn: fn()) == "aten"  # fmt: skip


def test_an_architecture_without_a_table_times(store, monkeypatch) -> None:
    monkeypatch.setattr(choices, "architecture", lambda: "sm_1")  # no committed/sm_1.json
    ran: list[str] = []
    op, key = "group_linear.weight_grad", (16384, 2, 128, 128, torch.bfloat16)
    times = {"splitk": 1.0, "bmm": 2.0}
    assert choose(op, key, _candidates(times, ran), default="bmm", reference="bmm") == "splitk"
    assert ran == ["splitk", "bmm"] and timings() == 1


def test_choices_timed_on_cuda_are_kept_for_later_processes(store, monkeypatch) -> None:
    """What cuda_time measured goes to the store; a later process (the caches forgotten, the file
    read anew) takes it without timing; another signature (GPU, versions, kernels) times."""
    monkeypatch.setattr(choices, "signature", lambda: "GPU A | torch x | triton y | k1")
    ran: list[str] = []
    times = {"triton": 1.0, "reference": 2.0}
    key = (64, 32, torch.bfloat16, None, "cuda:0")
    assert choose("op", key, _candidates(times, ran), default="x") == "triton"
    assert ran == ["triton", "reference"] and store.exists()

    forget()  # a later process; it would measure otherwise, but does not measure
    times.update(triton=3.0)
    assert choose("op", key, _candidates(times, ran), default="x") == "triton"
    assert len(ran) == 2 and timings() == 0 and chosen("op") == {key: "triton"}
    assert choose("other_op", key, _candidates(times, ran), default="x") == "reference"
    assert len(ran) == 4  # another op: its own entry

    forget()
    monkeypatch.setattr(choices, "signature", lambda: "GPU B | torch x | triton y | k1")
    assert choose("op", key, _candidates(times, ran), default="x") == "reference"
    assert len(ran) == 6


def test_a_tests_timer_and_a_disabled_store_write_nothing(store, monkeypatch) -> None:
    times = {"a": 1.0, "b": 2.0}
    assert choose("op", 1, _candidates(times, []), default="b", timer=lambda fn: fn()) == "a"
    assert not store.exists()  # a test's timer: the process only
    forget()
    monkeypatch.setenv(environment.CHOICES_ENV, "0")
    assert choose("op", 1, _candidates(times, []), default="b") == "a"
    assert not store.exists()


def test_a_cuda_stream_capture_times_nothing(store, monkeypatch) -> None:
    times = {"kernel": 1.0, "eager": 2.0}
    assert choose("op", "a", _candidates(times, []), default="eager") == "kernel"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert dispatch.capturing()
    assert choose("op", "a", _untimed, default="eager") == "kernel"  # kept: still answered
    assert choose("op", "b", _untimed, default="eager") == "eager"  # not kept: the default
    assert timings() == 1 and "b" not in chosen("op")


def test_under_torch_compile_nothing_is_timed(store) -> None:
    """Traced with fullgraph=True, choose() is a constant of the graph: the kept choice for its
    key, else the default; no timer runs, also for a size the graph leaves dynamic."""
    times = {"triple": 1.0, "increment": 2.0}
    ran: list[str] = []
    assert choose("op", (4, torch.float32), _candidates(times, ran), default="increment",
                  timer=lambda fn: fn()) == "triple"  # fmt: skip
    seen: list[bool] = []

    def step(x: torch.Tensor) -> torch.Tensor:
        seen.append(dispatch.capturing())
        key = (dispatch.size_bucket(x.shape[0]), x.dtype)
        path = choose("op", key, _untimed, default="increment", timer=_no_timer)
        return x * 3 if path == "triple" else x + 1

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True, dynamic=True)
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))  # bucket 4: kept
    assert torch.equal(compiled(torch.ones(7)), torch.full((7,), 2.0))  # bucket 8: default
    assert seen == [True, True] and ran == ["triple", "increment"] and timings() == 1
    assert set(chosen("op")) == {(4, torch.float32)}


def test_the_cpu_flavour_keys_the_thread_count_and_keeps_its_own_choices(store) -> None:
    times = {"ours": 2.0, "aten": 1.0}
    timer = lambda fn: fn()  # noqa: E731
    assert choose("op", ("a",), _candidates(times, []), default="ours", reference="aten",
                  device="cpu", timer=timer) == "aten"  # fmt: skip
    threads = torch.get_num_threads()
    assert chosen("op", "cpu") == {("a", threads): "aten"} and chosen("op") == {}

    def step(x: torch.Tensor) -> torch.Tensor:
        path = choose("op", (x.shape[0],), _untimed, default="ours", reference="aten",
                      device="cpu", timer=_no_timer)  # fmt: skip
        return x + 1 if path == "aten" else x - 1

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    assert torch.equal(compiled(torch.zeros(2)), torch.zeros(2) - 1)  # ("a",) is not (2,)
    forget()
    assert choose("op", (2,), _candidates(times, []), default="ours", reference="aten",
                  device="cpu", timer=timer) == "aten"  # fmt: skip
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    assert torch.equal(compiled(torch.zeros(2)), torch.ones(2))  # the kept choice, traced


def test_measured_candidates_must_be_the_declared_ones(store) -> None:
    dispatch.declare("declared_op", ("a", "b"))
    with pytest.raises(ValueError, match=r"declared the candidates \('a', 'b'\), built \('a', 'c'"):
        choose("declared_op", 1, _candidates({"a": 1.0, "c": 2.0}, []), default="a")
    with pytest.raises(ValueError, match="device must be 'cuda' or 'cpu'"):
        dispatch.declare("declared_op", ("a", "b"), device="mps")


def test_size_buckets() -> None:
    assert [dispatch.size_bucket(n) for n in (0, 1, 2, 3, 4, 5, 33, 64, 65)] == [
        1, 1, 2, 4, 4, 8, 64, 64, 128,
    ]  # fmt: skip
