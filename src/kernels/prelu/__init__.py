"""PReLU (He et al., 2015) with a one-pass backward on the CPU: the activation of every CBR unit
of DiCENet, ESPNetv2 and their detection and segmentation heads.

The map is ``F.prelu``'s: ``y = x`` where ``x > 0``, else ``a_c * x``, one slope per channel
(axis 1). Only the CPU backward differs. ATen's CPU kernel writes a per-element slope gradient
and sums it afterwards, at about 2 ns an element on 2 cores, cache-warm: 26 ms of a 160 ms
DiCENet s=1.0 training step (4 images of 224², float32). ``lightnets_cpu::prelu_backward``
(``src/kernels/prelu/prelu.cpp``) reads x and the output gradient once, writes the input gradient
and sums the slope gradient as it goes. Several passes of ATen ops instead (ReLU's gradient,
``lerp``, ``clamp``, ``mul``, ``sum``) were 2.6x faster on a warm tensor but no faster in the
network, where each pass streams its tensors from memory.

The input gradient is ATen's bit for bit; the slope gradient is summed in float32 in a fixed order
(per plane or block of rows, then in order), so it does not depend on the thread count.

``torch.compile`` traces the same Function, the kernel an opaque node of the backward graph, so a
compiled step gives the eager step's gradients bit for bit. ``F.prelu`` itself runs on CUDA (ATen's
kernel is one pass each way there), without autograd, for a single slope, for a layout other than
contiguous or 4-D channels-last, and where the CPU kernels cannot be built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.dispatch import autocast_operands, opaque_op
from src.kernels.layout import channel_rows, from_channel_rows, is_channels_last
from src.kernels.prelu import contract as contract

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class PReLU(nn.PReLU):
    """``nn.PReLU`` (same parameter, state-dict key and initialisation) running :func:`prelu`.

    Shape:
        (B, C, ...) -> (B, C, ...)
    """

    def forward(self, x: Tensor) -> Tensor:
        return prelu(x, self.weight)


def prelu(x: Tensor, weight: Tensor) -> Tensor:
    """``F.prelu(x, weight)``, through :class:`PReLUCpuFunction` where it applies (see the module
    docstring).

    Under ``torch.autocast`` both operands are cast to its dtype first, as autocast casts
    ``F.prelu``'s (float32 slopes keep float32 gradients).

    Shape:
        x (B, C, ...), weight (C,) or (1,) -> x's shape
    """
    if (  # the cheapest tests first: inference returns at once
        not torch.is_grad_enabled()
        or not (x.requires_grad or weight.requires_grad)
        or not x.is_cpu
        or weight.numel() == 1
        or x.dim() < 2
        or _layout(x) is None
    ):
        return F.prelu(x, weight)
    x_cast, weight_cast = autocast_operands("cpu", x, weight)
    if (
        x_cast.dtype not in KERNEL_DTYPES
        or weight_cast.dtype != x_cast.dtype
        or weight_cast.shape != (x.shape[1],)
        or not cpu_kernels_loaded()
    ):
        return F.prelu(x, weight)  # which explains a mismatch of dtypes or shapes
    return PReLUCpuFunction.apply(x_cast, weight_cast)


@opaque_op("lightnets::prelu_backward", contract.BACKWARD_SCHEMA, contract.backward_fake)
def prelu_backward(grad_y: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """``lightnets_cpu::prelu_backward``: (grad_x, float32 grad_weight) of the kernel's views of
    the output gradient and x (see :func:`_kernel_view`); opaque to ``torch.compile``.

    Shape:
        grad_y, x (R, C) or (B, C, S), weight (C,) -> (x's shape, (C,))
    """
    grad_x, grad_weight = torch.ops.lightnets_cpu.prelu_backward(grad_y, x, weight)
    return grad_x, grad_weight


def _layout(x: Tensor) -> torch.memory_format | None:
    """The memory format the kernel reads ``x`` in: rows of channels (a (B, C) matrix or 4-D
    channels-last) or planes per channel (contiguous); None for any other strides."""
    if x.is_contiguous():
        return torch.contiguous_format
    return torch.channels_last if is_channels_last(x) else None


def _kernel_view(t: Tensor, layout: torch.memory_format) -> Tensor:
    """``t`` as the kernel reads it, a view: (R, C) for a (B, C) matrix or channels-last
    (B, C, H, W) -> (B H W, C); (B, C, S) for a contiguous (B, C, ...) tensor."""
    if t.dim() == 2:
        return t
    if layout == torch.channels_last:
        return channel_rows(t)
    return t.reshape(t.shape[0], t.shape[1], -1)


class PReLUCpuFunction(torch.autograd.Function):
    """PReLU's forward by ATen, its backward by ``lightnets_cpu::prelu_backward``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:  # type: ignore[override]
        # x and weight share a dtype, which autocast would not change: no autocast context needed
        y = F.prelu(x, weight)
        ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, Tensor | None]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        layout = _layout(x)
        assert layout is not None  # prelu() only applies the Function to these layouts
        grad_y = grad_y.contiguous(memory_format=layout)  # a copy only if autograd's layout differs
        grad_x, grad_w = prelu_backward(
            _kernel_view(grad_y, layout), _kernel_view(x, layout), weight
        )
        if x.dim() > 2 and layout == torch.channels_last:
            grad_x = from_channel_rows(grad_x, x.shape)  # channels-last as x
        else:
            grad_x = grad_x.view(x.shape)
        return (
            grad_x if ctx.needs_input_grad[0] else None,
            grad_w.to(weight.dtype) if ctx.needs_input_grad[1] else None,
        )
