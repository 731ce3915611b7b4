"""The post-norm residual connection: ``LayerNorm(residual + dropout(branch))``.

Every sublayer of a post-norm Transformer block ends so (Vaswani et al., 2017, Sec. 5.4; DeLighT's
blocks with ``normalize_before`` off, the official default). The PyTorch path is exactly that:
:func:`src.kernels.dropout.dropout`, the add and ``F.layer_norm``. On CUDA the fused kernel
(:mod:`src.kernels.residual_layer_norm.triton_kernel`) does all three in one launch each way, where
PyTorch launches five or six; ``impl="auto"`` times both on the first call of each shape and keeps
the faster.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from src.kernels import (
    Timer,
    autocast_dtype,
    check_impl,
    declare,
    needs_backward,
    size_bucket,
    use_triton,
)
from src.kernels.dropout import dropout
from src.kernels.dropout.contract import DropoutSeeds
from src.kernels.norm_paths import affine_covered, rows, triton_or_reference


def residual_layer_norm(
    residual: Tensor, branch: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5, *,
    p: float = 0.0, seeds: DropoutSeeds | None = None, impl: str = "auto",
) -> Tensor:  # fmt: skip
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
    kernel = use_triton(check_impl(impl), residual) and (
        residual.shape == branch.shape and affine_covered(weight, bias, residual, branch)
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


CHOICE = declare("residual_layer_norm", ("triton", "reference"))


def auto_path(
    residual: Tensor,
    branch: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    timer: Timer | None = None,
) -> str:
    """``impl="auto"`` on CUDA: the fused kernel or the PyTorch ops for :func:`residual_layer_norm`
    (:func:`~src.kernels.norm_paths.triton_or_reference`), keyed by rows, width, the two inputs'
    dtypes, autocast's, the device and whether autograd wants the backward.

    Shape:
        residual and branch (..., d), weight and bias (d,)
    """
    key = (
        size_bucket(rows(residual)), residual.shape[-1], residual.dtype, branch.dtype,
        autocast_dtype(residual.device.type), str(residual.device),
        needs_backward(residual, branch, weight, bias),
    )  # fmt: skip

    def run(path: str, *operands: Tensor) -> Tensor:
        from src.kernels.residual_layer_norm.triton_kernel import residual_layer_norm_triton

        if path == "triton":
            return residual_layer_norm_triton(*operands, eps)
        return _reference(*operands, eps, 0.0)

    return triton_or_reference(CHOICE, key, run, (residual, branch, weight, bias), timer)
