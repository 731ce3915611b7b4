"""Group-Transformer's per-group layer norm as a function of its parameters: its reference, its
paths and their choice.

:class:`src.ops.per_group_layer_norm.PerGroupLayerNorm` is the layer; this is the op it runs,
``y = (x_g - mean(x_g)) / (std(x_g) + eps) * weight + bias`` over each contiguous group of the last
axis (unbiased std), with the contract its paths share (:mod:`.contract`), the Triton kernels
(:mod:`.triton_kernel`) and the C++ kernels (``per_group_layer_norm.cpp``), forward and backward.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from src.kernels import Timer, declare, needs_backward, opaque_op, size_bucket, use_triton
from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.norm_paths import rows, triton_or_reference
from src.kernels.per_group_layer_norm import contract as contract


def per_group_layer_norm(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float, *, impl: str = "auto"
) -> Tensor:
    """The norm of :class:`PerGroupLayerNorm` as a function of its parameters.

    ``impl="auto"``: on the CPU the fused C++ kernels (:func:`per_group_layer_norm_cpu`) where
    they are built, also under ``torch.compile``; on CUDA, per shape, the faster of the fused
    Triton kernel (:mod:`src.kernels.per_group_layer_norm.triton_kernel`) and the PyTorch path
    (:func:`auto_path`, its choice untimed under ``torch.compile``). ``"reference"``: the PyTorch
    path, :class:`PerGroupLayerNormFunction`; ``"triton"``: the kernel.

    Shape:
        x (..., D), weight and bias (D,) -> (..., D) (float32 for 16-bit x)
    """
    args = (x, weight, bias, groups, eps)
    if impl == "auto" and x.is_cpu and _kernel_covers(*args) and cpu_kernels_loaded():
        return per_group_layer_norm_cpu(*args)
    kernel = use_triton(impl, x) and _kernel_covers(*args)
    if kernel and impl == "auto":
        kernel = auto_path(*args) == "triton"
    if kernel:
        from src.kernels.per_group_layer_norm.triton_kernel import per_group_layer_norm_triton

        return per_group_layer_norm_triton(*args)
    return PerGroupLayerNormFunction.apply(*args)


def per_group_layer_norm_reference(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float
) -> Tensor:
    """:func:`per_group_layer_norm` in plain PyTorch, autograd through its passes (the oracle of
    the faster paths).

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
    """:func:`per_group_layer_norm_reference` with its backward written out, the PyTorch path of
    :func:`per_group_layer_norm` (eager, and what ``torch.compile`` traces): autograd through the
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
        grad_y (R, D) and x (R, D) contiguous, weight (D,), mean and std (R, G)
        -> ((R, D) in x's dtype, (D,), (D,))
    """
    grad_x, grad_w, grad_b = torch.ops.lightnets_cpu.per_group_norm_backward(
        grad_y.float(), x, weight, mean, std, mean.shape[1], eps
    )
    # the kernel's two parameter gradients are rows of one tensor; an op's outputs may not alias
    return grad_x, grad_w, grad_b.clone()


@contract.forward_op("lightnets::per_group_layer_norm_cpu", per_group_layer_norm_cpu_backward)
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
    """:func:`per_group_layer_norm` on the fused C++ kernels
    (``src/kernels/per_group_layer_norm/per_group_layer_norm.cpp``), its CPU path where they are
    built, eager or traced: one pass over each group forward and one back, where
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
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float, timer: Timer | None = None
) -> str:
    """``impl="auto"`` on CUDA: the fused kernel (one launch each way) or the PyTorch ops
    (:func:`~src.kernels.norm_paths.triton_or_reference`), keyed by rows, width, groups, x's
    dtype, the device and whether autograd wants the backward.

    Shape:
        x (..., D), weight and bias (D,)
    """
    key = (
        size_bucket(rows(x)), x.shape[-1], groups, x.dtype, str(x.device),
        needs_backward(x, weight, bias),
    )  # fmt: skip

    def run(path: str, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        from src.kernels.per_group_layer_norm.triton_kernel import per_group_layer_norm_triton

        forward = (
            per_group_layer_norm_triton if path == "triton" else per_group_layer_norm_reference
        )
        return forward(x, weight, bias, groups, eps)

    return triton_or_reference(CHOICE, key, run, (x, weight, bias), timer)
