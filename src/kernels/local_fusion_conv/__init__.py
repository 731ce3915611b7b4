"""DimFuse's local-fusion convolution (DiCENet, thesis Sec. 3.3.1) with one-pass CPU kernels.

The map is ``F.conv2d(x, weight, groups=C)`` for a ``(C, K, 1, 1)`` weight: a grouped 1x1
convolution with one output channel per group, ``y_c = sum_b w_cb x_(cK+b)``. In DiCE, K = 3 and
group c reads the three dimension-wise responses of channel c. oneDNN runs it as a general grouped
convolution, which on 2 cores took 0.15 ms forward and 0.41 ms backward for a 4 x 348 x 14 x 14
channels-last input, several times a pass over the map, and about a tenth of a DiCENet s=1.0
training step in all. On the CPU, for channels-last inputs, ``lightnets_cpu::local_fusion_
convolution`` and its backward (``src/kernels/local_fusion_conv/local_fusion_convolution.cpp``) read
each row of channels once per direction. Sums run in float32; the weight gradient is summed per
fixed block of rows and the blocks in order, so it does not depend on the thread count.

``F.conv2d`` runs on CUDA (where DiCE's fused Triton pass replaces the whole local fusion, see
:class:`src.ops.dice.DiCE`), for contiguous inputs, for float64 and where the CPU kernels cannot be
built, and under a ``TorchDispatchMode`` (``FlopCounterMode``, which then counts the convolution,
fake tensors), to which the kernels are invisible. ``torch.compile`` sees both directions as
opaque ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from src.kernels.cpu import cpu_kernels_loaded, dispatch_mode_active
from src.kernels.dispatch import autocast_off, autocast_operands, opaque_op
from src.kernels.layout import channel_rows, from_channel_rows, is_channels_last
from src.kernels.local_fusion_conv import contract as contract

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class LocalFusionConv(nn.Conv2d):
    """``nn.Conv2d(K C, C, 1, groups=C, bias=False)`` (same parameter, state-dict key and
    initialisation) running :func:`local_fusion_conv`.

    Args:
        channels: C, the output channels (and groups).
        fan_in: K, the input channels each output fuses (3 in DiCE).

    Shape:
        (B, K C, H, W) -> (B, C, H, W)
    """

    def __init__(self, channels: int, fan_in: int = 3) -> None:
        super().__init__(fan_in * channels, channels, 1, groups=channels, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return local_fusion_conv(x, self.weight)


def local_fusion_conv(x: Tensor, weight: Tensor) -> Tensor:
    """``F.conv2d(x, weight, groups=weight.shape[0])``, by the CPU kernels where they apply (see
    the module docstring).

    Under ``torch.autocast`` both operands are cast to its dtype first, as autocast casts
    ``F.conv2d``'s (a float32 weight keeps a float32 gradient).

    Shape:
        x (B, K C, H, W), weight (C, K, 1, 1) -> (B, C, H, W)
    """
    channels = weight.shape[0]
    if (
        not x.is_cpu
        or dispatch_mode_active()
        or not is_channels_last(x)
        or weight.dim() != 4
        or weight.shape[2:] != (1, 1)
        or x.shape[1] != channels * weight.shape[1]
    ):
        return F.conv2d(x, weight, groups=channels)
    x_cast, weight_cast = autocast_operands("cpu", x, weight)
    if (
        x_cast.dtype not in KERNEL_DTYPES
        or weight_cast.dtype != x_cast.dtype
        or not cpu_kernels_loaded()
    ):
        return F.conv2d(x, weight, groups=channels)  # which explains a mismatch of dtypes
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return LocalFusionConvFunction.apply(x_cast, weight_cast)
    y = local_fusion_convolution(channel_rows(x_cast), weight_cast.flatten(1))
    return from_channel_rows(y, (x.shape[0], channels, *x.shape[2:]))


@opaque_op("lightnets::local_fusion_convolution", contract.FORWARD_SCHEMA, contract.forward_fake)
def local_fusion_convolution(x: Tensor, weight: Tensor) -> Tensor:
    """``lightnets_cpu::local_fusion_convolution`` on rows of channels; opaque to
    ``torch.compile``.

    Shape:
        x (R, K C), weight (C, K) -> (R, C)
    """
    return torch.ops.lightnets_cpu.local_fusion_convolution(x, weight)


@opaque_op(
    "lightnets::local_fusion_convolution_backward",
    contract.BACKWARD_SCHEMA,
    contract.backward_fake,
)
def local_fusion_convolution_backward(
    grad_y: Tensor, x: Tensor, weight: Tensor, input_grad: bool, weight_grad: bool
) -> tuple[Tensor, Tensor]:
    """``lightnets_cpu::local_fusion_convolution_backward``: (grad_x, float32 grad_weight), each
    an empty tensor where not wanted; opaque to ``torch.compile``.

    Shape:
        grad_y (R, C), x (R, K C), weight (C, K) -> ((R, K C), (C, K))
    """
    grad_x, grad_weight = torch.ops.lightnets_cpu.local_fusion_convolution_backward(
        grad_y, x, weight, input_grad, weight_grad
    )
    return grad_x, grad_weight


class LocalFusionConvFunction(torch.autograd.Function):
    """Both directions by the CPU kernels, on a channels-last x's rows of channels."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:  # type: ignore[override]
        with autocast_off("cpu"):  # x and weight share a dtype already
            rows, weight_rows = channel_rows(x), weight.flatten(1)
            y = local_fusion_convolution(rows, weight_rows)
        ctx.save_for_backward(rows, weight_rows)
        ctx.shapes = x.shape, weight.shape
        return from_channel_rows(y, (x.shape[0], weight.shape[0], *x.shape[2:]))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, Tensor | None]:  # type: ignore[override]
        rows, weight_rows = ctx.saved_tensors
        x_shape, weight_shape = ctx.shapes
        input_grad, weight_grad = ctx.needs_input_grad
        # a copy only if autograd's layout differs from x's
        grad_rows = channel_rows(grad_y.contiguous(memory_format=torch.channels_last))
        grad_x, grad_w = local_fusion_convolution_backward(
            grad_rows, rows, weight_rows, input_grad, weight_grad
        )
        return (
            from_channel_rows(grad_x, x_shape) if input_grad else None,
            grad_w.to(weight_rows.dtype).view(weight_shape) if weight_grad else None,
        )
