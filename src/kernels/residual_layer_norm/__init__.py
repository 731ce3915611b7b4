"""The post-norm residual connection: ``LayerNorm(residual + dropout(branch))``.

Every sublayer of a post-norm Transformer block ends so (Vaswani et al., 2017, Sec. 5.4; DeLighT's
blocks with ``normalize_before`` off, the official default). The PyTorch path is exactly that:
:func:`src.kernels.dropout.dropout`, the add and ``F.layer_norm``. On CUDA the fused kernel
(:mod:`src.kernels.residual_layer_norm.triton_kernel`) does all three in one launch each way, where
PyTorch
launches five or six; ``impl="auto"`` times both on the first call of
each shape and keeps the faster.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from src.kernels import (
    Timer,
    autocast_dtype,
    candidate_steps,
    check_impl,
    choose,
    declare,
    needs_backward,
    size_bucket,
    use_triton,
)
from src.kernels.dropout import dropout
from src.kernels.dropout.contract import DropoutSeeds

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def residual_layer_norm(
    residual: Tensor,
    branch: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float = 1e-5,
    *,
    p: float = 0.0,
    seeds: DropoutSeeds | None = None,
    impl: str = "auto",
) -> Tensor:
    """``layer_norm(residual + dropout(branch, p))`` over the last axis (pass ``p=0`` outside
    training).

    ``impl="auto"`` runs, on CUDA, the faster (per shape and dtypes, :func:`auto_path`) of the
    fused Triton kernel and the PyTorch ops (while ``torch.compile`` traces, that choice untimed:
    the eager steps' or the kernel); the PyTorch ops elsewhere. ``"triton"`` / ``"reference"``
    fix it.
    The kernel draws its dropout mask itself (Philox, from a seed tensor on the input's device,
    also in a traced graph: the seed the dropout sites of the forward share when ``seeds`` is
    given, else one drawn for this call), the PyTorch path with :func:`src.kernels.dropout.dropout`:
    the masks differ, their distribution does not. Both give the output in the dtype the PyTorch ops
    give under CUDA's autocast (the promotion of residual and branch: float32 for a float32
    residual stream).

    Shape:
        residual and branch (..., d), weight and bias (d,) -> (..., d)
    """
    kernel = use_triton(check_impl(impl), residual) and _kernel_covers(
        residual, branch, weight, bias
    )
    if kernel and impl == "auto":
        kernel = auto_path(residual, branch, weight, bias, eps) == "triton"
    if kernel:
        from src.kernels.residual_layer_norm.triton_kernel import residual_layer_norm_triton

        return residual_layer_norm_triton(residual, branch, weight, bias, eps, p, seeds)
    return _reference(residual, branch, weight, bias, eps, p)


def _reference(
    residual: Tensor, branch: Tensor, weight: Tensor, bias: Tensor, eps: float, p: float
) -> Tensor:
    total = residual + (dropout(branch, p, True) if p > 0 else branch)
    return F.layer_norm(total, (total.shape[-1],), weight, bias, eps)


def _kernel_covers(residual: Tensor, branch: Tensor, weight: Tensor, bias: Tensor) -> bool:
    """The fused kernel's inputs: an affine, everything in float32 or 16 bits, equal shapes."""
    return (
        weight is not None
        and bias is not None
        and residual.shape == branch.shape
        and all(t.dtype in _KERNEL_DTYPES for t in (residual, branch, weight))
        and bias.dtype == weight.dtype
    )


CHOICE = declare("residual_layer_norm", ("triton", "reference"))


def auto_path(
    residual: Tensor,
    branch: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    timer: Timer | None = None,
) -> str:
    """``impl="auto"`` on CUDA: "triton" or "reference" for :func:`residual_layer_norm`,
    whichever call (a training step when autograd wants the backward) ran faster on the first call
    with this shape (rows by :func:`~src.kernels.size_bucket`), dtypes and mode
    (:func:`~src.kernels.choose`). Both are deterministic; deterministic mode takes the kernel.

    Shape:
        residual and branch (..., d), weight and bias (d,)
    """
    rows = residual.numel() // max(residual.shape[-1], 1)
    key = (
        size_bucket(rows), residual.shape[-1], residual.dtype, branch.dtype,
        autocast_dtype(residual.device.type), str(residual.device),
        needs_backward(residual, branch, weight, bias),
    )  # fmt: skip

    def run(path: str, *operands: Tensor) -> Tensor:
        from src.kernels.residual_layer_norm.triton_kernel import residual_layer_norm_triton

        if path == "triton":
            return residual_layer_norm_triton(*operands, eps)
        return _reference(*operands, eps, 0.0)

    def candidates() -> dict:
        names = ("triton", "reference")
        return candidate_steps(run, names, residual, branch, weight, bias)

    return choose(CHOICE, key, candidates, default="triton", timer=timer)
