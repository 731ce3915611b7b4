"""DimConv on the CPU kernels (training and inference without folding), for channels-last maps.

The eager path (:func:`src.ops.dim_conv.dim_conv_reference`) runs three depth-wise oneDNN
convolutions, two of them on transposed copies of the input (height or width as the channel
axis), and stacks the three branches; its backward makes as many passes again. On 2 cores this
was a fifth of a DiCENet s=1.0 training step. ``lightnets_cpu::dim_conv_forward`` and
``dim_conv_backward`` (``src/kernels/dim_conv/dim_conv.cpp``) compute all three branches in one
pass over
the rows of channels each way, reading every tap along the contiguous channels, and write the
interleaved (or concatenated) output directly. The weight gradients are summed in float32 per fixed
block of rows and the blocks in order, so they do not depend on the thread count.

The kernels cover DimConv with ``impl="auto"`` at its build size on a channels-last CPU tensor in
float32, bfloat16 or float16 (after autocast's casts); everything else takes the eager path, as
does a ``TorchDispatchMode`` (``FlopCounterMode`` then counts the three convolutions; fake
tensors). ``torch.compile`` sees both directions as opaque ops.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from src.kernels.cpu import cpu_kernels_loaded, dispatch_mode_active
from src.kernels.dim_conv import contract as contract
from src.kernels.dispatch import autocast_off, autocast_operands, opaque_op
from src.kernels.layout import is_channels_last

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def dim_conv_cpu_applies(x: Tensor, weights: tuple[Tensor, Tensor, Tensor]) -> bool:
    """Whether :func:`dim_conv_cpu` takes ``x``: a channels-last CPU tensor at the build size
    (H and W equal to the height- and width-wise kernel counts), outside any dispatch mode, with
    the kernels built. The dtypes are checked by :func:`dim_conv_cpu` after autocast's casts."""
    weight_channel, weight_height, weight_width = weights
    return (
        x.is_cpu
        and is_channels_last(x)
        and x.shape[1] == weight_channel.shape[0]
        and x.shape[2:] == (weight_height.shape[0], weight_width.shape[0])
        and not dispatch_mode_active()
        and cpu_kernels_loaded()
    )


def dim_conv_cpu(
    x: Tensor,
    weight_channel: Tensor,
    weight_height: Tensor,
    weight_width: Tensor,
    *,
    dilation: tuple[int, int, int],
    interleave: bool,
) -> Tensor | None:
    """DimConv by the CPU kernels, or None where the operands' dtypes after autocast's casts are
    not the kernels' (the caller then takes the eager path). Under ``torch.autocast`` every
    operand is cast to its dtype first, as the eager path casts them (float32 weights keep float32
    gradients).

    Shape:
        x (B, C, H, W) channels-last, weight_channel (C, 1, k, k), weight_height (H, 1, k, k),
        weight_width (W, 1, k, k) -> (B, 3C, H, W) channels-last
    """
    operands = autocast_operands("cpu", x, weight_channel, weight_height, weight_width)
    if operands[0].dtype not in KERNEL_DTYPES or any(
        w.dtype != operands[0].dtype for w in operands[1:]
    ):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in operands):
        return DimConvCpuFunction.apply(*operands, dilation, interleave)
    x_rows, *weights = _kernel_views(*operands)
    y = dim_conv_forward(x_rows, *weights, list(dilation), interleave)
    return y.permute(0, 3, 1, 2)


def _kernel_views(x: Tensor, *weights: Tensor) -> tuple[Tensor, ...]:
    """x (B, C, H, W) channels-last as (B, H, W, C); each weight (n, 1, k, k) as (n, k, k)."""
    return (x.permute(0, 2, 3, 1), *(w.squeeze(1) for w in weights))


@opaque_op(
    "lightnets::dim_conv_forward", contract.FORWARD_SCHEMA, contract.channels_last_forward_fake
)
def dim_conv_forward(
    x: Tensor, weight_channel: Tensor, weight_height: Tensor, weight_width: Tensor,
    dilation: list[int], interleave: bool,
) -> Tensor:  # fmt: skip
    """``lightnets_cpu::dim_conv_forward``; opaque to ``torch.compile``.

    Shape:
        x (B, H, W, C), weights (C, k, k), (H, k, k), (W, k, k) -> (B, H, W, 3C)
    """
    return torch.ops.lightnets_cpu.dim_conv_forward(
        x, weight_channel, weight_height, weight_width, dilation, interleave
    )


@opaque_op(
    "lightnets::dim_conv_backward",
    contract.CHANNELS_LAST_BACKWARD_SCHEMA,
    contract.channels_last_backward_fake,
)
def dim_conv_backward(
    grad_y: Tensor, x: Tensor, weight_channel: Tensor, weight_height: Tensor,
    weight_width: Tensor, dilation: list[int], interleave: bool, input_grad: bool,
    weight_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``lightnets_cpu::dim_conv_backward``: grad_x and the three float32 weight gradients, each
    an empty tensor where not wanted; opaque to ``torch.compile``.

    Shape:
        grad_y (B, H, W, 3C), x (B, H, W, C), weights as :func:`dim_conv_forward`'s
        -> (x's shape, the weights' shapes)
    """
    grad_x, grad_c, grad_h, grad_w = torch.ops.lightnets_cpu.dim_conv_backward(
        grad_y, x, weight_channel, weight_height, weight_width, dilation, interleave,
        input_grad, weight_grad,
    )  # fmt: skip
    return grad_x, grad_c, grad_h, grad_w


class DimConvCpuFunction(torch.autograd.Function):
    """Both directions of DimConv by the CPU kernels, on a channels-last x."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight_channel: Tensor,
        weight_height: Tensor,
        weight_width: Tensor,
        dilation: tuple[int, int, int],
        interleave: bool,
    ) -> Tensor:
        with autocast_off("cpu"):  # the operands share a dtype already
            views = _kernel_views(x, weight_channel, weight_height, weight_width)
            y = dim_conv_forward(*views, list(dilation), interleave)
        ctx.save_for_backward(*views)
        ctx.dilation, ctx.interleave = list(dilation), interleave
        return y.permute(0, 3, 1, 2)  # (B, H, W, 3C) -> (B, 3C, H, W) channels-last

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, *weights = ctx.saved_tensors
        wanted = ctx.needs_input_grad
        weight_grad = any(wanted[1:4])
        # a copy only if autograd's layout differs from the output's
        grad_rows = grad_y.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
        grad_x, *grad_weights = dim_conv_backward(
            grad_rows, x, *weights, ctx.dilation, ctx.interleave, wanted[0], weight_grad
        )
        return (
            grad_x.permute(0, 3, 1, 2) if wanted[0] else None,
            *(
                g.to(w.dtype).unsqueeze(1) if want else None
                for g, w, want in zip(grad_weights, weights, wanted[1:4], strict=True)
            ),
            None,
            None,
        )
