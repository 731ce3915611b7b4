"""Group-Transformer's per-group layer norm: normalise each contiguous feature group on its own.

Group-Transformer (Park et al., 2020) normalises every group of the residual stream separately so
that no statistic mixes groups. The official norm is not ``nn.LayerNorm``: it divides by the
*unbiased* standard deviation plus ``eps`` (eps added to the std, not the variance), and its gain
and shift span the full width. DeLighT's shared-parameter group norm is a different op
(:mod:`src.ops.shared_group_layer_norm`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from src.kernels import (
    Timer,
    candidate_steps,
    check_impl,
    choose,
    declare,
    needs_backward,
    opaque_op,
    size_bucket,
    use_triton,
)
from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.custom_ops import autograd_op
from src.kernels.per_group_layer_norm import contract as contract


class PerGroupLayerNorm(nn.Module):
    """``y = (x_g - mean(x_g)) / (std(x_g) + eps) * weight + bias`` for each of ``groups`` chunks.

    Args:
        num_features: the normalised (last) dimension, divisible by ``groups``.
        groups: number of contiguous chunks normalised separately; 1 normalises the full width.
        eps: added to the unbiased standard deviation.
        impl: ``"auto"`` (on CUDA, per shape the faster of the fused Triton kernel,
            :mod:`src.kernels.per_group_layer_norm.triton_kernel`, and the PyTorch path,
            :func:`auto_path`,
            its choice untimed under ``torch.compile``;
            on the CPU the fused C++ kernels, :func:`per_group_layer_norm_cpu`, where they are
            built, also under ``torch.compile``), ``"reference"`` (the PyTorch path,
            :class:`PerGroupLayerNormFunction`) or ``"triton"``.

    Parameters: ``weight`` and ``bias``, each (num_features,), one gain and shift per feature.

    Shape:
        (..., num_features) -> (..., num_features)
    """

    def __init__(
        self, num_features: int, groups: int, *, eps: float = 1e-6, impl: str = "auto"
    ) -> None:
        super().__init__()
        if groups < 1 or num_features % groups:
            raise ValueError(
                f"num_features ({num_features}) must be divisible by groups ({groups})"
            )
        if num_features // groups < 2:
            raise ValueError(
                f"each group needs at least 2 features for an unbiased std, got "
                f"num_features={num_features}, groups={groups}"
            )
        self.num_features = num_features
        self.groups = groups
        self.eps = eps
        self.impl = check_impl(impl)
        self.weight = nn.Parameter(torch.empty(num_features))
        self.bias = nn.Parameter(torch.empty(num_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.num_features:
            raise ValueError(f"expected (..., {self.num_features}), got {tuple(x.shape)}")
        args = (x, self.weight, self.bias, self.groups, self.eps)
        if self.impl == "auto" and x.is_cpu and _kernel_covers(*args) and cpu_kernels_loaded():
            return per_group_layer_norm_cpu(*args)
        kernel = use_triton(self.impl, x) and _kernel_covers(*args)
        if kernel and self.impl == "auto":
            kernel = auto_path(*args) == "triton"
        if kernel:
            from src.kernels.per_group_layer_norm.triton_kernel import per_group_layer_norm_triton

            return per_group_layer_norm_triton(*args)
        return PerGroupLayerNormFunction.apply(*args)

    def extra_repr(self) -> str:
        return (
            f"num_features={self.num_features}, groups={self.groups}, eps={self.eps}, "
            f"impl={self.impl!r}"
        )


def per_group_layer_norm(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float
) -> Tensor:
    """:class:`PerGroupLayerNorm` in plain PyTorch (the test oracle of the Triton kernel).

    Shape:
        x (..., D), weight and bias (D,) -> (..., D)
    """
    # Statistics of 16-bit activations are taken in float32, as autocast does for its own
    # norms; the output is then float32 too (the next matmul casts it down again).
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    # (..., C) -> (..., groups, C / groups)
    width = x.shape[-1] // groups
    xg = x.unflatten(-1, (groups, width))
    if xg.is_cuda:  # one fused reduction
        std, mean = torch.std_mean(xg, dim=-1, keepdim=True, correction=1)
        centred = xg - mean
    else:
        # two passes written out: torch.std_mean over rows this short is ~10x slower on the
        # CPU (482 vs 46 us on (512, 4, 64)), and so is its backward
        mean = xg.mean(dim=-1, keepdim=True)
        centred = xg - mean
        std = (centred.square().sum(dim=-1, keepdim=True) / (width - 1)).sqrt()
    # (..., groups, C / groups) -> (..., C)
    normed = (centred / (std + eps)).flatten(-2)
    return torch.addcmul(bias, normed, weight)


class PerGroupLayerNormFunction(torch.autograd.Function):
    """:func:`per_group_layer_norm` with its backward written out, the PyTorch path of
    :class:`PerGroupLayerNorm` (eager, and what ``torch.compile`` traces): autograd through the
    plain passes keeps x, the centred rows and more and runs about twelve element-wise passes back;
    this keeps the normalised rows and the per-row std and runs seven (1.3-2.4x faster
    forward+backward in float32 on 2 CPU cores for Group-Transformer's norms, 1.0-1.7x with
    bfloat16 inputs).

    With ``n = c / (s + eps)``, ``c`` the centred group, ``s = |c| / sqrt(W - 1)`` and ``g`` the
    gradient of n: ``dc = (g - n sum(g n) (s + eps) / ((W - 1) s)) / (s + eps)`` and
    ``dx = dc - mean(dc)``. A constant group (s = 0, n = 0) gets ``dx = (g - mean g) / eps``,
    finite, where autograd's sqrt backward gives NaN.

    Shape:
        x (..., D), weight and bias (D,) -> (..., D) (float32 for 16-bit x)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float
    ) -> Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        width = xf.shape[-1] // groups
        xg = xf.unflatten(-1, (groups, width))  # (..., D) -> (..., G, D / G)
        centred = xg - xg.mean(dim=-1, keepdim=True)
        std = torch.linalg.vector_norm(centred, dim=-1, keepdim=True).mul_((width - 1) ** -0.5)
        inv = (std + eps).reciprocal_()
        normed = (centred * inv).flatten(-2)
        ctx.save_for_backward(normed, std, inv, weight)
        ctx.groups, ctx.x_dtype = groups, x.dtype
        return torch.addcmul(bias, normed, weight)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        normed, std, inv, weight = ctx.saved_tensors
        groups = ctx.groups
        width = normed.shape[-1] // groups
        rows = tuple(range(normed.dim() - 1))
        grad_w = (grad_y * normed).sum(rows) if ctx.needs_input_grad[1] else None
        grad_b = grad_y.sum(rows) if ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            g = (grad_y * weight).unflatten(-1, (groups, width))  # (..., G, D / G)
            n = normed.unflatten(-1, (groups, width))
            # the std's share; a constant group has n = 0, so the clamp only avoids 0 / 0
            through_std = (g * n).sum(-1, keepdim=True) / ((width - 1) * std).clamp_min(
                torch.finfo(std.dtype).tiny
            )
            grad_c = inv * g - n * through_std
            grad_x = (grad_c - grad_c.mean(dim=-1, keepdim=True)).flatten(-2).to(ctx.x_dtype)
        return grad_x, grad_w, grad_b, None, None


