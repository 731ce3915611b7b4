"""The PRU recurrence's time-loop kernels (``src/kernels/pru_recurrence/triton_time_loop.py``;
compiled on CUDA, Triton's interpreter on the CPU) against the PyTorch loop in float64, forward and
backward.

Tolerances: the kernels compute in float32 what the oracle computes in float64; over these
shapes the largest gap measured is 1.6e-6 (h_0's gradient, values up to 5), so rtol and atol 1e-5
hold with room, while a wrong gate, step or group moves the numbers by 1e-1 or more. In bfloat16
the kernels round once on each store (outputs, cells, gates, dG): against the float32 loop on the
same rounded operands, a few bfloat16 ulps (2^-8 relative) carried through the steps, as for the
per-step kernels (``tests/kernels/test_pru_recurrence_triton.py``): rtol and atol 2e-2, where 1.8e-2
is the largest gap measured in the interpreter (which casts to bfloat16 by truncation) at w = 8,
the per-step kernels' 2.6e-2 and the bfloat16 PyTorch loop's 2.4e-2 (values up to 4).

The interpreter's blocks are 16 wide: w = 20 runs two blocks of K and N, B = 17 two batch tiles.
Which path the op takes (``triton_path``) is read from the launches it records for an H100.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from torch import Tensor
from torch._dynamo.backends.debugging import aot_eager

from src.kernels.dispatch import timings
from src.kernels.pru_recurrence import (
    TRITON_PATHS,
    pru_recurrence,
    pru_recurrence_reference,
    triton_path,
    triton_recurrence,
)

pytest.importorskip("triton")

from benchmarks.cross_compile import H100, recorded_launches
from src.kernels.pru_recurrence.triton_time_loop import pru_recurrence_time_loop

# launches are recorded (for an H100, not run) in the interpreter only
INTERPRETER = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="launches are recorded in the interpreter"
)
FLOAT64 = {"rtol": 1e-5, "atol": 1e-5}
BFLOAT16 = {"rtol": 2e-2, "atol": 2e-2}
NAMES = ["output", "h_T", "c_T", "grad_inputs", "grad_weight", "grad_bias", "grad_h0", "grad_c0"]


def _operands(
    steps: int, batch: int, groups: int, width: int, *, bias: bool, state: bool, seed: int = 0
) -> list[Tensor | None]:
    """inputs (T, B, 4, M), weight (g, w, 4w), bias (g, 4w) or None, h0 and c0 (B, M) (zeros
    without ``state``, as a sequence starts), float32, on the CPU: scaled so that the gates range
    over their non-linear parts."""
    gen = torch.Generator().manual_seed(seed)
    hidden = groups * width

    def draw(scale: float, *shape: int) -> Tensor:
        return torch.randn(shape, generator=gen) * scale

    return [
        draw(1.0, steps, batch, 4, hidden),
        draw(0.7, groups, width, 4 * width),
        draw(0.5, groups, 4 * width) if bias else None,
        draw(0.8, batch, hidden) if state else torch.zeros(batch, hidden),
        draw(1.5, batch, hidden) if state else torch.zeros(batch, hidden),
    ]


def _probes(steps: int, batch: int, hidden: int) -> list[Tensor]:
    gen = torch.Generator().manual_seed(1)
    shapes = [(steps, batch, hidden), (batch, hidden), (batch, hidden)]
    return [torch.randn(shape, generator=gen) for shape in shapes]


def _run(
    fn, operands: list[Tensor | None], probes: list[Tensor], asks: list[bool], **to
) -> list[Tensor | None]:
    """Outputs (output, h_T, c_T) and the gradients, under the loss sum(outputs * probes), of the
    operands that ``asks`` (None for the others), all moved by ``to`` (device, dtype) first."""
    leaves = [
        None if t is None else t.to(**to, copy=True).requires_grad_(ask)
        for t, ask in zip(operands, asks, strict=True)
    ]
    outputs = fn(*leaves)
    loss = sum((y * p.to(**to)).sum() for y, p in zip(outputs, probes, strict=True))
    loss.backward()
    return [*outputs, *(t.grad if t is not None else None for t in leaves)]


def _compare(device: torch.device, operands, asks, dtype=torch.float32, reference_dtype=None):
    """The kernels' outputs and gradients next to the reference's, each pair as float64."""
    steps, batch, _, hidden = operands[0].shape
    probes = _probes(steps, batch, hidden)
    got = _run(pru_recurrence_time_loop, operands, probes, asks, device=device, dtype=dtype)
    rounded = [t if t is None else t.to(dtype) for t in operands]
    expected = _run(
        pru_recurrence_reference, rounded, probes, asks, device=device,
        dtype=reference_dtype or torch.float64,
    )  # fmt: skip
    for name, a, e in zip(NAMES, got, expected, strict=True):
        assert (a is None) == (e is None), name
        if a is not None:
            assert a.dtype == dtype, name
            yield name, a.double(), e.double()


# (T, B, g, w): g 1, 2 and 4; M = 5, 40, 12, 6 (none a power of two); two blocks of K and N at
# w = 20, two batch tiles at B = 17
SHAPES = [(3, 2, 1, 5), (4, 3, 2, 20), (5, 2, 4, 3), (3, 17, 2, 3)]


@pytest.mark.parametrize("state", [True, False], ids=["state", "zero-state"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}-B{}-g{}-w{}".format(*s))
def test_matches_float64_reference(
    shape: tuple[int, int, int, int], bias: bool, state: bool, kernel_device: torch.device
) -> None:
    operands = _operands(*shape, bias=bias, state=state)
    # the initial state asks for its gradient when it is given, as a carried state's would
    asks = [True, True, bias, state, state]
    for name, a, e in _compare(kernel_device, operands, asks):
        torch.testing.assert_close(a, e, **FLOAT64, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(
    "asks",
    [[True, False, False, False, True], [False, False, False, True, True]],
    ids=["inputs-c0", "state-only"],
)
def test_gradient_only_where_asked(asks: list[bool], kernel_device: torch.device) -> None:
    """Gradients for the operands that ask, none for the others; with only the state asking,
    the kernel keeps two steps' dG in turn instead of all T."""
    operands = _operands(4, 3, 2, 20, bias=True, state=True)
    compared = {name: (a, e) for name, a, e in _compare(kernel_device, operands, asks)}
    assert list(compared) == NAMES[:3] + [n for n, ask in zip(NAMES[3:], asks, strict=True) if ask]
    for name, (a, e) in compared.items():
        torch.testing.assert_close(a, e, **FLOAT64, msg=lambda m, n=name: f"{n}: {m}")
        assert e.abs().max() > 0.1, name  # not vacuous: every compared value is of order one


