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

The fused Triton kernel (:mod:`src.kernels.dim_conv.triton_kernel`) computes the three branches in
one
launch and writes the interleaved output directly; it covers inputs at the build size, where no
resizing happens. Other sizes always take the PyTorch reference.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels import (
    ATEN,
    OURS,
    Timer,
    autocast_dtype,
    autocast_operands,
    candidate_steps,
    check_impl,
    choose,
    declare,
    exporting,
    needs_backward,
    size_bucket,
    use_triton,
)
from src.kernels.dim_conv import dim_conv_cpu, dim_conv_cpu_applies
from src.kernels.layout import is_channels_last


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
        impl: ``"auto"`` (on CUDA at the build size, the faster of the Triton kernel and the
            reference for each input shape, :func:`auto_path`), ``"reference"`` or ``"triton"``.

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
        if x.dim() != 4 or x.shape[1] != self.channels:
            raise ValueError(f"expected (B, {self.channels}, H, W), got {tuple(x.shape)}")
        weights = (self.weight_channel, self.weight_height, self.weight_width)
        kernel = use_triton(self.impl, x) and x.shape[-2:] == (self.height, self.width)
        if kernel and self.impl == "auto":
            kernel = auto_path(x, weights, self.dilation, self.interleave) == "triton"
        if kernel:
            from src.kernels.dim_conv.triton_kernel import dim_conv_triton

            return dim_conv_triton(x, *weights, dilation=self.dilation, interleave=self.interleave)
        if (
            self.impl == "auto"
            and dim_conv_cpu_applies(x, weights)
            and cpu_path_of(x, weights, self.dilation, self.interleave) == OURS
        ):
            y = dim_conv_cpu(x, *weights, dilation=self.dilation, interleave=self.interleave)
            if y is not None:  # None: dtypes the kernels do not take
                return y
        return dim_conv_reference(x, *weights, dilation=self.dilation, interleave=self.interleave)

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, height={self.height}, width={self.width}, "
            f"kernel_size={self.kernel_size}, dilation={self.dilation}, "
            f"interleave={self.interleave}, impl={self.impl!r}"
        )


CHOICE = declare("dim_conv", ("triton", "reference"))
# OURS: the C++ kernels; ATEN: the eager path's oneDNN convolutions
CPU_CHOICE = declare("dim_conv", (OURS, ATEN), device="cpu")


def auto_path(
    x: Tensor,
    weights: tuple[Tensor, Tensor, Tensor],
    dilation: tuple[int, int, int],
    interleave: bool,
    timer: Timer | None = None,
) -> str:
    """``impl="auto"`` on CUDA at the build size: "triton" or "reference" (cuDNN's depth-wise
    convolutions), whichever call (a training step when autograd wants the backward) ran faster on
    the first call with this input shape (batch by :func:`~src.kernels.size_bucket`), dtype and
    mode (:func:`~src.kernels.choose`); while ``torch.compile`` traces, that choice untimed (the
    eager steps' or the default), the kernel a custom op of the graph.

    Shape:
        x (B, C, H, W), weights as :class:`DimConv`'s
    """
    device = x.device.type
    autocast = autocast_dtype(device)
    key = (
        size_bucket(x.shape[0]), *x.shape[1:], x.dtype, autocast, dilation, interleave,
        str(x.device), needs_backward(x, *weights),
    )  # fmt: skip

    def run(path: str, x: Tensor, *weights: Tensor) -> Tensor:
        from src.kernels.dim_conv.triton_kernel import dim_conv_triton

        forward = dim_conv_triton if path == "triton" else dim_conv_reference
        return forward(x, *weights, dilation=dilation, interleave=interleave)

    def candidates() -> dict:
        return candidate_steps(run, ("triton", "reference"), x, *weights)

    # the kernel's weight gradients add float atomics in a run-dependent order; cuDNN's do not
    return choose(CHOICE, key, candidates, default="reference", timer=timer)


