"""The CPU flavour of ``src.kernels.choose`` (the project's path or ATen's): the modes of
``LIGHTNETS_CPU_KERNELS``, the choice kept per shape, thread count and machine, the margin, the
four ops that measure (BatchNorm's backward, DimConv, the point-wise convolution, the one-node
relative attention) running the chosen path with ATen's numbers, and timing that leaves the
caller's tensors and statistics alone.

Timings are stood in for by fake timers where a test needs a given winner; one test measures for
real and checks only that the chosen path's numbers are right, whichever wins here.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import src.kernels.dim_conv
import src.kernels.relative_attention
import src.ops.relative_position
from src.kernels import ATEN, OURS, choices, choose, chosen, dispatch, environment, forget, timing
from src.kernels.batch_norm import BatchNorm2d
from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.dim_conv import dim_conv_reference
from src.kernels.environment import cpu_path_mode, use_cpu_paths
from src.kernels.pointwise_conv import pointwise_conv
from src.ops.dim_conv import DimConv
from tests.helpers import require_cpu_kernels


@pytest.fixture
def auto(fresh_choices, monkeypatch, tmp_path):
    """Measured mode with the process's choices forgotten and the store in tmp_path; yields the
    store's path."""
    monkeypatch.setattr(environment, "_mode", "auto")
    monkeypatch.setenv(environment.CHOICES_ENV, str(tmp_path / "choices.json"))
    forget()
    return tmp_path / "choices.json"


def _slow(loser: str):
    """A stand-in for cpu_times that runs each candidate once and makes ``loser`` the slower."""

    def measure(candidates) -> dict:
        for fn in candidates.values():
            fn()
        return {name: 1.0 if name == loser else 0.5 for name in candidates}

    return measure


def _cpu(op: str, key, candidates, timer=None) -> str:
    return choose(op, key, candidates, default=OURS, reference=ATEN, device="cpu", timer=timer)


def test_modes_and_a_clear_error_for_a_wrong_one(monkeypatch, fresh_choices) -> None:
    candidates = lambda: pytest.fail("timed")  # noqa: E731
    with use_cpu_paths("1"):
        assert _cpu("op", ("k",), candidates) == OURS
    with use_cpu_paths("0"):
        assert _cpu("op", ("k",), candidates) == ATEN
        assert not cpu_kernels_loaded()  # nothing of the project's runs
    # the variable, read once a process
    monkeypatch.setattr(environment, "_mode", None)
    monkeypatch.delenv(environment.CPU_KERNELS_ENV, raising=False)
    assert cpu_path_mode() == "auto"
    monkeypatch.setattr(environment, "_mode", None)
    monkeypatch.setenv(environment.CPU_KERNELS_ENV, "yes")
    with pytest.raises(ValueError, match=r"LIGHTNETS_CPU_KERNELS='yes'.*auto.*1.*0"):
        _cpu("op", ("k",), candidates)


def test_measured_once_per_key_and_thread_count(auto) -> None:
    runs: list[str] = []
    times = {OURS: 2.0, ATEN: 1.0}

    def candidates() -> dict:
        return {name: (lambda name=name: runs.append(name) or times[name]) for name in times}

    timer = lambda fn: fn()  # noqa: E731
    threads = torch.get_num_threads()
    assert _cpu("op", ("a",), candidates, timer) == ATEN
    times[ATEN] = 3.0  # kept: not timed again
    assert _cpu("op", ("a",), candidates, timer) == ATEN
    assert runs == [OURS, ATEN] and chosen("op", "cpu") == {("a", threads): ATEN}
    torch.set_num_threads(threads + 1)
    try:
        assert _cpu("op", ("a",), candidates, timer) == OURS
    finally:
        torch.set_num_threads(threads)
    assert len(runs) == 4 and chosen("op", "cpu")[("a", threads + 1)] == OURS


def test_deterministic_algorithms_take_the_projects_path(auto, monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "cpu_times", lambda built: pytest.fail("timed"))
    torch.use_deterministic_algorithms(True)
    try:
        assert _cpu("op", ("k",), dict) == OURS
    finally:
        torch.use_deterministic_algorithms(False)


