"""Dimension-wise convolution (DimConv): depth-wise convolutions along channel, height and width.

DiCENet (Mehta et al., thesis ch. 3, Sec. 3.3.1, Fig. 3.3). A (B, C, H, W) tensor is convolved by
three depth-wise k x k convolutions, each treating one tensor dimension as its "depth":

- channel-wise: C groups on (B, C, H, W); the kernel of channel c slides over (H, W);
- height-wise: H groups on the tensor with H as channel axis, (B, H, C, W); the kernel of row h
  slides over the (C, W) plane, so it zero-pads along the channel axis;
- width-wise: W groups on **(B, W, H, C)** (dims 1 and 3 swapped, as in the official code); the
  kernel of column w slides over the (H, C) plane, so its first kernel axis is height, its second
  channel.

The outputs are interleaved per channel: output channel ``3c + b`` is branch b (0 channel-wise,
1 height-wise, 2 width-wise) of input channel c. This equals the official code's concatenation
[channel, height, width] followed by a 3-group channel shuffle (its order, not the D, W, H order of
Fig. 3.3). ``interleave=False`` returns the plain concatenation instead (the official DiCE with
``shuffle=False``).

The height- and width-wise kernels are built for a fixed height H_b and width W_b (DiCENet uses
224 / 2^level). Another input size is handled as in the official code (thesis Fig. 3.4): each
branch resizes only its own dimension to the build size before its convolution and back after it,
upsampling (linear, ``align_corners=True``) when the size grows and adaptive-average-pooling when it
shrinks. Both resizes are applied as a small (n_out, n_in) matrix product, numerically the same as
``F.interpolate``/``F.adaptive_avg_pool2d`` along one axis, so the op traces and exports with
plain matmuls (adaptive pooling to a non-divisor size has no ONNX form).

The op and its paths are :mod:`src.kernels.dim_conv`: the PyTorch reference (any size), the fused
Triton kernel (one launch for the three branches, writing the interleaved output directly) and the
C++ CPU kernels, both at the build size, where no resizing happens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from src.kernels import check_impl
from src.kernels.dim_conv import dim_conv, dim_conv_branches_exported, static_build_size
from src.kernels.dispatch import exporting


class DimConv(nn.Module):
    """Dimension-wise convolution: channel-, height- and width-wise depth-wise convs, interleaved.

    Args:
        channels: C, the input channels.
        height: H_b, the height the height-wise kernels are built for (one kernel per row).
        width: W_b, the width the width-wise kernels are built for (one kernel per column).
        kernel_size: k (odd); all three convolutions are k x k with "same" zero padding.
        dilation: (d_channel, d_height, d_width), one dilation per branch.
        interleave: output channel ``3c + b`` is branch b of channel c (the thesis's DimConv);
            False concatenates the branches [channel-wise, height-wise, width-wise] instead.
        impl: ``"auto"`` (at the build size, on CUDA the faster of the Triton kernel and the
            reference for each input shape, on a channels-last CPU tensor the faster of the C++
            kernels and the reference: :func:`src.kernels.dim_conv.auto_path`), ``"reference"``
            or ``"triton"``.

    Parameters: ``weight_channel`` (C, 1, k, k), ``weight_height`` (H_b, 1, k, k) with kernel axes
    (channel, width), ``weight_width`` (W_b, 1, k, k) with kernel axes (height, channel).

    Shape:
        (B, C, H, W) -> (B, 3C, H, W), any H and W.
    """

    def __init__(
        self,
        channels: int,
        height: int,
        width: int,
        *,
        kernel_size: int = 3,
        dilation: tuple[int, int, int] = (1, 1, 1),
        interleave: bool = True,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if min(channels, height, width) < 1:
            raise ValueError(
                f"channels, height and width must be positive, got {channels}, {height}, {width}"
            )
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and positive, got {kernel_size}")
        if len(dilation) != 3 or min(dilation) < 1:
            raise ValueError(f"dilation must be three positive ints, got {dilation}")
        self.channels = channels
        self.height = height
        self.width = width
        self.kernel_size = kernel_size
        self.dilation = tuple(int(d) for d in dilation)
        self.interleave = interleave
        self.impl = check_impl(impl)
        self.weight_channel = nn.Parameter(torch.empty(channels, 1, kernel_size, kernel_size))
        self.weight_height = nn.Parameter(torch.empty(height, 1, kernel_size, kernel_size))
        self.weight_width = nn.Parameter(torch.empty(width, 1, kernel_size, kernel_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Conv2d's default initialisation of a depth-wise kernel (fan-in k * k)
        for weight in (self.weight_channel, self.weight_height, self.weight_width):
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))

    def forward(self, x: Tensor) -> Tensor:
        weights = (self.weight_channel, self.weight_height, self.weight_width)
        return dim_conv(
            x, weights, dilation=self.dilation, interleave=self.interleave, impl=self.impl
        )

    def exported_branches(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """In a graph being exported at the build size (a static size): the three branches,
        not joined (:func:`~src.kernels.dim_conv.dim_conv_branches_exported`); None elsewhere.

        Shape:
            (B, C, H_b, W_b) -> 3 x (B, C, H_b, W_b)
        """
        if not (exporting() and static_build_size(x, self.height, self.width)):
            return None
        weights = (self.weight_channel, self.weight_height, self.weight_width)
        return dim_conv_branches_exported(x, weights, dilation=self.dilation)

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, height={self.height}, width={self.width}, "
            f"kernel_size={self.kernel_size}, dilation={self.dilation}, "
            f"interleave={self.interleave}, impl={self.impl!r}"
        )