def cpu_path_of(
    x: Tensor,
    weights: tuple[Tensor, Tensor, Tensor],
    dilation: tuple[int, int, int],
    interleave: bool,
    timer: Timer | None = None,
) -> str:
    """``impl="auto"`` on the CPU, where the kernels apply: OURS or ATEN, measured per shape on
    this machine (:func:`~src.kernels.choose`). The kernels read every tap along the
    contiguous channels, which pays at 116-464 channels (1.6-2.9x) and not at DiCENet's 24-channel
    stem (0.69-0.82x on an AMD EPYC, AVX2 and AVX-512 alike).

    Shape:
        x (B, C, H, W) channels-last, weights as :class:`DimConv`'s
    """
    autocast = autocast_dtype("cpu")
    key = (
        size_bucket(x.shape[0]), *x.shape[1:], x.dtype, autocast, dilation, interleave,
        needs_backward(x, *weights),
    )  # fmt: skip

    def run(path: str, x: Tensor, *weights: Tensor) -> Tensor:
        y = None
        if path == OURS:  # None: dtypes the kernels do not take, where the eager path runs
            y = dim_conv_cpu(x, *weights, dilation=dilation, interleave=interleave)
        if y is None:
            y = dim_conv_reference(x, *weights, dilation=dilation, interleave=interleave)
        return y

    def candidates() -> dict:
        return candidate_steps(run, (OURS, ATEN), x, *weights)

    return choose(
        CPU_CHOICE, key, candidates, default=OURS, reference=ATEN, device="cpu", timer=timer
    )


