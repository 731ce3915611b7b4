"""BatchNorm followed by PReLU in one CPU op for channels-last training: the "BN + PReLU" of every
CBR unit of DiCENet and ESPNetv2.

The map is ``act(norm(x))`` for a :class:`src.ops.batch_norm.BatchNorm2d` ``norm`` and a per-channel
:class:`src.ops.prelu.PReLU` ``act``, with the same running statistics (momentum, cumulative
average, ``num_batches_tracked``). Unfused, BN writes its output z, PReLU reads z and writes y,
and autograd keeps x and z; the backward runs BN's two passes after PReLU's one.
``lightnets_cpu::batch_norm_prelu_forward`` (``src/ops/cpu/batch_norm_prelu.cpp``) reads x twice
(the statistics, then y) and keeps only x; the backward recomputes z and takes two passes. One
autograd node replaces two, which also halves the per-call cost of the small layers. The outputs
equal the unfused ones to float32 rounding (the statistics are summed in another order); in
bfloat16 z is not rounded to bfloat16 between the two, and under autocast the slope is not
either.

It applies where :class:`~src.ops.batch_norm.BatchNorm2d`'s own CPU kernel does (training,
channels-last, float32 parameters, float32 or bfloat16 input) and the slope is per channel and
float32; everywhere else (CUDA, eval, no autograd, NCHW, ``torch.compile`` included where those
hold) the two modules run as they are. ``torch.compile`` traces the Function with both kernels as
opaque nodes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from src.ops.batch_norm import BatchNorm2d
from src.ops.layout import channel_rows, from_channel_rows
from src.ops.triton import opaque_op


def batch_norm_prelu(x: Tensor, norm: nn.BatchNorm2d, act: nn.PReLU) -> Tensor:
    """``act(norm(x))``, in one fused op where it applies (module docstring).

    Shape:
        (B, C, H, W) -> (B, C, H, W)
    """
    if not _fused_applies(x, norm, act):
        return act(norm(x))
    norm._check_input_dim(x)
    momentum = 0.0 if norm.momentum is None else norm.momentum
    if norm.track_running_stats:
        norm.num_batches_tracked.add_(1)
        if norm.momentum is None:  # a cumulative moving average, as nn.BatchNorm2d
            momentum = 1.0 / float(norm.num_batches_tracked)
    y, mean, var = BatchNormPReLUCpuFunction.apply(x, norm.weight, norm.bias, act.weight, norm.eps)
    if norm.track_running_stats:
        with torch.no_grad():
            # (1 - momentum) running + momentum batch, as ATen updates them
            norm.running_mean.lerp_(mean, momentum)
            norm.running_var.lerp_(var, momentum)
    return y


def _fused_applies(x: Tensor, norm: nn.BatchNorm2d, act: nn.PReLU) -> bool:
    if not (isinstance(norm, BatchNorm2d) and norm._kernel_applies(x)):
        return False
    if torch.is_autocast_enabled("cpu") and x.dtype != torch.get_autocast_dtype("cpu"):
        return False  # PReLU would cast x to autocast's dtype: the unfused pair keeps that
    slope = act.weight
    return slope.dtype == torch.float32 and slope.shape == (x.shape[1],)


def _forward_fake(
    x: Tensor, weight: Tensor, bias: Tensor, slope: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward kernel's outputs' metadata: y like x's (R, C) view, three float32 (C,)."""
    return (torch.empty_like(x), *(torch.empty_like(weight) for _ in range(3)))


