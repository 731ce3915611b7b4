"""The contract of the PRU's recurrence (:mod:`src.kernels.pru_recurrence`): its operands' shapes,
which the reference, the C++ kernels and the Triton kernels (:mod:`.triton_kernel`) all take. The
C++ kernels are called inside an autograd Function eagerly and, traced, as the custom ops
``lightnets::pru_recurrence_cpu`` (differentiable) and ``lightnets::pru_recurrence_cpu_backward``;
the per-step Triton ones inside an autograd Function; the time-loop kernels
(:mod:`.triton_time_loop`) are the custom ops ``lightnets::pru_time_loop`` (differentiable) and
``lightnets::pru_time_loop_backward``. Their schemas and fakes are here.
"""

from __future__ import annotations

import torch
from torch import Tensor

GATES = 4  # f, g, i, o


def check_recurrence_operands(
    inputs: Tensor | torch.Size, weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor
) -> tuple[int, int, int, int, int]:
    """(T, B, M, g, w) of the operands (``inputs`` or its shape), after checking that their
    shapes agree."""
    shape = inputs if isinstance(inputs, torch.Size) else inputs.shape
    if len(shape) != 4 or shape[2] != GATES:
        raise ValueError(f"inputs must be (T, B, 4, M), got shape {tuple(shape)}")
    steps, batch, _, hidden = shape
    if weight.dim() != 3 or weight.shape[0] * weight.shape[1] != hidden:
        raise ValueError(
            f"weight must be (g, M/g, 4M/g) with M = {hidden}, got shape {tuple(weight.shape)}"
        )
    groups, width = weight.shape[0], weight.shape[1]
    if weight.shape[2] != GATES * width:
        raise ValueError(
            f"weight must be (g, M/g, 4M/g) = {(groups, width, GATES * width)}, "
            f"got shape {tuple(weight.shape)}"
        )
    if bias is not None and bias.shape != (groups, GATES * width):
        raise ValueError(
            f"bias must be (g, 4M/g) = {(groups, GATES * width)}, got shape {tuple(bias.shape)}"
        )
    for name, state in (("h0", h0), ("c0", c0)):
        if state.shape != (batch, hidden):
            raise ValueError(f"{name} must be (B, M) = {(batch, hidden)}, got {tuple(state.shape)}")
    return steps, batch, hidden, groups, width


TIME_LOOP_SCHEMA = (
    "(Tensor inputs, Tensor weight, Tensor? bias, Tensor h0, Tensor c0, bool save) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)
TIME_LOOP_BACKWARD_SCHEMA = (
    "(Tensor grad_output, Tensor grad_h_last, Tensor grad_c_last, Tensor output, Tensor cells, "
    "Tensor gates, Tensor h0, Tensor c0, Tensor weight, bool[] wanted) -> Tensor[]"
)


def time_loop_like(
    inputs: Tensor, weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor, save: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The time loop's outputs' metadata (its fake when traced): output (T, B, M), h_T and c_T
    (B, M), and what the backward reads, the cells (T, B, M) and activated gates (T, B, 4, M),
    empty unless ``save``."""
    steps, batch, _, hidden = inputs.shape
    output = inputs.new_empty(steps, batch, hidden)
    cells = inputs.new_empty(steps, batch, hidden) if save else inputs.new_empty(0)
    gates = inputs.new_empty(inputs.shape) if save else inputs.new_empty(0)
    return output, torch.empty_like(h0), torch.empty_like(c0), cells, gates


def time_loop_grads_like(
    grad_output: Tensor, grad_h_last: Tensor, grad_c_last: Tensor, output: Tensor, cells: Tensor,
    gates: Tensor, h0: Tensor, c0: Tensor, weight: Tensor, wanted: list[bool],
) -> list[Tensor]:  # fmt: skip
    """The time loop backward's outputs' metadata (its fake when traced): the gradients of
    (inputs, weight, bias, h0, c0) that ``wanted`` asks for, in that order."""
    groups, width = weight.shape[0], weight.shape[1]
    likes = (
        lambda: gates.new_empty(gates.shape),
        lambda: torch.empty_like(weight),
        lambda: weight.new_empty(groups, GATES * width),
        lambda: torch.empty_like(h0),
        lambda: torch.empty_like(c0),
    )
    return [like() for like, want in zip(likes, wanted, strict=True) if want]


CPU_SCHEMA = (
    "(Tensor[] levels, Tensor weight, Tensor? bias, Tensor h0, Tensor c0, bool save, bool packed) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)
CPU_BACKWARD_SCHEMA = (
    "(Tensor? grad_output, Tensor? grad_h_last, Tensor? grad_c_last, Tensor gates, Tensor cells, "
    "Tensor output, Tensor weight, Tensor h0, Tensor c0, int[] widths, bool weight_grad, "
    "bool bias_grad, bool packed) -> (Tensor[], Tensor, Tensor, Tensor, Tensor)"
)


def cpu_like(
    levels: list[Tensor], weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor, save: bool,
    packed: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The C++ recurrence's outputs' metadata (its fake when traced): output (T, B, M), h_T and
    c_T (B, M), then the activated gates (T, B, 4, M) and the cells (T, B, M) when ``save``,
    else empty."""
    steps, batch = levels[0].shape[:2]
    hidden = sum(level.shape[-1] for level in levels)
    return (
        h0.new_empty(steps, batch, hidden),
        torch.empty_like(h0),
        torch.empty_like(c0),
        h0.new_empty((steps, batch, GATES, hidden) if save else (0,)),
        h0.new_empty((steps, batch, hidden) if save else (0,)),
    )


def cpu_grads_like(
    grad_output: Tensor | None, grad_h_last: Tensor | None, grad_c_last: Tensor | None,
    gates: Tensor, cells: Tensor, output: Tensor, weight: Tensor, h0: Tensor, c0: Tensor,
    widths: list[int], weight_grad: bool, bias_grad: bool, packed: bool,
) -> tuple[list[Tensor], Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The C++ backward's outputs' metadata: each level's gradient (T, B, 4, m_l), the weight's
    and the bias's (empty where not wanted), h0's and c0's."""
    steps, batch = output.shape[:2]
    groups, _, four_w = weight.shape
    return (
        [output.new_empty(steps, batch, GATES, width) for width in widths],
        torch.empty_like(weight) if weight_grad else weight.new_empty(0),
        weight.new_empty(groups, four_w) if bias_grad else weight.new_empty(0),
        torch.empty_like(h0),
        torch.empty_like(c0),
    )
