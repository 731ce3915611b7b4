"""DeLighT's per-group LayerNorm: g contiguous chunks, each normalised alone, one shared affine.

Inside a DeLighT GLT (Mehta et al., 2021, Sec. 3.1; official code, README "GLT semantics" step 3)
the normalisation after the (shuffled) group linear map cuts the d-vector into g contiguous chunks
of d/g features and normalises each chunk over its own mean and variance. A single weight/bias pair
of length d/g is shared by all chunks, so this is neither a full-width LayerNorm (one set of
statistics) nor a per-group GroupNorm (one affine per group). With g = 1 it is ``nn.LayerNorm(d)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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


class SharedGroupLayerNorm(nn.Module):
    """LayerNorm over each of ``groups`` contiguous feature chunks, affine shared by all chunks.

    Args:
        num_features: d, divisible by ``groups``.
        groups: g, the number of chunks normalised separately.
        eps: added to the variance.
        elementwise_affine: learn ``weight`` and ``bias`` of length d/g (shared by the chunks).

    Shape:
        (..., d) -> (..., d)
    """

    def __init__(
        self, num_features: int, groups: int, *, eps: float = 1e-5, elementwise_affine: bool = True
    ) -> None:
        super().__init__()
        if groups < 1 or num_features % groups:
            raise ValueError(
                f"num_features ({num_features}) must be divisible by groups ({groups})"
            )
        self.num_features = num_features
        self.groups = groups
        self.eps = eps
        chunk = num_features // groups
        self.weight = nn.Parameter(torch.empty(chunk)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.empty(chunk)) if elementwise_affine else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None and self.bias is not None:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return shared_group_layer_norm(x, self.groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"num_features={self.num_features}, groups={self.groups}, eps={self.eps}, "
            f"elementwise_affine={self.weight is not None}"
        )


def shared_group_layer_norm(
    x: Tensor, groups: int, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5
) -> Tensor:
    """Normalise each of ``groups`` contiguous chunks of the last axis; affine of length d/g.

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
    x: Tensor,
    groups: int,
    weight: Tensor,
    bias: Tensor,
    eps: float = 1e-5,
    *,
    p: float = 0.0,
    seeds: DropoutSeeds | None = None,
    impl: str = "auto",
) -> Tensor:
    """``dropout(silu(shared_group_layer_norm(x, ...)), p)``: DExTra's norm, activation and
    dropout after each GLT (pass ``p=0`` outside training).

    ``impl="auto"`` runs, on CUDA, the faster (per shape and dtype, :func:`auto_path`) of the
    fused Triton kernel (:mod:`src.kernels.shared_group_layer_norm.triton_kernel`: one launch each
    way, the
    output in x's dtype) and the PyTorch ops (under autocast
    ``layer_norm`` in float32, then ``silu``), while ``torch.compile`` traces that choice untimed
    (the eager steps' or the kernel); the PyTorch ops elsewhere. ``"triton"`` / ``"reference"``
    fix it.
    The kernel draws its dropout mask itself (Philox, from a seed tensor on x's device, also in a
    traced graph: the seed the dropout sites of the forward share when ``seeds`` is given, else
    one drawn for this call; :mod:`src.kernels.shared_group_layer_norm.triton_kernel`), the PyTorch
    path
    with :func:`src.kernels.dropout.dropout`: the masks differ, their distribution does not.

    Shape:
        x (..., d), weight and bias (d/g,) -> (..., d)
    """
    kernel = use_triton(check_impl(impl), x) and _kernel_covers(x, weight, bias)
    if kernel and impl == "auto":
        kernel = auto_path(x, groups, weight, bias, eps) == "triton"
    if kernel:
        from src.kernels.shared_group_layer_norm.triton_kernel import shared_group_layer_norm_triton

        return shared_group_layer_norm_triton(x, groups, weight, bias, eps, True, p, seeds)
    return _dropout(F.silu(shared_group_layer_norm(x, groups, weight, bias, eps)), p)


def _dropout(x: Tensor, p: float) -> Tensor:
    return dropout(x, p, True) if p > 0 else x


_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _kernel_covers(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> bool:
    """The fused kernel's inputs: an affine, x and the affine in float32 or 16 bits."""
    return (
        weight is not None
        and bias is not None
        and x.dtype in _KERNEL_DTYPES
        and weight.dtype in _KERNEL_DTYPES
        and bias.dtype == weight.dtype
    )


CHOICE = declare("shared_group_layer_norm", ("triton", "reference"))


def auto_path(
    x: Tensor,
    groups: int,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    timer: Timer | None = None,
) -> str:
    """``impl="auto"`` on CUDA: "triton" or "reference" for :func:`shared_group_layer_norm_swish`,
    whichever call (a training step when autograd wants the backward) ran faster on the first call
    with this shape (rows by :func:`~src.kernels.size_bucket`), dtype and mode
    (:func:`~src.kernels.choose`). Both are deterministic; deterministic mode takes the kernel.

    Shape:
        x (..., d), weight and bias (d/g,)
    """
    rows = x.numel() // max(x.shape[-1], 1)
    key = (
        size_bucket(rows), x.shape[-1], groups, x.dtype, autocast_dtype(x.device.type),
        str(x.device), needs_backward(x, weight, bias),
    )  # fmt: skip

    def run(path: str, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        from src.kernels.shared_group_layer_norm.triton_kernel import shared_group_layer_norm_triton

        if path == "triton":
            return shared_group_layer_norm_triton(x, groups, weight, bias, eps, True)
        return F.silu(shared_group_layer_norm(x, groups, weight, bias, eps))

    def candidates() -> dict:
        return candidate_steps(run, ("triton", "reference"), x, weight, bias)

    return choose(CHOICE, key, candidates, default="triton", timer=timer)