def test_cpu_choices_are_kept_under_the_cpus_signature(auto, monkeypatch) -> None:
    """What cpu_times measured goes to the store under the CPU's signature, apart from the GPU's;
    a later process takes it without timing."""
    monkeypatch.setattr(dispatch, "cpu_times", lambda built: {k: fn() for k, fn in built.items()})
    candidates = lambda: {OURS: lambda: 2.0, ATEN: lambda: 1.0}  # noqa: E731
    assert _cpu("op", (8, 24), candidates) == ATEN
    stored = json.loads(auto.read_text())
    assert list(stored) == [choices.cpu_signature()]
    key = repr((8, 24, torch.get_num_threads()))
    assert stored[choices.cpu_signature()] == {"op": {key: ATEN}}

    monkeypatch.setattr(dispatch, "cpu_times", lambda built: pytest.fail("timed again"))
    forget()  # a later process
    assert _cpu("op", (8, 24), candidates) == ATEN
    assert choices.stored("op", eval(key)) is None  # the GPU's choices are others


def test_the_cpu_signature_names_the_instruction_sets_and_versions() -> None:
    text = choices.cpu_signature()
    assert choices.cpu_model() in text
    assert f"ATen {torch.backends.cpu.get_cpu_capability()}" in text and "oneDNN" in text
    assert f"torch {torch.__version__}" in text
    assert len(text.rsplit("| ", 1)[-1]) == 16


def _pointwise_case():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, 6, 5, generator=gen).contiguous(memory_format=torch.channels_last)
    x = x.requires_grad_()
    weight = torch.randn(12, 16, 1, 1, generator=gen, requires_grad=True)
    bias = torch.randn(12, generator=gen, requires_grad=True)
    return x, weight, bias


@pytest.mark.parametrize("winner", [OURS, ATEN])
def test_pointwise_conv_runs_the_winner(auto, monkeypatch, winner) -> None:
    monkeypatch.setattr(dispatch, "cpu_times", _slow(_other(winner)))
    x, weight, bias = _pointwise_case()
    y = pointwise_conv(x[:, 16:], weight, bias)  # the rows of a channel slice
    expected_node = "PointwiseConvCpuFunctionBackward" if winner == OURS else "ConvolutionBackward0"
    assert type(y.grad_fn).__name__ == expected_node
    assert x.grad is None and weight.grad is None  # timing left the caller's tensors alone
    expected = F.conv2d(x[:, 16:], weight, bias)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    assert list(chosen("pointwise_conv", "cpu").values()) == [winner]


@pytest.mark.parametrize("winner", [OURS, ATEN])
def test_batch_norm_runs_the_winner_and_counts_one_batch(auto, monkeypatch, winner) -> None:
    require_cpu_kernels()
    monkeypatch.setattr(dispatch, "cpu_times", _slow(_other(winner)))
    bn, reference = BatchNorm2d(6), torch.nn.BatchNorm2d(6)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, 4, 5, generator=gen).contiguous(memory_format=torch.channels_last)
    probe = torch.randn(3, 6, 4, 5, generator=gen)
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = bn(x_ours)
    expected_node = "BatchNormCpuFunctionBackward" if winner == OURS else "NativeBatchNormBackward0"
    assert type(y.grad_fn).__name__ == expected_node
    # the timed candidates updated no statistics: one batch counted, as nn.BatchNorm2d counts
    y_ref = reference(x_ref)
    assert bn.num_batches_tracked.item() == 1
    torch.testing.assert_close(bn.running_mean, reference.running_mean, rtol=0, atol=0)
    torch.testing.assert_close(bn.running_var, reference.running_var, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    grads = torch.autograd.grad(y, (x_ours, bn.weight, bn.bias), probe)
    expected = torch.autograd.grad(y_ref, (x_ref, reference.weight, reference.bias), probe)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("winner", [OURS, ATEN])
@pytest.mark.parametrize("grad", [True, False])
def test_dim_conv_runs_the_winner(auto, monkeypatch, winner, grad) -> None:
    """Training and inference are timed and chosen apart; each equals the eager path's numbers."""
    require_cpu_kernels()
    monkeypatch.setattr(dispatch, "cpu_times", _slow(_other(winner)))
    calls: list[str] = []
    kernel = src.kernels.dim_conv.dim_conv_cpu

    def counted(*args: object, **kwargs: object) -> object:
        calls.append("kernel")
        return kernel(*args, **kwargs)

    monkeypatch.setattr(src.kernels.dim_conv, "dim_conv_cpu", counted)
    dim_conv = DimConv(8, 5, 6)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, 5, 6, generator=gen).contiguous(memory_format=torch.channels_last)
    x.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        y = dim_conv(x)
    # the kernels ran once to be timed (the stand-in runs each candidate once), again if chosen
    assert len(calls) == (2 if winner == OURS else 1)
    weights = (dim_conv.weight_channel, dim_conv.weight_height, dim_conv.weight_width)
    with torch.set_grad_enabled(grad):
        expected = dim_conv_reference(x, weights, dilation=(1, 1, 1), interleave=True)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    assert list(chosen("dim_conv", "cpu")) == [
        (2, 8, 5, 6, torch.float32, None, (1, 1, 1), True, grad, torch.get_num_threads())
    ]
    assert list(chosen("dim_conv", "cpu").values()) == [winner]