def test_without_gradient(kernel_device: torch.device) -> None:
    """Under no_grad the kernel keeps two cells in turn and no gates: the same outputs."""
    operands = [t.to(kernel_device) for t in _operands(5, 3, 2, 20, bias=True, state=True)]
    leaves = [t.requires_grad_() for t in operands]
    with torch.no_grad():
        got = pru_recurrence_time_loop(*leaves)
    expected = pru_recurrence_reference(*(t.detach().double() for t in operands))
    for a, e in zip(got, expected, strict=True):
        assert not a.requires_grad
        torch.testing.assert_close(a.double(), e, **FLOAT64)


def test_bfloat16_storage(kernel_device: torch.device) -> None:
    """bfloat16 operands: outputs and gradients in bfloat16, near the float32 loop run on the
    same rounded operands."""
    operands = _operands(5, 3, 2, 8, bias=True, state=True)
    pairs = _compare(
        kernel_device, operands, [True] * 5, dtype=torch.bfloat16, reference_dtype=torch.float32
    )
    for name, a, e in pairs:
        torch.testing.assert_close(a, e, **BFLOAT16, msg=lambda m, n=name: f"{n}: {m}")


def test_empty_sequence(kernel_device: torch.device) -> None:
    """T = 0: an empty output, and the initial state passed through with its gradients."""
    inputs, weight, bias, h0, c0 = (
        t.to(kernel_device) for t in _operands(0, 3, 2, 3, bias=True, state=True)
    )
    h0.requires_grad_()
    c0.requires_grad_()
    output, h_last, c_last = pru_recurrence_time_loop(inputs, weight, bias, h0, c0)
    assert output.shape == (0, 3, 6)
    (2 * h_last.sum() + 3 * c_last.sum()).backward()
    torch.testing.assert_close(h0.grad, torch.full_like(h0, 2.0), rtol=0, atol=0)
    torch.testing.assert_close(c0.grad, torch.full_like(c0, 3.0), rtol=0, atol=0)


