"""The contract of the PRU's recurrence (:mod:`src.ops.pru_recurrence`): its operands' shapes,
which the reference, the C++ kernels and the Triton kernels (:mod:`src.ops.triton.pru_recurrence`)
all take. It has no custom op: the C++ kernels are called as they are, the Triton ones inside an
autograd Function.
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