def resize_matrix(n_in: int, n_out: int, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The linear map resizing an axis of length ``n_in`` to ``n_out`` as DiCE does.

    Growing: linear interpolation with ``align_corners=True`` (``F.interpolate(mode="bilinear")``
    along one axis). Shrinking: adaptive average pooling, output i averaging inputs
    ``[floor(i n_in / n_out), ceil((i + 1) n_in / n_out))``. Equal sizes give the identity.

    Shape:
        (n_out, n_in)
    """
    out_idx = torch.arange(n_out, device=device, dtype=torch.float64)
    in_idx = torch.arange(n_in, device=device, dtype=torch.float64)
    if n_out > n_in:
        pos = out_idx * ((n_in - 1) / (n_out - 1))  # n_out >= 2 here
        low = pos.floor().clamp(max=n_in - 1)
        high = (low + 1).clamp(max=n_in - 1)
        frac = (pos - low)[:, None]
        matrix = (1 - frac) * (in_idx == low[:, None]) + frac * (in_idx == high[:, None])
    else:
        start = torch.div(out_idx * n_in, n_out, rounding_mode="floor")
        end = -torch.div(-(out_idx + 1) * n_in, n_out, rounding_mode="floor")  # ceil
        inside = (in_idx >= start[:, None]) & (in_idx < end[:, None])
        matrix = inside / (end - start)[:, None]
    return matrix.to(dtype)


def resize_matrix_traced(
    n_in: int, n_out: int, *, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """:func:`resize_matrix` without a Python branch on the sizes, for exported graphs whose image
    size is dynamic: both maps are built from the index ranges and the graph picks one by
    comparing the sizes (equal sizes give the identity, as the pooling map does then).

    Shape:
        (n_out, n_in)
    """
    out_idx = torch.arange(n_out, device=device, dtype=torch.float64)
    in_idx = torch.arange(n_in, device=device, dtype=torch.float64)
    size_in, size_out = in_idx[-1:] + 1, out_idx[-1:] + 1  # (1,) each: the sizes as tensors
    pos = out_idx * ((size_in - 1) / (size_out - 1).clamp(min=1))
    low = torch.minimum(pos.floor(), size_in - 1)
    high = torch.minimum(low + 1, size_in - 1)
    frac = (pos - low)[:, None]
    grow = (1 - frac) * (in_idx == low[:, None]) + frac * (in_idx == high[:, None])
    start = torch.floor(out_idx * size_in / size_out)
    end = -torch.floor(-(out_idx + 1) * size_in / size_out)  # ceil
    inside = (in_idx >= start[:, None]) & (in_idx < end[:, None])
    shrink = inside / (end - start)[:, None]
    return torch.where(size_out > size_in, grow, shrink).to(dtype)


def resize_axis(x: Tensor, dim: int, size: int) -> Tensor:
    """Resize axis ``dim`` (1 or -1) of ``x`` to ``size`` with :func:`resize_matrix`.

    Shape:
        (B, N, A, M) -> (B, size, A, M) for dim=1, (B, N, A, size) for dim=-1.
    """
    n = x.shape[dim]
    if exporting():  # the size is the graph's: both resizes, chosen in the graph
        matrix = resize_matrix_traced(n, size, dtype=x.dtype, device=x.device)
    elif n == size:
        return x
    else:
        matrix = resize_matrix(n, size, dtype=x.dtype, device=x.device)
    if dim == 1:
        # (size, N) @ (B, N, A * M) -> (B, size, A * M) -> (B, size, A, M)
        return (matrix @ x.flatten(2)).unflatten(2, x.shape[2:])
    return x @ matrix.T  # (B, N, A, M) @ (M, size) -> (B, N, A, size)


def dim_conv_reference(
    x: Tensor,
    weight_channel: Tensor,
    weight_height: Tensor,
    weight_width: Tensor,
    *,
    dilation: tuple[int, int, int] = (1, 1, 1),
    interleave: bool = True,
) -> Tensor:
    """DimConv in plain PyTorch (the test oracle of the Triton kernel).

    The height- and width-wise convolutions share one transposed copy of the input, in memory order
    (b, h, c, w): read as (B, H, C, W) it is the height-wise conv's contiguous input, read as
    (B, W, H, C) it is the width-wise conv's input in channels-last layout. That saves a copy per
    call over transposing for each branch.

    Under ``torch.autocast`` the operands are cast to its dtype up front, so that the transposed
    copy and the resize matrices are in that dtype too; the result is what autocast gives the
    convolutions and products one by one, and the output is in that dtype.

    Shape:
        x (B, C, H, W), weight_channel (C, 1, k, k), weight_height (H_b, 1, k, k),
        weight_width (W_b, 1, k, k) -> (B, 3C, H, W), channels-last if x is
    """
    x, weight_channel, weight_height, weight_width = autocast_operands(
        x.device.type, x, weight_channel, weight_height, weight_width
    )
    channels, height, width = x.shape[1:]
    h_b, w_b = weight_height.shape[0], weight_width.shape[0]
    half = (weight_channel.shape[-1] - 1) // 2
    d_c, d_h, d_w = dilation
    y_channel = F.conv2d(x, weight_channel, padding=half * d_c, dilation=d_c, groups=channels)
    x_hcw = x.transpose(1, 2).contiguous()  # (B, C, H, W) -> (B, H, C, W)
    # height-wise: H groups, kernel over (C, W); resized to H_b rows and back
    x_h = resize_axis(x_hcw, 1, h_b)  # (B, H_b, C, W)
    y_h = F.conv2d(x_h, weight_height, padding=half * d_h, dilation=d_h, groups=h_b)
    y_height = resize_axis(y_h, 1, height).transpose(1, 2)  # (B, H, C, W) -> (B, C, H, W)
    # width-wise: W groups, kernel over (H, C); resized to W_b columns and back
    x_w = resize_axis(x_hcw, -1, w_b).permute(0, 3, 1, 2)  # (B, H, C, W_b) -> (B, W_b, H, C)
    y_w = F.conv2d(x_w, weight_width, padding=half * d_w, dilation=d_w, groups=w_b)
    y_w = y_w.permute(0, 2, 3, 1)  # (B, W_b, H, C) -> (B, H, C, W_b)
    y_width = resize_axis(y_w, -1, width).transpose(1, 2)  # (B, H, C, W) -> (B, C, H, W)
    branches = (y_channel, y_height, y_width)
    if is_channels_last(x):
        # channels-last in, channels-last out, as the Triton kernel: the convolutions and norms
        # after it then read one layout (a contiguous output cost the DiCENet s=1.0 CPU training
        # step 1-3% in layout copies). 3 x (B, H, W, C) views -> (B, H, W, C, 3) interleaved or
        # (B, H, W, 3, C) concatenated -> (B, H, W, 3C) -> (B, 3C, H, W)
        rows = [branch.permute(0, 2, 3, 1) for branch in branches]
        out = torch.stack(rows, dim=-1 if interleave else -2).flatten(-2)
        return out.permute(0, 3, 1, 2)
    # interleave: 3 x (B, C, H, W) -> (B, C, 3, H, W) -> (B, 3C, H, W); else concatenate
    if interleave:
        return torch.stack(branches, dim=2).flatten(1, 2)
    return torch.cat(branches, dim=1)