@opaque_op(
    "lightnets::per_group_layer_norm_cpu_backward", contract.BACKWARD_SCHEMA, contract.backward_fake
)
def per_group_layer_norm_cpu_backward(
    grad_y: Tensor, x: Tensor, weight: Tensor, mean: Tensor, std: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``lightnets_cpu::per_group_norm_backward``: the input, weight and bias gradients.

    Shape:
        grad_y (R, D) float32 and x (R, D) contiguous, weight (D,), mean and std (R, G)
        -> ((R, D) in x's dtype, (D,), (D,))
    """
    grad_x, grad_w, grad_b = torch.ops.lightnets_cpu.per_group_norm_backward(
        grad_y, x, weight, mean, std, mean.shape[1], eps
    )
    # the kernel's two parameter gradients are rows of one tensor; an op's outputs may not alias
    return grad_x, grad_w, grad_b.clone()


def _per_group_layer_norm_cpu_grads(ctx, grad_y: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
    x, weight, mean, std = ctx.saved_tensors
    grad_x, grad_w, grad_b = per_group_layer_norm_cpu_backward(
        grad_y.float().contiguous(), x, weight, mean, std, ctx.eps
    )
    return grad_x, grad_w, grad_b, None, None


@autograd_op(
    "lightnets::per_group_layer_norm_cpu",
    contract.FORWARD_SCHEMA,
    contract.forward_fake,
    setup_context=contract.keep_for_backward,
    backward=_per_group_layer_norm_cpu_grads,
)
def per_group_layer_norm_cpu_rows(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``lightnets_cpu::per_group_norm_forward``: the normalised rows and each (row, group)'s mean
    and std (kept for the backward, not differentiable).

    Shape:
        x (R, D) contiguous float32 or 16-bit, weight and bias (D,) float32
        -> ((R, D) float32, (R, G), (R, G))
    """
    y, mean, std = torch.ops.lightnets_cpu.per_group_norm_forward(x, weight, bias, groups, eps)
    return y, mean, std


def per_group_layer_norm_cpu(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float
) -> Tensor:
    """:class:`PerGroupLayerNorm` on the fused C++ kernels
    (``src/kernels/per_group_layer_norm/per_group_layer_norm.cpp``), its CPU path where they are
    built, eager or
    traced: one pass over each group forward and one back, where
    :class:`PerGroupLayerNormFunction` runs about eight element-wise ATen passes forward and
    fourteen back. It keeps x in its own dtype and each group's mean and std, and recomputes the
    normalised values in the backward, the same formulas as :class:`PerGroupLayerNormFunction`.
    Traced by ``torch.compile``, the kernels are the custom ops
    ``lightnets::per_group_layer_norm_cpu`` and its backward, one node each way.

    Shape:
        x (..., D) float32 or 16-bit, weight and bias (D,) float32 -> (..., D) float32
    """
    rows = x.reshape(-1, x.shape[-1]).contiguous()  # (..., D) -> (N, D)
    y = per_group_layer_norm_cpu_rows(rows, weight.contiguous(), bias.contiguous(), groups, eps)[0]
    return y if x.dim() == 2 else y.view(x.shape)


def _kernel_covers(x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float) -> bool:
    """The fused kernel's dtypes: x float32/16-bit, float32 parameters."""
    return (
        x.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and weight.dtype == bias.dtype == torch.float32
    )


CHOICE = declare("per_group_layer_norm", ("triton", "reference"))


def auto_path(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    groups: int,
    eps: float,
    timer: Timer | None = None,
) -> str:
    """``impl="auto"`` on CUDA: "triton" (one fused launch) or "reference", whichever call (a
    training step when autograd wants the backward) ran faster on the first call with this shape
    (rows by :func:`~src.kernels.size_bucket`), dtype and mode (:func:`~src.kernels.choose`). Both
    are deterministic; deterministic mode takes the kernel.

    Shape:
        x (..., D), weight and bias (D,)
    """
    rows = x.numel() // max(x.shape[-1], 1)
    key = (
        size_bucket(rows), x.shape[-1], groups, x.dtype, str(x.device),
        needs_backward(x, weight, bias),
    )  # fmt: skip

    def run(path: str, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        from src.kernels.per_group_layer_norm.triton_kernel import per_group_layer_norm_triton

        forward = per_group_layer_norm_triton if path == "triton" else per_group_layer_norm
        return forward(x, weight, bias, groups, eps)

    def candidates() -> dict:
        return candidate_steps(run, ("triton", "reference"), x, weight, bias)

    return choose(CHOICE, key, candidates, default="triton", timer=timer)
