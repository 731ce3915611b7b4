"""Depth-wise convolution with a one-pass CPU backward for dilated kernels on channels-last maps:
the branches of EESP's pyramid (ESPNetv2 and the EdgeNets heads built on it).

The map is ``F.conv2d(x, weight, bias, stride, padding, dilation, groups=C)`` with a
``(C, 1, k, k)`` weight, and the forward is ATen's (oneDNN's depth-wise kernel is fast). Only the
CPU backward of a dilated kernel on a channels-last input differs: oneDNN's took 2-3x ours there
(3.8 vs 1.8 ms forward+backward for a (4, 64, 56, 56) float32 map at dilation 3 on 2 cores, 1.2 vs
0.44 ms for (4, 256, 14, 14) at dilation 4), and the dilated branches' backward was about a fifth
of an ESPNetv2 s=1.0 training step. Undilated, oneDNN's backward was as fast or faster (0.8 vs
1.3 ms for the (4, 64, 56, 56) map at dilation 1), so it keeps it.
``lightnets_cpu::depthwise_conv_backward`` (``src/kernels/depthwise_conv/depthwise_conv.cpp``)
gathers each input element's taps along the contiguous channels and sums the weight and bias
gradients per fixed block of rows (in float32, the blocks in order), so they do not depend on the
thread count.

``F.conv2d`` runs on CUDA (cuDNN), without autograd, for contiguous inputs, float64, dilation 1,
unequal strides, paddings or dilations along the two axes, non-square kernels, under a
``TorchDispatchMode`` (``FlopCounterMode`` then counts the convolution; fake tensors) and where the
CPU kernels cannot be built. ``torch.compile`` traces the Function, the kernel an opaque node of
the backward graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn.modules.utils import _pair

from src.kernels.cpu import cpu_kernels_loaded, dispatch_mode_active
from src.kernels.depthwise_conv import contract as contract
from src.kernels.dispatch import autocast_off, autocast_operands, opaque_op
from src.kernels.layout import is_channels_last

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class DepthwiseConv2d(nn.Conv2d):
    """``nn.Conv2d(C, C, k, groups=C, ...)`` (same parameters, state-dict keys and
    initialisation) running :func:`depthwise_conv2d`.

    Shape:
        (B, C, H, W) -> (B, C, H_out, W_out), as ``nn.Conv2d``'s
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        bias: bool = False,
    ) -> None:
        super().__init__(
            channels,
            channels,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=channels,
            bias=bias,
        )

    def forward(self, x: Tensor) -> Tensor:
        return depthwise_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)


def depthwise_conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
) -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, dilation, groups=weight.shape[0])``, with the
    CPU backward kernel where it applies (see the module docstring).

    Under ``torch.autocast`` the operands are cast to its dtype first, as autocast casts
    ``F.conv2d``'s (float32 parameters keep float32 gradients).

    Shape:
        x (B, C, H, W), weight (C, 1, k, k), bias (C,) or None -> (B, C, H_out, W_out)
    """
    channels = weight.shape[0]
    args = (_pair(stride), _pair(padding), _pair(dilation))
    if not _kernel_applies(x, weight, bias, args):
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups=channels)
    x_cast, weight_cast, bias_cast = autocast_operands("cpu", x, weight, bias)
    if x_cast.dtype not in KERNEL_DTYPES or any(
        t is not None and t.dtype != x_cast.dtype for t in (weight_cast, bias_cast)
    ):  # F.conv2d explains the mismatch
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups=channels)
    return DepthwiseConvCpuFunction.apply(
        x_cast, weight_cast, bias_cast, args[0][0], args[1][0], args[2][0]
    )


def _kernel_applies(
    x: Tensor, weight: Tensor, bias: Tensor | None, args: tuple[tuple[int, int], ...]
) -> bool:
    return (
        x.is_cpu
        and torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
        and is_channels_last(x)
        and weight.dim() == 4
        and weight.shape[1] == 1
        and weight.shape[2] == weight.shape[3]
        and x.shape[1] == weight.shape[0]
        and all(a == b for a, b in args)
        and args[2][0] > 1  # undilated, oneDNN's backward is as fast or faster
        and not dispatch_mode_active()
        and cpu_kernels_loaded()
    )


@opaque_op("lightnets::depthwise_conv_backward", contract.BACKWARD_SCHEMA, contract.backward_fake)
def depthwise_conv_backward(
    grad_y: Tensor, x: Tensor, weight: Tensor, stride: int, padding: int, dilation: int,
    input_grad: bool, weight_grad: bool, bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """``lightnets_cpu::depthwise_conv_backward``: (grad_x, float32 grad_weight, float32
    grad_bias), each an empty tensor where not wanted; opaque to ``torch.compile``.

    Shape:
        grad_y (B, H_out, W_out, C), x (B, H, W, C), weight (C, k, k)
        -> ((B, H, W, C), (C, k, k), (C,))
    """
    grad_x, grad_w, grad_b = torch.ops.lightnets_cpu.depthwise_conv_backward(
        grad_y, x, weight, stride, padding, dilation, input_grad, weight_grad, bias_grad
    )
    return grad_x, grad_w, grad_b


class DepthwiseConvCpuFunction(torch.autograd.Function):
    """ATen's depth-wise forward, the backward by ``lightnets_cpu::depthwise_conv_backward``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        stride: int,
        padding: int,
        dilation: int,
    ) -> Tensor:
        with autocast_off("cpu"):  # the operands share a dtype already
            y = F.conv2d(x, weight, bias, stride, padding, dilation, groups=weight.shape[0])
        ctx.save_for_backward(x, weight)
        ctx.geometry = stride, padding, dilation
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        wanted = ctx.needs_input_grad
        bias_grad = ctx.has_bias and wanted[2]
        # rows of channels; a copy only if autograd's layout differs from channels-last
        grad_rows = grad_y.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
        grad_x, grad_w, grad_b = depthwise_conv_backward(
            grad_rows, x.permute(0, 2, 3, 1), weight.squeeze(1), *ctx.geometry,
            wanted[0], wanted[1], bias_grad,
        )  # fmt: skip
        return (
            grad_x.permute(0, 3, 1, 2) if wanted[0] else None,
            grad_w.to(weight.dtype).unsqueeze(1) if wanted[1] else None,
            grad_b.to(weight.dtype) if bias_grad else None,
            None,
            None,
            None,
        )
