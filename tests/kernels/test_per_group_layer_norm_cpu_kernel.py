"""The per-group norm's fused C++ kernels (``per_group_layer_norm_cpu``, the CPU path of
``PerGroupLayerNorm`` where they are built) against the PyTorch path (``PerGroupLayerNormFunction``)
and autograd through the plain passes: float32 values and gradients within 1e-5, 16-bit inputs
normalised in float32, gradients independent of the thread count (finite gradients on constant
groups: ``test_per_group_layer_norm_function.py``), and every faulty operand rejected before
memory is read."""

from __future__ import annotations

import pytest
import torch

import src.kernels.per_group_layer_norm
from src.kernels.per_group_layer_norm import (
    PerGroupLayerNormFunction,
    per_group_layer_norm_cpu,
    per_group_layer_norm_reference,
)
from src.ops.per_group_layer_norm import PerGroupLayerNorm
from tests.helpers import KIND_FAULTS, SHAPE_FAULTS, assert_rejected, require_cpu_kernels

EPS = 1e-6


@pytest.fixture(autouse=True)
def kernels() -> None:
    require_cpu_kernels()


def _leaves(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    x = torch.randn(*shape).mul_(3).add_(1).to(dtype).requires_grad_()
    weight = torch.randn(shape[-1]).requires_grad_()
    return x, weight, torch.randn(shape[-1]).requires_grad_()


def _run(fn, shape: tuple[int, ...], groups: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """``fn``'s output and the gradients of (x, weight, bias) for a random probe, seeded."""
    torch.manual_seed(0)
    leaves = _leaves(shape, dtype)
    probe = torch.randn(shape)
    y = fn(*leaves, groups, EPS)
    (y * probe).sum().backward()
    return [y, *(leaf.grad for leaf in leaves)]


# Group-Transformer's norms at enwik8 width (d_model 256, d_inner 1024; G = 2, 4), odd sizes, rows
# of every dimensionality
SHAPES = [((4, 7, 256), 2), ((3, 5, 1024), 4), ((2, 3, 512), 8), ((9, 32), 1), ((2, 5, 96), 8),
          ((1, 2, 3, 30), 3), ((5, 3), 1)]  # fmt: skip


@pytest.mark.parametrize("shape,groups", SHAPES)
def test_float32_matches_the_pytorch_path_and_autograd(shape: tuple[int, ...], groups: int) -> None:
    got = _run(per_group_layer_norm_cpu, shape, groups, torch.float32)
    for oracle in (PerGroupLayerNormFunction.apply, per_group_layer_norm_reference):
        want = _run(oracle, shape, groups, torch.float32)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_inputs_are_normalised_in_float32(dtype: torch.dtype) -> None:
    got = _run(per_group_layer_norm_cpu, (3, 5, 64), 2, dtype)
    want = _run(PerGroupLayerNormFunction.apply, (3, 5, 64), 2, dtype)
    assert got[0].dtype == torch.float32 and got[1].dtype == dtype
    # the output and parameter gradients are float32 in both; the input gradient is rounded to
    # the input's dtype from float32 values that agree to 1e-5, so within one of its units
    for g, w in zip(got[::2] + got[3:], want[::2] + want[3:], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1])  # the dtype's default tolerance


def test_gradients_do_not_depend_on_the_thread_count() -> None:
    threads = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            runs.append(_run(per_group_layer_norm_cpu, (300, 64), 4, torch.float32))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert torch.equal(a, b)


def test_it_keeps_x_in_its_dtype_and_two_statistics_per_group() -> None:
    x, weight, bias = _leaves((16, 96), torch.bfloat16)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        per_group_layer_norm_cpu(x, weight, bias, 4, EPS)
    assert sorted((tuple(t.shape), t.dtype) for t in saved) == sorted(
        [((16, 96), torch.bfloat16), ((96,), torch.float32)] + [((16, 4), torch.float32)] * 2
    )


@pytest.mark.parametrize(
    "impl,built,function",
    [("auto", True, "PerGroupLayerNormCpuBackward"),
     ("auto", False, "PerGroupLayerNormFunctionBackward"),
     ("reference", True, "PerGroupLayerNormFunctionBackward")],
)  # fmt: skip
def test_module_runs_the_kernels_eagerly_on_the_cpu(
    impl: str, built: bool, function: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(src.kernels.per_group_layer_norm, "cpu_kernels_loaded", lambda: built)
    norm = PerGroupLayerNorm(16, 4, impl=impl)
    y = norm(torch.randn(3, 16, requires_grad=True))
    assert type(y.grad_fn).__name__ == function


def _forward_arguments() -> list:
    torch.manual_seed(0)
    return [torch.randn(6, 32), torch.randn(32), torch.randn(32), 4, EPS]


def _backward_arguments() -> list:
    x, weight, bias, groups, eps = _forward_arguments()
    _, mean, std = torch.ops.lightnets_cpu.per_group_norm_forward(x, weight, bias, groups, eps)
    return [torch.randn(6, 32), x, weight, mean, std, groups, eps]


FORWARD_OPERANDS = {"x": 0, "weight": 1, "bias": 2}
BACKWARD_OPERANDS = {"grad_y": 0, "x": 1, "weight": 2, "mean": 3, "std": 4}


def _faults(name: str) -> list[str]:
    """The faults that make ``name`` invalid: x may be 16-bit, and a vector has no other shape
    with as many elements and dimensions."""
    skip = {"x": "bfloat16", "weight": "reshaped", "bias": "reshaped"}.get(name)
    return [f for f in (*SHAPE_FAULTS, *KIND_FAULTS) if f != skip]


@pytest.mark.parametrize("name,fault", [(n, f) for n in FORWARD_OPERANDS for f in _faults(n)])
def test_forward_rejects_a_faulty_operand(name: str, fault: str) -> None:
    args = _forward_arguments()
    # any number of rows: x's width alone is fixed (by the parameters)
    fixed = (1,) if name == "x" else (0,)
    assert_rejected("per_group_norm_forward", args, name, FORWARD_OPERANDS[name], fault, fixed)


@pytest.mark.parametrize("name,fault", [(n, f) for n in BACKWARD_OPERANDS for f in _faults(n)])
def test_backward_rejects_a_faulty_operand(name: str, fault: str) -> None:
    args = _backward_arguments()
    position = BACKWARD_OPERANDS[name]
    fixed = tuple(range(args[position].dim()))  # every size is fixed by another operand's
    assert_rejected("per_group_norm_backward", args, name, position, fault, fixed)


@pytest.mark.parametrize(
    "groups,eps,match",
    [(0, EPS, r"divisible by groups \(0\)"), (5, EPS, r"divisible by groups \(5\)"),
     (32, EPS, "at least 2 features"), (4, -1.0, "eps must be >= 0")],
)  # fmt: skip
def test_bad_sizes_are_rejected(groups: int, eps: float, match: str) -> None:
    forward = _forward_arguments()
    backward = _backward_arguments()
    with pytest.raises(RuntimeError, match=match):
        torch.ops.lightnets_cpu.per_group_norm_forward(*forward[:3], groups, eps)
    with pytest.raises(RuntimeError, match=match):
        torch.ops.lightnets_cpu.per_group_norm_backward(*backward[:5], groups, eps)
