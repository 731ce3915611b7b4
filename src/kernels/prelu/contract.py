"""The contract of PReLU's CPU backward (:mod:`src.kernels.prelu`)."""

from __future__ import annotations

import torch
from torch import Tensor

BACKWARD_SCHEMA = "(Tensor grad_y, Tensor x, Tensor weight) -> (Tensor, Tensor)"


def backward_fake(grad_y: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel's outputs' metadata: grad_x like the (R, C) or (B, C, S) view of x, and the
    float32 slope gradient (C,)."""
    return torch.empty_like(x), x.new_empty(x.shape[1], dtype=torch.float32)
