"""Point-wise (1x1) convolutions of channels-last CPU maps as matrix products on the rows.

A 1x1 convolution (stride 1, one group) of a map whose channels are contiguous is the product of
its (B H W, C_in) rows with the (C_out, C_in) weight: ``F.linear`` on the rows. The rows are a
strided view of the map, of a channels-last map or of a channel slice of one (a DiCENet unit's
split half), which BLAS reads in place, where oneDNN reorders a strided input first. Forward and
backward on 2 cores, fp32, batch 8 (``benchmarks/ops.py --only pointwise_conv``, 41 repeats): a
unit's reduction of its split half, 58 at 28² / 116 at 14² / 232 at 7², 2.36 / 1.03 / 0.91 ms
against 2.03 / 0.88 / 0.71 ms (1.16x / 1.16x / 1.28x); 116 -> 116 at 28², 1.02x. In a network
the gain is larger: a DiCENet s=1.0 training step (4 x 224², 52 such convolutions) went from
101.1-103.7 to 88.0-88.9 ms (1.15-1.17x, three interleaved runs), DiCENet s=0.5 on the digits
(batch 32 of 32²) from 51.8 to 47.2 ms.

oneDNN keeps the rest. Grouped convolutions: a product per group through Python cost as much as it
saved (ESPNetv2's EESP units, four groups: 0.98x). Fewer than :data:`MIN_INPUT_CHANNELS` inputs.
16-bit operands (``torch.mm`` in bfloat16 was slower than oneDNN's convolution; under autocast the
convolution runs). ``F.conv2d`` also runs on CUDA (cuDNN), for NCHW inputs, strides, padding,
dilation and larger kernels, float64, without autograd (inference folds BN into these
convolutions and runs them as matrix products already, :mod:`src.kernels.inference_folding`) and
under a ``TorchDispatchMode`` (``FlopCounterMode`` then counts a convolution). ``torch.compile``
traces the Function's products. Results are ``torch.mm``'s, oneDNN's up to summation order.

Which of the two wins depends on the machine as well as the shape (on an AMD EPYC natively the
58-channel split half at 28² ran at 0.82x oneDNN, as an AVX2 CPU at 1.09x), so each training call
shape takes the faster, measured on its first call (:func:`src.kernels.choose`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from src.kernels import ATEN, OURS, candidate_steps, choose, declare, exporting, size_bucket
from src.kernels.cpu import dispatch_mode_active
from src.kernels.layout import channel_rows, from_channel_rows

# Fewer input channels keep oneDNN: ESPNetv2's image shortcut, 3 -> 64 channels at 56², took 0.72
# ms as products (the weight gradient's GEMM is 64 x 3 over 12,544 rows) against 0.44 ms.
MIN_INPUT_CHANNELS = 8


class PointwiseConv2d(nn.Conv2d):
    """``nn.Conv2d(C_in, C_out, 1, groups=g, bias=...)`` (same parameters, state-dict keys and
    initialisation) running :func:`pointwise_conv`.

    Shape:
        (B, C_in, H, W) -> (B, C_out, H, W)
    """

    def __init__(
        self, in_channels: int, out_channels: int, *, groups: int = 1, bias: bool = True
    ) -> None:
        super().__init__(in_channels, out_channels, 1, groups=groups, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return pointwise_conv(x, self.weight, self.bias, self.groups)


def pointwise_conv(x: Tensor, weight: Tensor, bias: Tensor | None, groups: int = 1) -> Tensor:
    """``F.conv2d(x, weight, bias, groups=groups)`` for a (C_out, C_in / g, 1, 1) weight, as a
    matrix product on x's rows where it applies (module docstring).

    Shape:
        x (B, C_in, H, W), weight (C_out, C_in / g, 1, 1), bias (C_out,) or None
        -> (B, C_out, H, W)
    """
    if not _applies(x, weight, bias, groups) or _path(x, weight, bias) == ATEN:
        return F.conv2d(x, weight, bias, groups=groups)
    return PointwiseConvCpuFunction.apply(x, weight, bias)


# OURS: the row products; ATEN: oneDNN's convolution
CPU_CHOICE = declare("pointwise_conv", (OURS, ATEN), device="cpu")


def _path(x: Tensor, weight: Tensor, bias: Tensor | None) -> str:
    """The row products or oneDNN's convolution for a training call: by
    :func:`~src.kernels.choose` (measured per shape on this machine). The pixel step says whether
    the rows are a whole map's or a channel slice's."""
    step = x.stride(3) if x.shape[3] > 1 else x.stride(2) if x.shape[2] > 1 else x.stride(0)
    key = (
        size_bucket(x.shape[0]), x.shape[1], weight.shape[0], *x.shape[2:], step,
        bias is not None, x.requires_grad, weight.requires_grad,
    )  # fmt: skip

    def run(path: str, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if path == OURS:
            return PointwiseConvCpuFunction.apply(x, weight, bias)
        return F.conv2d(x, weight, bias)

    def candidates() -> dict:
        return candidate_steps(run, (OURS, ATEN), x, weight, bias)

    return choose(CPU_CHOICE, key, candidates, default=OURS, reference=ATEN, device="cpu")


def row_view(x: Tensor) -> Tensor | None:
    """The (B H W, C) rows of a (B, C, H, W) map whose channels are contiguous and whose pixels
    are equally spaced (channels-last, or a channel slice of such a map), as a view; None for any
    other strides.

    Shape:
        (B, C, H, W) -> (B H W, C)
    """
    if x.dim() != 4 or (x.stride(1) != 1 and x.shape[1] > 1):
        return None
    batch, channels, height, width = x.shape
    # the distance between neighbouring pixels, along the first dimension that has them
    step = x.stride(3) if width > 1 else x.stride(2) if height > 1 else x.stride(0)
    if (
        (height > 1 and x.stride(2) != step * width)
        or (batch > 1 and x.stride(0) != step * width * height)
        or step < channels
    ):
        return None
    return x.as_strided((batch * height * width, channels), (step, 1))


def _applies(x: Tensor, weight: Tensor, bias: Tensor | None, groups: int) -> bool:
    return (
        x.is_cpu
        and groups == 1
        and torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad)
        and x.dtype == weight.dtype == torch.float32
        and (bias is None or bias.dtype == torch.float32)
        and not torch.is_autocast_enabled("cpu")  # autocast would run the convolution in 16 bits
        and weight.dim() == 4
        and weight.shape[1:] == (x.shape[1], 1, 1)
        and x.shape[1] >= MIN_INPUT_CHANNELS
        and not exporting()  # before the measured choice's key: no branch on a traced size
        and row_view(x) is not None
        and not dispatch_mode_active()
    )


class PointwiseConvCpuFunction(torch.autograd.Function):
    """The 1x1 convolution of x as ``F.linear`` on its rows, with the backward's two products
    written out (autograd through the strided row view would scatter into a copy of x)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        rows = row_view(x)  # (B H W, C_in), a view
        w = weight.view(weight.shape[0], weight.shape[1])  # (C_out, C_in)
        out = F.linear(rows, w, bias)  # (B H W, C_out)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return from_channel_rows(out, (x.shape[0], w.shape[0], x.shape[2], x.shape[3]))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        grad_rows = channel_rows(grad_y.contiguous(memory_format=torch.channels_last))
        rows = row_view(x)
        w = weight.view(weight.shape[0], weight.shape[1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = from_channel_rows(grad_rows @ w, x.shape)  # (R, C_in), channels-last
        if ctx.needs_input_grad[1]:
            grad_w = (grad_rows.t() @ rows).view(weight.shape)  # (C_out, C_in, 1, 1)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_rows.sum(0)
        return grad_x, grad_w, grad_b
