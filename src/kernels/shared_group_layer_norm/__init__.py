"""DeLighT's per-group LayerNorm as a function of its parameters, and with the swish and dropout
after each GLT: the references, the fused path and their choice.

:class:`src.ops.shared_group_layer_norm.SharedGroupLayerNorm` is the layer; these are the ops it and
DExTra run: :func:`shared_group_layer_norm` (one ``F.layer_norm`` over the (..., g, d/g) view) and
:func:`shared_group_layer_norm_swish`, whose fused Triton kernels (:mod:`.triton_kernel`: norm,
swish and dropout in one launch each way) share the contract (:mod:`.contract`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from src.kernels import autocast_dtype, check_impl, declare, needs_backward, size_bucket, use_triton
from src.kernels.dropout import dropout
from src.kernels.dropout.contract import DropoutSeeds
from src.kernels.norm_paths import affine_covered, rows, triton_or_reference
from src.kernels.timing import Timer


def shared_group_layer_norm(
    x: Tensor, groups: int, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5
) -> Tensor:
    """Normalise each of ``groups`` contiguous chunks of the last axis; affine of length d/g
    (:class:`~src.ops.shared_group_layer_norm.SharedGroupLayerNorm`).

    One ``F.layer_norm`` call over a (..., g, d/g) view: the chunk axis becomes a batch axis.

    Shape:
        x (..., d), weight and bias (d/g,) -> (..., d)
    """
    d = x.shape[-1]
    if groups < 1 or d % groups:
        raise ValueError(f"cannot cut {d} features into {groups} groups")
    # (..., d) -> (..., g, d/g)
    chunks = x.unflatten(-1, (groups, d // groups))
    if (
        weight is not None
        and weight.dtype != x.dtype
        and not torch.is_autocast_enabled(x.device.type)
    ):
        # a 16-bit input with float32 affine outside autocast: normalised in float32 and returned
        # in the input's dtype on every device (CUDA's layer_norm refuses the mix; the CPU's
        # computes it so too)
        out = F.layer_norm(chunks.float(), (d // groups,), weight.float(), _float(bias), eps)
        return out.to(x.dtype).flatten(-2)
    # (..., g, d/g) -> (..., d)
    return F.layer_norm(chunks, (d // groups,), weight, bias, eps).flatten(-2)


def _float(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.float()


def shared_group_layer_norm_swish(
    x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float = 1e-5, *, p: float = 0.0,
    seeds: DropoutSeeds | None = None, impl: str = "auto",
) -> Tensor:  # fmt: skip
    """``dropout(silu(shared_group_layer_norm(x, ...)), p)``: DExTra's norm, activation and
    dropout after each GLT (pass ``p=0`` outside training).

    ``impl="auto"`` runs, on CUDA, the faster (per shape and dtype, :func:`auto_path`) of the
    fused Triton kernel (:mod:`src.kernels.shared_group_layer_norm.triton_kernel`: one launch each
    way, the output in x's dtype) and the PyTorch ops (under autocast ``layer_norm`` in float32,
    then ``silu``), while ``torch.compile`` traces that choice untimed (the eager steps' or the
    kernel); the PyTorch ops elsewhere. ``"triton"`` / ``"reference"`` fix it. The kernel draws
    its dropout mask itself (Philox, from a seed tensor on x's device, also in a traced graph: the
    seed the dropout sites of the forward share when ``seeds`` is given, else one drawn for this
    call; :mod:`src.kernels.shared_group_layer_norm.triton_kernel`), the PyTorch path with
    :func:`src.kernels.dropout.dropout`: the masks differ, their distribution does not.

    Shape:
        x (..., d), weight and bias (d/g,) -> (..., d)
    """
    kernel = use_triton(check_impl(impl), x) and affine_covered(weight, bias, x)
    if kernel and impl == "auto":
        kernel = auto_path(x, groups, weight, bias, eps) == "triton"
    if kernel:
        from src.kernels.shared_group_layer_norm.triton_kernel import shared_group_layer_norm_triton

        return shared_group_layer_norm_triton(x, groups, weight, bias, eps, True, p, seeds)
    return _dropout(F.silu(shared_group_layer_norm(x, groups, weight, bias, eps)), p)


def _dropout(x: Tensor, p: float) -> Tensor:
    return dropout(x, p, True) if p > 0 else x


CHOICE = declare("shared_group_layer_norm", ("triton", "reference"))


def auto_path(
    x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float, timer: Timer | None = None
) -> str:
    """``impl="auto"`` on CUDA: the fused kernel or the PyTorch ops for
    :func:`shared_group_layer_norm_swish` (:func:`~src.kernels.norm_paths.triton_or_reference`),
    keyed by rows, width, groups, x's dtype, autocast's, the device and whether autograd wants the
    backward.

    Shape:
        x (..., d), weight and bias (d/g,)
    """
    key = (
        size_bucket(rows(x)), x.shape[-1], groups, x.dtype, autocast_dtype(x.device.type),
        str(x.device), needs_backward(x, weight, bias),
    )  # fmt: skip

    def run(path: str, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        from src.kernels.shared_group_layer_norm.triton_kernel import shared_group_layer_norm_triton

        if path == "triton":
            return shared_group_layer_norm_triton(x, groups, weight, bias, eps, True)
        return F.silu(shared_group_layer_norm(x, groups, weight, bias, eps))

    return triton_or_reference(CHOICE, key, run, (x, weight, bias), timer)
