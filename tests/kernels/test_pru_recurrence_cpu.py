"""The PRU recurrence's C++ kernels (``PRURecurrenceCpu``, the CPU path of
:func:`src.kernels.pru_recurrence.pru_recurrence`) against the float64 oracle, with MKL's packed
products and with plain sgemm: float32 outputs and gradients as close to it as the float32 PyTorch
loop is, in every operand and for every mix of output gradients; gradients independent of the
thread count; the whole sequence in one autograd node; every faulty operand rejected before memory
is read; the once-per-machine check of the two modes keeps the first that passes."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
import torch
from torch import Tensor

import src.kernels.pru_recurrence as recurrence
from src.kernels.environment import PRU_GEMM_ENV
from src.kernels.pru_recurrence import (
    GEMM_MODES,
    PRURecurrenceCpu,
    probed_gemm_mode,
    pru_recurrence,
    pru_recurrence_reference,
)
from tests.helpers import (
    KIND_FAULTS,
    SHAPE_FAULTS,
    assert_rejected,
    faulty_copies,
    require_cpu_kernels,
)


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_cpu_kernels()
    if not torch.ops.lightnets_cpu.pru_recurrence_available():
        pytest.skip("PyTorch is built without MKL: the recurrence takes the PyTorch loop")


def operands(steps: int, batch: int, groups: int, width: int, bias: bool) -> list[Tensor | None]:
    """float64 (P, W, b, h0, c0) at the scales of a trained PRU: unit pre-activations."""
    hidden = groups * width
    return [
        torch.randn(steps, batch, 4, hidden, dtype=torch.float64),
        torch.randn(groups, width, 4 * width, dtype=torch.float64) / width**0.5,
        torch.randn(groups, 4 * width, dtype=torch.float64) if bias else None,
        torch.randn(batch, hidden, dtype=torch.float64),
        torch.randn(batch, hidden, dtype=torch.float64),
    ]


def split_kernel(widths=None, mode: str | None = None):
    """``PRURecurrenceCpu`` with ``mode``'s products (default: this machine's) on P cut into
    levels of ``widths`` (default: the PTB pyramid's split, 3/4 and 1/4 of the units, whose
    boundary falls inside a task's chunk)."""
    packed = (mode or probed_gemm_mode()) == "packed"

    def kernel(inputs, weight, bias, h0, c0):
        hidden = inputs.shape[-1]
        sizes = widths or ([hidden] if hidden < 4 else [3 * hidden // 4, hidden - 3 * hidden // 4])
        return PRURecurrenceCpu.apply(weight, bias, h0, c0, packed, *inputs.split(sizes, dim=-1))

    return kernel


def run(fn, leaves: list[Tensor | None], probes: list[Tensor | None], dtype) -> list[Tensor]:
    """(output, h_T, c_T) and the leaves' gradients of sum(probe * output) over the probed
    outputs, the leaves and probes cast to ``dtype``."""
    leaves = [None if t is None else t.to(dtype, copy=True).requires_grad_() for t in leaves]
    outputs = fn(*leaves)
    loss = sum((o * p.to(dtype)).sum() for o, p in zip(outputs, probes) if p is not None)
    loss.backward()
    return [*outputs, *(t.grad for t in leaves if t is not None)]


# PTB's (g = 4, w = 350) at a small batch; one and several k-chunks a group, a partial last one
CASES = [(1, 1, 1, 8, True), (7, 3, 2, 70, True), (5, 5, 4, 100, False), (4, 2, 1, 130, True),
         (3, 4, 4, 350, True)]  # fmt: skip
# the pyramid's levels: one (K = 1), the official K = 2 and K = 3 splits, the paper's K = 3
SPLITS = {"one": None, "K2": "default", "K3": (0.5, 0.25, 0.25), "K3_paper": (1 / 3, 1 / 3, 1 / 3)}


def widths_of(split: str, hidden: int) -> list[int] | None:
    if split == "K2":
        return None
    if split == "one":
        return [hidden]
    parts = [int(hidden * f) for f in SPLITS[split][1:]]
    return [hidden - sum(parts), *parts]


@pytest.mark.parametrize("mode", GEMM_MODES)
@pytest.mark.parametrize("steps,batch,groups,width,bias", CASES)
@pytest.mark.parametrize("probed", ["all", "output", "state"])
@pytest.mark.parametrize("split", list(SPLITS))
def test_float32_is_as_close_to_the_float64_oracle_as_the_pytorch_loop(
    steps: int, batch: int, groups: int, width: int, bias: bool, probed: str, split: str, mode: str
) -> None:
    torch.manual_seed(steps * 100 + width)
    leaves = operands(steps, batch, groups, width, bias)
    hidden, double = groups * width, torch.float64
    probes = [torch.randn(steps, batch, hidden, dtype=double)] + [
        torch.randn(batch, hidden, dtype=double) for _ in range(2)
    ]
    if probed == "output":
        probes[1:] = [None, None]
    elif probed == "state":
        probes[0] = None
    oracle = run(pru_recurrence_reference, leaves, probes, double)
    got = run(split_kernel(widths_of(split, hidden), mode), leaves, probes, torch.float32)
    eager = run(pru_recurrence_reference, leaves, probes, torch.float32)
    assert len(got) == len(oracle) == len(eager)
    for g, e, o in zip(got, eager, oracle, strict=True):
        assert g.shape == o.shape and g.dtype == torch.float32
        error = (g.double() - o).abs().max().item()
        eager_error = (e.double() - o).abs().max().item()
        scale = float(o.detach().abs().max()) + 1
        # float32's rounding, not a wrong term: a wrong term is off by O(scale)
        assert error <= 4 * eager_error + 1e-6 * scale, (error, eager_error)


@pytest.mark.parametrize("mode", GEMM_MODES)
def test_gradients_do_not_depend_on_the_thread_count(mode: str) -> None:
    torch.manual_seed(0)
    leaves = operands(6, 5, 2, 150, True)
    probes = [torch.randn(6, 5, 300), torch.randn(5, 300), torch.randn(5, 300)]
    threads, runs = torch.get_num_threads(), []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            runs.append(run(split_kernel(mode=mode), leaves, probes, torch.float32))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert torch.equal(a, b)


def test_inference_equals_training_and_saves_nothing() -> None:
    torch.manual_seed(0)
    inputs, weight, bias, h0, c0 = (t.float() for t in operands(5, 3, 2, 70, True))
    trained = split_kernel()(inputs, weight.requires_grad_(), bias, h0, c0)
    saved: list[Tensor] = []
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t)
    with hooks, torch.no_grad():
        inferred = pru_recurrence(inputs, weight, bias, h0, c0)
    assert not saved
    for a, b in zip(trained, inferred, strict=True):
        assert torch.equal(a, b)


def test_no_steps_passes_the_state_through() -> None:
    inputs, weight, bias, h0, c0 = (t.float() for t in operands(0, 3, 2, 8, True))
    h0.requires_grad_()
    c0.requires_grad_()
    output, h, c = split_kernel()(inputs, weight, bias, h0, c0)
    assert output.shape == (0, 3, 16) and torch.equal(h, h0) and torch.equal(c, c0)
    (h.sum() + 2 * c.sum()).backward()
    assert torch.equal(h0.grad, torch.ones(3, 16)) and torch.equal(
        c0.grad, torch.full((3, 16), 2.0)
    )


def test_auto_takes_the_kernel_for_float32_and_the_loop_otherwise() -> None:
    inputs, weight, bias, h0, c0 = (t.float().requires_grad_() for t in operands(3, 2, 2, 8, True))
    output, _, _ = pru_recurrence(inputs, weight, bias, h0, c0)
    assert type(output.grad_fn).__name__ == "PRURecurrenceCpuBackward"
    output, _, _ = pru_recurrence(inputs.split([12, 4], -1), weight, bias, h0, c0)
    assert type(output.grad_fn).__name__ == "PRURecurrenceCpuBackward"
    output, _, _ = pru_recurrence(inputs, weight, bias, h0, c0, impl="reference")
    assert type(output.grad_fn).__name__ == "StackBackward0"
    output, _, _ = pru_recurrence(*(t.double() for t in (inputs, weight, bias, h0, c0)))
    assert type(output.grad_fn).__name__ == "StackBackward0"


def _forward_arguments() -> list:
    torch.manual_seed(0)
    inputs, weight, bias, h0, c0 = (t.float() for t in operands(3, 2, 2, 8, True))
    return [
        [level.contiguous() for level in inputs.split([12, 4], dim=-1)],
        weight,
        bias,
        h0,
        c0,
        True,
        probed_gemm_mode() == "packed",
    ]


def _backward_arguments() -> list:
    levels, weight, bias, h0, c0, _, packed = _forward_arguments()
    output, _, gates, cells = torch.ops.lightnets_cpu.pru_recurrence_forward(
        levels, weight, bias, h0, c0, True, packed
    )
    grads = [torch.randn_like(output), torch.randn_like(h0), torch.randn_like(c0)]
    return [*grads, gates, cells, output, weight, h0, c0, [12, 4], True, True, packed]


# operand -> (position, the dimensions the others fix)
FORWARD_OPERANDS = {"weight": (1, (1, 2)), "bias": (2, (0, 1)), "h0": (3, (0, 1)),
                    "c0": (4, (0, 1))}  # fmt: skip
BACKWARD_OPERANDS = {"grad_output": (0, (0, 1, 2)), "grad_h_last": (1, (0, 1)),
                     "grad_c_last": (2, (0, 1)), "gates": (3, (2, 3)), "cells": (4, (0, 1, 2)),
                     "output": (5, (0, 1, 2)), "weight": (6, (1, 2)), "h0": (7, (0, 1)),
                     "c0": (8, (0, 1))}  # fmt: skip
FAULTS = (*SHAPE_FAULTS, *KIND_FAULTS)


@pytest.mark.parametrize("name,fault", [(n, f) for n in FORWARD_OPERANDS for f in FAULTS])
def test_forward_rejects_a_faulty_operand(name: str, fault: str) -> None:
    position, fixed = FORWARD_OPERANDS[name]
    assert_rejected("pru_recurrence_forward", _forward_arguments(), name, position, fault, fixed)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("which", [0, 1])
def test_forward_rejects_a_faulty_level(fault: str, which: int) -> None:
    args = _forward_arguments()
    kernel = torch.ops.lightnets_cpu.pru_recurrence_forward
    for bad in faulty_copies(args[0][which], fault, (2, 3)):
        levels = list(args[0])
        levels[which] = bad
        with torch.set_grad_enabled(fault == "requires_grad"), pytest.raises(RuntimeError) as error:
            kernel(levels, *args[1:])
        message = str(error.value)
        assert message.startswith("pru_recurrence_forward: levels "), message
        if fault in SHAPE_FAULTS:
            assert str(list(bad.shape)) in message, message
        else:
            assert KIND_FAULTS[fault] in message, message


@pytest.mark.parametrize("name,fault", [(n, f) for n in BACKWARD_OPERANDS for f in FAULTS])
def test_backward_rejects_a_faulty_operand(name: str, fault: str) -> None:
    position, fixed = BACKWARD_OPERANDS[name]
    assert_rejected("pru_recurrence_backward", _backward_arguments(), name, position, fault, fixed)


@pytest.mark.parametrize("widths", [[12], [12, 5], [16, 0], [20, -4]])
def test_backward_rejects_widths_that_do_not_sum_to_the_units(widths: list[int]) -> None:
    args = _backward_arguments()
    args[9] = widths
    with pytest.raises(RuntimeError, match=r"pru_recurrence_backward: widths .* must be positive "
                                           r"and sum to M = 16"):  # fmt: skip
        torch.ops.lightnets_cpu.pru_recurrence_backward(*args)


@pytest.fixture
def fresh_probe(monkeypatch, tmp_path):
    """The probe with no verdict yet: its record in ``tmp_path``, no mode named in the
    environment; the process's verdict restored afterwards."""
    monkeypatch.delenv(PRU_GEMM_ENV, raising=False)
    monkeypatch.setattr(recurrence, "current_build_directory", lambda: tmp_path)
    recurrence.probed_gemm_mode.cache_clear()
    yield tmp_path
    recurrence.probed_gemm_mode.cache_clear()


def test_the_probe_keeps_the_first_mode_that_passes_and_remembers_it(fresh_probe, monkeypatch):
    checked = []

    def check(mode: str) -> str | None:
        checked.append(mode)
        return f"{mode} products: the check died of SIGSEGV" if mode == GEMM_MODES[0] else None

    monkeypatch.setattr(recurrence, "_run_check", check)
    second = GEMM_MODES[1]
    with pytest.warns(RuntimeWarning, match=rf"died of SIGSEGV; the recurrence uses {second}"):
        assert recurrence.probed_gemm_mode() == second
    assert checked == list(GEMM_MODES)
    record = json.loads((fresh_probe / recurrence.PROBE_FILE).read_text())
    assert record["mode"] == second and record["processor"] == recurrence.cpu_model()
    # the next process reads the verdict instead of checking again
    recurrence.probed_gemm_mode.cache_clear()
    monkeypatch.setattr(recurrence, "_run_check", lambda mode: pytest.fail("checked again"))
    assert recurrence.probed_gemm_mode() == second


def test_a_machine_where_both_modes_fail_takes_the_pytorch_loop(fresh_probe, monkeypatch):
    monkeypatch.setattr(recurrence, "_run_check", lambda mode: f"{mode} products: off by 1e+00")
    with pytest.warns(RuntimeWarning, match=r"the recurrence takes the PyTorch loop"):
        assert recurrence.probed_gemm_mode() is None
    inputs, weight, bias, h0, c0 = (t.float().requires_grad_() for t in operands(3, 2, 2, 8, True))
    output, _, _ = pru_recurrence(inputs, weight, bias, h0, c0)
    assert type(output.grad_fn).__name__ == "StackBackward0"


def test_a_mode_named_in_the_environment_is_taken_unchecked(fresh_probe, monkeypatch):
    monkeypatch.setattr(recurrence, "_run_check", lambda mode: pytest.fail("checked"))
    monkeypatch.setenv(PRU_GEMM_ENV, "plain")
    assert recurrence.probed_gemm_mode() == "plain"
    recurrence.probed_gemm_mode.cache_clear()
    monkeypatch.setenv(PRU_GEMM_ENV, "fast")
    with pytest.raises(ValueError, match=r"LIGHTNETS_PRU_GEMM must be one of"):
        recurrence.probed_gemm_mode()


def test_the_check_catches_a_wrong_product(monkeypatch):
    apply = PRURecurrenceCpu.apply

    def off(weight, bias, h0, c0, packed, *levels):
        output, h, c = apply(weight, bias, h0, c0, packed, *levels)
        return output * (1 + 1e-3), h, c

    monkeypatch.setattr(PRURecurrenceCpu, "apply", off)
    threads = torch.get_num_threads()
    try:
        failure = recurrence.check_gemm_mode("plain", 1)
    finally:
        torch.set_num_threads(threads)
    assert failure is not None and failure.startswith("plain products off by ")


def test_a_child_that_dies_is_reported_by_its_signal(monkeypatch):
    died = subprocess.CompletedProcess([], -signal.SIGSEGV, "", "")
    monkeypatch.setattr(recurrence.subprocess, "run", lambda *args, **kwargs: died)
    assert recurrence._run_check("packed") == "packed products: the check died of SIGSEGV"


def test_the_chosen_mode_passes_its_check_in_a_child_process():
    mode = probed_gemm_mode()
    assert mode in GEMM_MODES
    assert recurrence._run_check(mode) is None