def test_refuses_empty_batch_and_float64(kernel_device: torch.device) -> None:
    operands = [t.to(kernel_device) for t in _operands(3, 0, 2, 3, bias=True, state=True)]
    with pytest.raises(ValueError, match="B, M >= 1"):
        pru_recurrence_time_loop(*operands)
    operands = [t.to(kernel_device).double() for t in _operands(2, 1, 2, 3, bias=True, state=True)]
    with pytest.raises(TypeError, match="float64"):
        pru_recurrence_time_loop(*operands)


def test_one_node_each_way_under_compile(kernel_device: torch.device) -> None:
    """``torch.compile(fullgraph=True)`` of the op takes the time loop and keeps it as the custom
    op (no graph break, no trace of the kernels), its backward as the backward op: the numbers of
    the eager call."""
    torch._dynamo.reset()
    operands = _operands(3, 2, 2, 3, bias=True, state=True)
    probes = _probes(3, 2, 6)
    traced = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        traced.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return aot_eager(gm, example_inputs)

    op = functools.partial(pru_recurrence, impl="triton")
    compiled = torch.compile(op, fullgraph=True, backend=backend)
    asks = [True] * 5
    got = _run(compiled, operands, probes, asks, device=kernel_device)
    eager = _run(pru_recurrence_time_loop, operands, probes, asks, device=kernel_device)
    assert traced.count("lightnets.pru_time_loop.default") == 1, traced
    for name, a, e in zip(NAMES, got, eager, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")


def _launched_kernels(path: str | None, operands: list[Tensor | None]) -> list[str]:
    """The Triton kernels (names) that a training call of the recurrence launches, forward and
    backward, on ``path`` (None: the one :func:`pru_recurrence` picks), recorded for an H100 and
    not run."""
    leaves = [None if t is None else t.clone().requires_grad_() for t in operands]
    with recorded_launches(H100) as launches:
        if path is None:
            outputs = pru_recurrence(*leaves, impl="triton")
        else:
            outputs = triton_recurrence(path)(*leaves)
        outputs[0].sum().backward()
    return [launch.kernel.split(":")[-1] for launch in launches]


@INTERPRETER
def test_the_time_loop_is_one_launch_each_way_and_the_default_off_cuda(fresh_choices) -> None:
    """On CPU tensors (the interpreter, launches recorded for a GPU) the recurrence takes the time
    loop untimed: one launch forward and one backward for all T steps, where the per-step path
    launches a cell kernel per step each way."""
    operands = _operands(6, 2, 2, 3, bias=True, state=True)
    assert triton_path(*operands) == "time_loop"
    assert timings() == 0
    time_loop = ["_pru_time_loop_fwd_kernel", "_pru_time_loop_bwd_kernel"]
    assert _launched_kernels(None, operands) == time_loop
    assert _launched_kernels("time_loop", operands) == time_loop
    per_step = _launched_kernels("per_step", operands)
    assert per_step == ["_pru_cell_fwd_kernel"] * 6 + ["_pru_cell_bwd_kernel"] * 6


@INTERPRETER
@pytest.mark.parametrize("faster", TRITON_PATHS)
def test_the_timed_choice_keeps_the_faster(faster: str, fresh_choices) -> None:
    """Timed (a stand-in timer: a candidate's Triton launches, the time loop's fewer), the
    faster is kept for the shape and not timed again; a timer that ranks the other way takes the
    per-step path."""
    operands = _operands(4, 2, 2, 3, bias=True, state=True)
    for t in operands:
        if t is not None:
            t.requires_grad_()
    sign = 1 if faster == "time_loop" else -1

    def timer(call) -> float:
        with recorded_launches(H100) as launches:
            call()
        return sign * len(launches)

    assert triton_path(*operands, timer=timer) == faster
    assert timings() == 1
    assert triton_path(*operands, timer=timer) == faster
    assert timings() == 1
