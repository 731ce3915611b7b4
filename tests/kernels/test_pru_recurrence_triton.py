"""The PRU recurrence's Triton cell kernels (``src/kernels/pru_recurrence/triton_kernel.py``;
compiled on CUDA, Triton's interpreter on the CPU) against the PyTorch loop, forward and backward.

Tolerances: in float32 both paths compute the same equations in float32 and differ only in the
rounding of tanh and sigmoid (a few ulp), in the order of the bias addition inside the product, and
in the summation order of the weight and bias gradients (one product over all T B rows against a
sum of T products): rtol 1e-5, atol 1e-6 hold over five steps (the largest gap measured is 0.6 of
them, on the bias gradient at T = 20). In bfloat16 the kernels round once on each store where the
PyTorch loop rounds after every op; against the float32 loop on the same rounded operands both
land within a few bfloat16 ulps (2^-8 relative) of values of order one, carried through the steps
and, backward, through the bfloat16 products: 1.3e-2 at most measured in the interpreter (which
casts to bfloat16 by truncation), the bfloat16 PyTorch loop's own gap 2.8e-2 on the bias gradient.
rtol and atol 2e-2 (five ulps). In float16 (2^-11) the same reasoning gives 4e-3 (3.6e-3 measured
on the bias gradient of magnitude 2.7).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from src.kernels.pru_recurrence import pru_recurrence_reference

pytest.importorskip("triton")

import triton
import triton.language as tl

from src.kernels.pru_recurrence.triton_kernel import _tanh, pru_recurrence_triton

HIDDEN = 8
FLOAT32 = {"rtol": 1e-5, "atol": 1e-6}
HALF = {torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}, torch.float16: {"rtol": 4e-3, "atol": 4e-3}}


def _operands(
    steps: int, batch: int, groups: int, bias: bool, device: torch.device, seed: int = 0
) -> list[Tensor | None]:
    """inputs (T, B, 4, M), weight (g, w, 4w), bias (g, 4w) or None, h0 and c0 (B, M), float32:
    scaled so that the gates range over their non-linear parts."""
    gen = torch.Generator().manual_seed(seed)
    width = HIDDEN // groups
    shapes = {
        "inputs": (steps, batch, 4, HIDDEN),
        "weight": (groups, width, 4 * width),
        "bias": (groups, 4 * width),
        "h0": (batch, HIDDEN),
        "c0": (batch, HIDDEN),
    }
    scales = {"inputs": 1.0, "weight": 0.7, "bias": 0.5, "h0": 0.8, "c0": 1.5}
    return [
        (torch.randn(shape, generator=gen) * scales[name]).to(device)
        if name != "bias" or bias
        else None
        for name, shape in shapes.items()
    ]


def _run(fn, operands: list[Tensor | None], probes: list[Tensor]) -> list[Tensor | None]:
    """Outputs (output, h_T, c_T) and the gradients of every operand under the loss
    sum(outputs * probes)."""
    leaves = [t.detach().requires_grad_() if t is not None else None for t in operands]
    outputs = fn(*leaves)
    loss = sum((y.float() * p).sum() for y, p in zip(outputs, probes, strict=True))
    loss.backward()
    return [*outputs, *(t.grad if t is not None else None for t in leaves)]


def _probes(steps: int, batch: int, device: torch.device) -> list[Tensor]:
    gen = torch.Generator().manual_seed(1)
    shapes = [(steps, batch, HIDDEN), (batch, HIDDEN), (batch, HIDDEN)]
    return [torch.randn(shape, generator=gen).to(device) for shape in shapes]


NAMES = ["output", "h_T", "c_T", "grad_inputs", "grad_weight", "grad_bias", "grad_h0", "grad_c0"]


def _assert_all_close(got: list, expected: list, **tolerance: float) -> None:
    for name, a, e in zip(NAMES, got, expected, strict=True):
        if e is None:
            assert a is None, name
            continue
        assert a.dtype == e.dtype, name
        torch.testing.assert_close(
            a.float(), e.float(), **tolerance, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("steps,batch", [(1, 3), (5, 1), (5, 3)])
def test_matches_reference(
    steps: int, batch: int, groups: int, bias: bool, kernel_device: torch.device
) -> None:
    operands = _operands(steps, batch, groups, bias, kernel_device)
    probes = _probes(steps, batch, kernel_device)
    got = _run(pru_recurrence_triton, operands, probes)
    expected = _run(pru_recurrence_reference, operands, probes)
    _assert_all_close(got, expected, **FLOAT32)


def test_gradient_only_where_asked(kernel_device: torch.device) -> None:
    """Gradients for the operands that ask (inputs and c0 here), none for the others; the same
    numbers as when every operand asks."""
    inputs, weight, bias, h0, c0 = _operands(4, 2, 2, True, kernel_device)
    probes = _probes(4, 2, kernel_device)
    leaves = {"inputs": inputs.clone().requires_grad_(), "c0": c0.clone().requires_grad_()}
    outputs = pru_recurrence_triton(leaves["inputs"], weight, bias, h0, leaves["c0"])
    sum((y * p).sum() for y, p in zip(outputs, probes, strict=True)).backward()
    full = _run(pru_recurrence_reference, [inputs, weight, bias, h0, c0], probes)
    torch.testing.assert_close(leaves["inputs"].grad, full[3], **FLOAT32)
    torch.testing.assert_close(leaves["c0"].grad, full[7], **FLOAT32)
    assert not any(t.requires_grad for t in (weight, bias, h0))


def test_without_gradient(kernel_device: torch.device) -> None:
    """Under no_grad the kernels keep two cells in turn and no gates: the same outputs."""
    operands = _operands(5, 3, 2, True, kernel_device)
    with torch.no_grad():
        got = pru_recurrence_triton(*operands)
    expected = pru_recurrence_reference(*operands)
    for a, e in zip(got, expected, strict=True):
        assert not a.requires_grad
        torch.testing.assert_close(a, e, **FLOAT32)


def test_empty_sequence(kernel_device: torch.device) -> None:
    """T = 0: an empty output, and the initial state passed through with its gradients."""
    inputs, weight, bias, h0, c0 = _operands(0, 3, 2, True, kernel_device)
    h0.requires_grad_()
    c0.requires_grad_()
    output, h_last, c_last = pru_recurrence_triton(inputs, weight, bias, h0, c0)
    assert output.shape == (0, 3, HIDDEN)
    torch.testing.assert_close(h_last, h0, rtol=0, atol=0)
    torch.testing.assert_close(c_last, c0, rtol=0, atol=0)
    (2 * h_last.sum() + 3 * c_last.sum()).backward()
    torch.testing.assert_close(h0.grad, torch.full_like(h0, 2.0), rtol=0, atol=0)
    torch.testing.assert_close(c0.grad, torch.full_like(c0, 3.0), rtol=0, atol=0)


def test_empty_batch_is_refused(kernel_device: torch.device) -> None:
    """B = 0: the kernels say so before launching anything."""
    with pytest.raises(ValueError, match="B, M >= 1"):
        pru_recurrence_triton(*_operands(3, 0, 2, True, kernel_device))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_storage(dtype: torch.dtype, kernel_device: torch.device) -> None:
    """16-bit operands: outputs and gradients in that dtype, near the float32 loop run on the
    same rounded operands."""
    operands = [
        t.to(dtype) if t is not None else None for t in _operands(5, 3, 2, True, kernel_device)
    ]
    probes = _probes(5, 3, kernel_device)
    got = _run(pru_recurrence_triton, operands, probes)
    widened = [t.float() if t is not None else None for t in operands]
    expected = _run(pru_recurrence_reference, widened, probes)
    for name, a, e in zip(NAMES, got, expected, strict=True):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a.float(), e, **HALF[dtype], msg=lambda m, n=name: f"{n}: {m}")
    # the tolerance is not vacuous: the outputs move by more than it between two seeds
    other = pru_recurrence_reference(*_operands(5, 3, 2, True, kernel_device, seed=2))
    assert (other[0] - expected[0]).abs().max() > 10 * HALF[torch.bfloat16]["atol"]


def test_rejects_float64(kernel_device: torch.device) -> None:
    operands = [
        t.double() if t is not None else None for t in _operands(2, 1, 2, True, kernel_device)
    ]
    with pytest.raises(TypeError, match="float64"):
        pru_recurrence_triton(*operands)


@triton.jit
def _tanh_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + n, mask=n < N, other=0.0)
    tl.store(y_ptr + n, _tanh(x), mask=n < N)


def test_tanh_within_few_ulp(kernel_device: torch.device) -> None:
    """The kernels' float32 tanh against float64's, rounded: within 4 ulp of the result, small
    arguments included, exactly +-1 far out, NaN for NaN."""
    x = torch.cat([
        torch.linspace(-12.0, 12.0, 4001),
        torch.logspace(-30, 0, 200),
        -torch.logspace(-30, 0, 200),
        torch.tensor([0.0, 0.624, 0.625, 0.626, 50.0, -50.0, 1e30, float("nan")]),
    ]).to(kernel_device)  # fmt: skip
    y = torch.empty_like(x)
    _tanh_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    exact = torch.tanh(x.double())
    ulp = torch.finfo(torch.float32).eps * exact.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert ((y.double() - exact)[:-1].abs() <= 4 * ulp[:-1]).all()
    assert y[-4:-1].tolist() == [1.0, -1.0, 1.0]
    assert y[-1].isnan()