@opaque_op(
    "lightnets::batch_norm_prelu_forward",
    "(Tensor x, Tensor weight, Tensor bias, Tensor slope, float eps) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    _forward_fake,
)
def batch_norm_prelu_forward(
    x: Tensor, weight: Tensor, bias: Tensor, slope: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``lightnets_cpu::batch_norm_prelu_forward`` on the (B H W, C) view of a channels-last x:
    (y, batch mean, inverse standard deviation, unbiased variance); opaque to ``torch.compile``.

    Shape:
        x (R, C), weight, bias, slope (C,) -> ((R, C), (C,), (C,), (C,))
    """
    y, mean, invstd, var = torch.ops.lightnets_cpu.batch_norm_prelu_forward(
        x, weight, bias, slope, eps
    )
    return y, mean, invstd, var


def _backward_fake(
    grad_y: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    slope: Tensor,
    save_mean: Tensor,
    save_invstd: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward kernel's outputs' metadata: grad_x like x's (R, C) view, three float32 (C,)."""
    return (torch.empty_like(x), *(torch.empty_like(weight) for _ in range(3)))


@opaque_op(
    "lightnets::batch_norm_prelu_backward",
    "(Tensor grad_y, Tensor x, Tensor weight, Tensor bias, Tensor slope, Tensor save_mean, "
    "Tensor save_invstd) -> (Tensor, Tensor, Tensor, Tensor)",
    _backward_fake,
)
def batch_norm_prelu_backward(
    grad_y: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    slope: Tensor,
    save_mean: Tensor,
    save_invstd: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``lightnets_cpu::batch_norm_prelu_backward``: (grad_x, grad_weight, grad_bias, grad_slope)
    of (B H W, C) views; opaque to ``torch.compile``.

    Shape:
        grad_y, x (R, C), the rest (C,) -> ((R, C), (C,), (C,), (C,))
    """
    grads = torch.ops.lightnets_cpu.batch_norm_prelu_backward(
        grad_y, x, weight, bias, slope, save_mean, save_invstd
    )
    return grads[0], grads[1], grads[2], grads[3]


class BatchNormPReLUCpuFunction(torch.autograd.Function):
    """y = PReLU(BN(x)) with batch statistics; returns (y, batch mean, unbiased batch variance),
    the statistics for the running averages (not differentiable)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, x: Tensor, weight: Tensor, bias: Tensor, slope: Tensor, eps: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        y, mean, invstd, var = batch_norm_prelu_forward(channel_rows(x), weight, bias, slope, eps)
        ctx.save_for_backward(x, weight, bias, slope, mean, invstd)
        ctx.mark_non_differentiable(mean, var)
        return from_channel_rows(y, x.shape), mean, var  # y channels-last as x

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx, grad_y: Tensor, _grad_mean: Tensor | None, _grad_var: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        x, weight, bias, slope, mean, invstd = ctx.saved_tensors
        # the gradient copied to x's layout only if autograd's differs
        grad_y = grad_y.contiguous(memory_format=torch.channels_last)
        grad_x, grad_w, grad_b, grad_a = batch_norm_prelu_backward(
            channel_rows(grad_y), channel_rows(x), weight, bias, slope, mean, invstd
        )
        wanted = ctx.needs_input_grad
        return (
            from_channel_rows(grad_x, x.shape) if wanted[0] else None,
            grad_w if wanted[1] else None,
            grad_b if wanted[2] else None,
            grad_a if wanted[3] else None,
            None,
        )


class FusingSequential(nn.Sequential):
    """``nn.Sequential`` (same children, same state-dict keys) that runs each BatchNorm directly
    followed by a PReLU as :func:`batch_norm_prelu`. The fused pair calls neither module, so their
    forward hooks do not fire where the fused op applies.

    Shape:
        as the layers give
    """

    def forward(self, x: Tensor) -> Tensor:
        norm = None  # a BatchNorm waiting to see whether a PReLU follows
        for layer in self:
            if norm is not None:
                if isinstance(layer, nn.PReLU):
                    x, norm = batch_norm_prelu(x, norm, layer), None
                    continue
                x, norm = norm(x), None
            if isinstance(layer, nn.BatchNorm2d):
                norm = layer
            else:
                x = layer(x)
        return x if norm is None else norm(x)
