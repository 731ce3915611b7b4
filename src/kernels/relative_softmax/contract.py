"""The contract of the relative-attention softmax (:mod:`src.kernels.relative_softmax`): the forward
and backward ops over (B H, T, K) score rows, which the C++ kernels
(``src/kernels/relative_softmax/relative_softmax.cpp``) and the Triton ones
(:mod:`src.kernels.relative_softmax.triton_kernel`) both compute. The forward is differentiable: its
backward rule (:func:`keep_for_backward`, then the back-end's backward op) reads the probabilities,
not the scores.
"""

from __future__ import annotations

import torch
from torch import Tensor

FORWARD_SCHEMA = "(Tensor content, Tensor position, Tensor? mask, float scale) -> Tensor"
BACKWARD_SCHEMA = "(Tensor grad_prob, Tensor prob, Tensor? mask, float scale) -> (Tensor, Tensor)"


def score_rows(t: Tensor) -> Tensor:
    """(B, H, T, K) -> (B H, T, K), the kernels' contiguous view (a copy only if not dense)."""
    return t.contiguous().view(-1, *t.shape[-2:])


def probabilities_like(
    content: Tensor, position: Tensor, mask: Tensor | None, scale: float
) -> Tensor:
    """A forward op's output metadata (its fake when traced): the probabilities, like the scores."""
    return torch.empty_like(content)


def score_grads_like(
    grad_prob: Tensor, prob: Tensor, mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """A backward op's outputs' metadata (its fake when traced): the content and the position
    score gradients, like the probabilities."""
    return torch.empty_like(prob), torch.empty_like(prob)


def keep_for_backward(ctx, inputs: tuple, output: Tensor) -> None:
    """A forward op's ``setup_context``: the backward op reads the probabilities (in the scores'
    dtype), the mask and the scale."""
    _, _, mask, scale = inputs
    ctx.save_for_backward(output, mask)
    ctx.scale = scale
