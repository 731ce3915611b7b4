"""What the fused LayerNorms' entries share: the dtypes their Triton kernels take and how
``impl="auto"`` chooses between a kernel and the PyTorch ops on CUDA.

The post-norm residual (:mod:`src.kernels.residual_layer_norm`), DeLighT's shared-group norm
(:mod:`src.kernels.shared_group_layer_norm`) and Group-Transformer's per-group norm
(:mod:`src.kernels.per_group_layer_norm`) each time one call of both paths (a training step when
autograd wants the backward) on the first call with a key (rows by :func:`~src.kernels.size_bucket`,
the width, dtypes and mode) and keep the faster (:func:`~src.kernels.choose`). Both paths are
deterministic; deterministic mode takes the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import Tensor

from src.kernels import Timer, candidate_steps, choose

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def affine_covered(weight: Tensor | None, bias: Tensor | None, *tensors: Tensor) -> bool:
    """Whether a kernel takes these operands: an affine, the tensors and the weight in
    :data:`KERNEL_DTYPES`, weight and bias of one dtype."""
    return (
        weight is not None
        and bias is not None
        and all(t.dtype in KERNEL_DTYPES for t in (*tensors, weight))
        and bias.dtype == weight.dtype
    )


def rows(x: Tensor) -> int:
    """The rows a norm over the last axis normalises: (..., D) -> the product of the leading
    dims."""
    return x.numel() // max(x.shape[-1], 1)


def triton_or_reference(
    choice: str,
    key: Hashable,
    run: Callable[..., Tensor],
    operands: tuple[Tensor, ...],
    timer: Timer | None = None,
) -> str:
    """ "triton" or "reference" for ``key``: ``run(path, *operands)`` is one call of either path,
    timed as a step (:func:`~src.kernels.candidate_steps`) where :func:`~src.kernels.choose`
    measures; the kernel where it does not."""

    def candidates() -> dict:
        return candidate_steps(run, ("triton", "reference"), *operands)

    return choose(choice, key, candidates, default="triton", timer=timer)