def test_a_real_measurement_chooses_a_path_with_the_right_numbers(auto) -> None:
    """cpu_times itself: whichever path wins on this machine, the call's numbers are ATen's."""
    x, weight, bias = _pointwise_case()
    y = pointwise_conv(x[:, 16:], weight, bias)
    torch.testing.assert_close(y, F.conv2d(x[:, 16:], weight, bias), rtol=1e-5, atol=1e-5)
    (path,) = chosen("pointwise_conv", "cpu").values()
    assert path in (OURS, ATEN)
    assert auto.exists()  # and kept for later processes


def _other(name: str) -> str:
    return ATEN if name == OURS else OURS


def test_cpu_times_interleaves_and_repeats_short_calls(monkeypatch) -> None:
    """Each sample lasts about a millisecond: a 0.1 ms call is repeated ~10 times; the rounds
    alternate their order; the result is each candidate's median per-call time."""
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    calls: list[str] = []

    def candidate(name: str, seconds: float):
        def run() -> None:
            calls.append(name)
            clock[0] += seconds

        return run

    times = timing.cpu_times({"a": candidate("a", 1e-4), "b": candidate("b", 3e-4)}, rounds=3)
    assert times == pytest.approx({"a": 1e-4, "b": 3e-4})
    # warm-up a, b; then 10 calls per sample: a b, b a, a b
    runs = [name for i, name in enumerate(calls[2:]) if i % 10 == 0]
    assert calls[:2] == ["a", "b"] and runs == ["a", "b", "b", "a", "a", "b"]
    assert len(calls) == 2 + 3 * 2 * 10


def test_the_projects_path_must_win_by_the_margin(auto, monkeypatch) -> None:
    built = lambda: {OURS: lambda: None, ATEN: lambda: None}  # noqa: E731
    slightly = {OURS: 0.98, ATEN: 1.0}  # 2% faster: within the margin
    monkeypatch.setattr(dispatch, "cpu_times", lambda candidates: dict(slightly))
    assert _cpu("op", ("close",), built) == ATEN
    clearly = {OURS: 0.9, ATEN: 1.0}
    monkeypatch.setattr(dispatch, "cpu_times", lambda candidates: dict(clearly))
    assert _cpu("op", ("clear",), built) == OURS


@pytest.mark.parametrize("winner", [OURS, ATEN])
def test_relative_attention_runs_the_winner_with_the_same_numbers(
    auto, monkeypatch, winner
) -> None:
    """The one-node CPU attention and the eager ops give the same numbers bit for bit; the choice
    only picks which runs."""
    require_cpu_kernels()
    monkeypatch.setattr(dispatch, "cpu_times", _slow(_other(winner)))
    ran: list[str] = []
    fused = src.kernels.relative_attention.relative_attention_cpu
    monkeypatch.setattr(
        src.kernels.relative_attention,
        "relative_attention_cpu",
        lambda *a: ran.append("fused") or fused(*a),
    )
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 5, 4, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, 2, 7, 4, generator=gen, requires_grad=True) for _ in range(2))
    rk = torch.randn(2, 7, 4, generator=gen, requires_grad=True)
    r_w, r_r = (torch.randn(2, 4, generator=gen, requires_grad=True) for _ in range(2))
    mask = src.ops.relative_position.causal_memory_mask(5, 2)
    args = (q, k, v, rk, r_w, r_r)
    y = src.ops.relative_position.relative_attention(*args, mask=mask)
    assert len(ran) == (2 if winner == OURS else 1)  # timed once, run again if chosen
    assert list(chosen("relative_attention", "cpu").values()) == [winner]
    scale = 0.5  # 1 / sqrt(d_head 4)
    expected = src.kernels.relative_attention.eager_relative_attention(
        q + r_w.unsqueeze(-2), q + r_r.unsqueeze(-2), k, v, rk, mask, scale
    )
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
