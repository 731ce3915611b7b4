"""Fused DimConv: the channel-, height- and width-wise convolutions in one kernel launch.

The thesis's optimised DimConv (ch. 3, Sec. 3.3.1): instead of three depth-wise convolutions on
three transposed copies of the input, followed by a concatenation and a shuffle, one program reads a
(channel x row x column) tile of one image and computes all three branches for its pixels, writing
output channels 3c, 3c + 1 and 3c + 2 (or c, C + c and 2C + c when not interleaved) directly. No
transposed copy, concatenation or shuffle is materialised.

For input x (B, C, H, W), kernel k (odd), half-width p = (k - 1) // 2, dilations (d_c, d_h, d_w):

- channel-wise  y_c[b, c, h, w] = sum_ij W_c[c, i, j] x[b, c, h + (i-p) d_c, w + (j-p) d_c]
- height-wise   y_h[b, c, h, w] = sum_ij W_h[h, i, j] x[b, c + (i-p) d_h, h, w + (j-p) d_h]
- width-wise    y_w[b, c, h, w] = sum_ij W_w[w, i, j] x[b, c + (j-p) d_w, h + (i-p) d_w, w]

Backward is all Triton: the input gradient is the same stencil with mirrored offsets, read from the
three output-gradient slots and summed (one launch); the weight gradients reduce
``grad_y * shifted x`` over the tile and a block of images inside each program and accumulate the
per-program partial sums with float32 atomics (one launch). Accumulation is float32 for every
input dtype. The GPU tile (512 pixels, :mod:`src.kernels.triton.stencil`) and weight-gradient grid
(about 512 programs) were picked by a small sweep on an H100 at DiCENet shapes.

Every tensor is addressed through its own strides, so a channels-last network (the GPU trainer's
layout) is read and written in place: a channels-last input gives a channels-last output and input
gradient, and neither direction makes a contiguous copy.

Only inputs at the layer's build size (H = H_b, W = W_b) come here; see
:func:`src.kernels.dim_conv.dim_conv`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.dim_conv import contract as contract
from src.kernels.dim_conv.contract import Weights
from src.kernels.dispatch import autocast_off, autocast_operands, check_same_dtype, opaque_op
from src.kernels.triton.launch import gpu_launch
from src.kernels.triton.stencil import launch_config, tile

PROGRAMS_GPU = 512
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def dim_conv_branches(
    x_img, wc_ptr, wh_ptr, ww_ptr, c, h, w, C, H, W, sx_c, sx_h, sx_w,
    K: tl.constexpr, D_C: tl.constexpr, D_H: tl.constexpr, D_W: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """The channel-, height- and width-wise responses of one image's (c, h, w) tile, in float32;
    arbitrary (finite) values where the tile runs past the tensor."""
    c_ok = c < C
    h_ok = h < H
    w_ok = w < W
    acc_c = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    acc_h = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    acc_w = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    P: tl.constexpr = (K - 1) // 2
    for i in tl.static_range(K):
        for j in tl.static_range(K):
            tap = i * K + j
            # channel-wise: taps over (h, w), one kernel per channel
            hs = h + (i - P) * D_C
            ws = w + (j - P) * D_C
            m = c_ok & (hs >= 0) & (hs < H) & (ws >= 0) & (ws < W)
            xv = tl.load(x_img + c * sx_c + hs * sx_h + ws * sx_w, mask=m, other=0.0)
            wv = tl.load(wc_ptr + c * (K * K) + tap, mask=c_ok, other=0.0).to(tl.float32)
            acc_c += xv.to(tl.float32) * wv
            # height-wise: taps over (c, w), one kernel per row
            cs = c + (i - P) * D_H
            ws = w + (j - P) * D_H
            m = h_ok & (cs >= 0) & (cs < C) & (ws >= 0) & (ws < W)
            xv = tl.load(x_img + cs * sx_c + h * sx_h + ws * sx_w, mask=m, other=0.0)
            wv = tl.load(wh_ptr + h * (K * K) + tap, mask=h_ok, other=0.0).to(tl.float32)
            acc_h += xv.to(tl.float32) * wv
            # width-wise: taps over (h, c), one kernel per column
            hs = h + (i - P) * D_W
            cs = c + (j - P) * D_W
            m = w_ok & (cs >= 0) & (cs < C) & (hs >= 0) & (hs < H)
            xv = tl.load(x_img + cs * sx_c + hs * sx_h + w * sx_w, mask=m, other=0.0)
            wv = tl.load(ww_ptr + w * (K * K) + tap, mask=w_ok, other=0.0).to(tl.float32)
            acc_w += xv.to(tl.float32) * wv
    return acc_c, acc_h, acc_w


@triton.jit
def _dim_conv_fwd_kernel(
    x_ptr, wc_ptr, wh_ptr, ww_ptr, y_ptr,
    C, H, W,
    sx_b, sx_c, sx_h, sx_w,
    sy_b, sy_c, sy_h, sy_w,
    slot_stride, chan_stride,
    K: tl.constexpr, D_C: tl.constexpr, D_H: tl.constexpr, D_W: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    b, c, h, w = tile(C, H, W, BLOCK_C, BLOCK_H, BLOCK_W)
    acc_c, acc_h, acc_w = dim_conv_branches(
        x_ptr + b * sx_b, wc_ptr, wh_ptr, ww_ptr, c, h, w, C, H, W, sx_c, sx_h, sx_w,
        K, D_C, D_H, D_W, BLOCK_C, BLOCK_H, BLOCK_W,
    )  # fmt: skip
    m = (c < C) & (h < H) & (w < W)
    out = y_ptr + b * sy_b + (c * chan_stride) * sy_c + h * sy_h + w * sy_w
    dtype = y_ptr.dtype.element_ty
    tl.store(out, acc_c.to(dtype), mask=m)
    tl.store(out + slot_stride * sy_c, acc_h.to(dtype), mask=m)
    tl.store(out + 2 * slot_stride * sy_c, acc_w.to(dtype), mask=m)


@triton.jit
def _dim_conv_bwd_input_kernel(
    gy_ptr, wc_ptr, wh_ptr, ww_ptr, gx_ptr,
    C, H, W,
    sy_b, sy_c, sy_h, sy_w,
    sx_b, sx_c, sx_h, sx_w,
    slot_stride, chan_stride,
    K: tl.constexpr, D_C: tl.constexpr, D_H: tl.constexpr, D_W: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    b, c, h, w = tile(C, H, W, BLOCK_C, BLOCK_H, BLOCK_W)
    gy_img = gy_ptr + b * sy_b
    c_ok = c < C
    h_ok = h < H
    w_ok = w < W
    acc = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    P: tl.constexpr = (K - 1) // 2
    for i in tl.static_range(K):
        for j in tl.static_range(K):
            tap = i * K + j
            # channel-wise: x[c, h, w] feeds y_c[c, h - (i-p)d, w - (j-p)d] through W_c[c, i, j]
            hs = h - (i - P) * D_C
            ws = w - (j - P) * D_C
            m = c_ok & (hs >= 0) & (hs < H) & (ws >= 0) & (ws < W)
            g = tl.load(
                gy_img + (c * chan_stride) * sy_c + hs * sy_h + ws * sy_w, mask=m, other=0.0
            )
            wv = tl.load(wc_ptr + c * (K * K) + tap, mask=c_ok, other=0.0).to(tl.float32)
            acc += g.to(tl.float32) * wv
            # height-wise: feeds y_h[c - (i-p)d, h, w - (j-p)d] through W_h[h, i, j]
            cs = c - (i - P) * D_H
            ws = w - (j - P) * D_H
            m = h_ok & (cs >= 0) & (cs < C) & (ws >= 0) & (ws < W)
            g = tl.load(
                gy_img + (cs * chan_stride + slot_stride) * sy_c + h * sy_h + ws * sy_w,
                mask=m,
                other=0.0,
            )
            wv = tl.load(wh_ptr + h * (K * K) + tap, mask=h_ok, other=0.0).to(tl.float32)
            acc += g.to(tl.float32) * wv
            # width-wise: feeds y_w[c - (j-p)d, h - (i-p)d, w] through W_w[w, i, j]
            hs = h - (i - P) * D_W
            cs = c - (j - P) * D_W
            m = w_ok & (cs >= 0) & (cs < C) & (hs >= 0) & (hs < H)
            g = tl.load(
                gy_img + (cs * chan_stride + 2 * slot_stride) * sy_c + hs * sy_h + w * sy_w,
                mask=m,
                other=0.0,
            )
            wv = tl.load(ww_ptr + w * (K * K) + tap, mask=w_ok, other=0.0).to(tl.float32)
            acc += g.to(tl.float32) * wv
    m = c_ok & h_ok & w_ok
    gx = gx_ptr + b * sx_b + c * sx_c + h * sx_h + w * sx_w
    tl.store(gx, acc.to(gx_ptr.dtype.element_ty), mask=m)


@triton.jit
def _dim_conv_bwd_weight_kernel(
    x_ptr, gy_ptr, gwc_ptr, gwh_ptr, gww_ptr,
    B, C, H, W,
    sx_b, sx_c, sx_h, sx_w,
    sy_b, sy_c, sy_h, sy_w,
    slot_stride, chan_stride,
    K: tl.constexpr, D_C: tl.constexpr, D_H: tl.constexpr, D_W: tl.constexpr,
    BATCH_BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    # one program: a (channel, row, column) tile over BATCH_BLOCK images; summing over the images
    # before the atomics keeps the few kernel addresses (H_b and W_b rows of k * k) uncontended
    n_hblocks = tl.cdiv(H, BLOCK_H)
    pid_bh = tl.program_id(0)  # batch block * n_hblocks + row block
    b_first = ((pid_bh // n_hblocks) * BATCH_BLOCK).to(tl.int64)
    b_last = tl.minimum(b_first + BATCH_BLOCK, B)
    c1 = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    h1 = (pid_bh % n_hblocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    w1 = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)
    # (BLOCK_C, 1, 1), (1, BLOCK_H, 1), (1, 1, BLOCK_W)
    c = c1[:, None, None]
    h = h1[None, :, None]
    w = w1[None, None, :]
    m_out = (c < C) & (h < H) & (w < W)
    gy_tile = (c * chan_stride) * sy_c + h * sy_h + w * sy_w
    P: tl.constexpr = (K - 1) // 2
    for i in tl.static_range(K):
        for j in tl.static_range(K):
            tap = i * K + j
            # products summed elementwise over the images; reduced over the tile once
            acc_c = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
            acc_h = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
            acc_w = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
            for b in range(b_first, b_last):
                x_img = x_ptr + b * sx_b
                gy = gy_ptr + b * sy_b + gy_tile
                # channel-wise: W_c[c] sums over (h, w)
                hs = h + (i - P) * D_C
                ws = w + (j - P) * D_C
                m = m_out & (hs >= 0) & (hs < H) & (ws >= 0) & (ws < W)
                xv = tl.load(x_img + c * sx_c + hs * sx_h + ws * sx_w, mask=m, other=0.0)
                acc_c += tl.load(gy, mask=m_out, other=0.0).to(tl.float32) * xv.to(tl.float32)
                # height-wise: W_h[h] sums over (c, w)
                cs = c + (i - P) * D_H
                ws = w + (j - P) * D_H
                m = m_out & (cs >= 0) & (cs < C) & (ws >= 0) & (ws < W)
                xv = tl.load(x_img + cs * sx_c + h * sx_h + ws * sx_w, mask=m, other=0.0)
                g = tl.load(gy + slot_stride * sy_c, mask=m_out, other=0.0).to(tl.float32)
                acc_h += g * xv.to(tl.float32)
                # width-wise: W_w[w] sums over (c, h)
                hs = h + (i - P) * D_W
                cs = c + (j - P) * D_W
                m = m_out & (cs >= 0) & (cs < C) & (hs >= 0) & (hs < H)
                xv = tl.load(x_img + cs * sx_c + hs * sx_h + w * sx_w, mask=m, other=0.0)
                g = tl.load(gy + 2 * slot_stride * sy_c, mask=m_out, other=0.0).to(tl.float32)
                acc_w += g * xv.to(tl.float32)
            part_c = tl.sum(tl.sum(acc_c, axis=2), axis=1)  # (BLOCK_C,)
            part_h = tl.sum(tl.sum(acc_h, axis=2), axis=0)  # (BLOCK_H,)
            part_w = tl.sum(tl.sum(acc_w, axis=1), axis=0)  # (BLOCK_W,)
            tl.atomic_add(gwc_ptr + c1 * (K * K) + tap, part_c, mask=c1 < C)
            tl.atomic_add(gwh_ptr + h1 * (K * K) + tap, part_h, mask=h1 < H)
            tl.atomic_add(gww_ptr + w1 * (K * K) + tap, part_w, mask=w1 < W)


def _output_order(interleave: bool, channels: int) -> dict:
    """Where branch ``slot`` of channel c lies in DimConv's 3C outputs: interleaved at 3c + slot,
    concatenated at slot * C + c."""
    if interleave:
        return {"slot_stride": 1, "chan_stride": 3}
    return {"slot_stride": channels, "chan_stride": 1}


def _weight_grid(
    grid: tuple[int, int, int], batch: int, on_gpu: bool
) -> tuple[tuple[int, int, int], int]:
    """The weight-gradient grid: images grouped into batch blocks, about ``PROGRAMS_GPU`` programs
    on a GPU (the interpreter takes the whole batch per program)."""
    per_image = grid[0] // batch * grid[1] * grid[2]
    batch_block = max(1, min(batch, batch * per_image // PROGRAMS_GPU)) if on_gpu else batch
    n_blocks = triton.cdiv(batch, batch_block)
    return (n_blocks * (grid[0] // batch), grid[1], grid[2]), batch_block


class _DimConvFunction(torch.autograd.Function):
    """Autograd wrapper of the fused DimConv. The kernels are launched inside the custom ops
    ``lightnets::dim_conv_triton`` and ``lightnets::dim_conv_triton_backward``, so that
    ``torch.compile`` traces this Function without looking into a launch (it cannot trace one in
    the interpreter). The operands share one dtype (:func:`dim_conv_triton` applied autocast's
    rule); the three weights come last, as autograd's inputs."""

    @staticmethod
    def forward(
        ctx, x: Tensor, dilation: tuple[int, int, int], interleave: bool, *weights: Tensor
    ) -> Tensor:
        # x is read through its strides (NCHW, channels-last or any view): no copy
        weights = [w.contiguous() for w in weights]
        with autocast_off(x.device.type):
            y = dim_conv_forward(x, *weights, dilation, interleave)
        ctx.save_for_backward(x, *weights)
        ctx.dilation = dilation
        ctx.interleave = interleave
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        x, wc, wh, ww = ctx.saved_tensors
        want_x = ctx.needs_input_grad[0]
        want_w = any(ctx.needs_input_grad[3:])
        with autocast_off(x.device.type):
            grads = dim_conv_backward(
                grad_y, x, wc, wh, ww, ctx.dilation, ctx.interleave, want_x, want_w
            )
        given = iter(grads)
        grad_x = next(given) if want_x else None
        grad_wc, grad_wh, grad_ww = (next(given) for _ in range(3)) if want_w else (None,) * 3
        return grad_x, None, None, grad_wc, grad_wh, grad_ww


@opaque_op("lightnets::dim_conv_triton", contract.FORWARD_SCHEMA, contract.forward_fake)
def dim_conv_forward(
    x: Tensor,
    weight_channel: Tensor,
    weight_height: Tensor,
    weight_width: Tensor,
    dilation: Sequence[int],
    interleave: bool,
) -> Tensor:
    """Forward of :class:`_DimConvFunction`: one kernel launch.

    Shape:
        x (B, C, H_b, W_b) any strides, weights (C | H_b | W_b, 1, k, k) contiguous
        -> (B, 3C, H_b, W_b), channels-last when x is
    """
    _, channels, height, width = x.shape
    y = contract.output_like(x)
    grid, meta = launch_config(x.shape, gpu_launch(x))
    meta |= _output_order(interleave, channels)
    d_c, d_h, d_w = dilation
    _dim_conv_fwd_kernel[grid](
        x, weight_channel, weight_height, weight_width, y, channels, height, width,
        *x.stride(), *y.stride(),
        K=weight_channel.shape[-1], D_C=d_c, D_H=d_h, D_W=d_w, **meta,
    )  # fmt: skip
    return y


@opaque_op("lightnets::dim_conv_triton_backward", contract.BACKWARD_SCHEMA, contract.backward_fake)
def dim_conv_backward(
    grad_y: Tensor,
    x: Tensor,
    weight_channel: Tensor,
    weight_height: Tensor,
    weight_width: Tensor,
    dilation: Sequence[int],
    interleave: bool,
    input_grad: bool,
    weight_grads: bool,
) -> list[Tensor]:
    """Backward of :class:`_DimConvFunction`: the input gradient when ``input_grad``, then the
    three weight gradients when ``weight_grads`` (summed in float32, returned in the weights'
    dtype).

    Shape:
        grad_y (B, 3C, H_b, W_b) and x (B, C, H_b, W_b) any strides, weights contiguous
        -> [(B, C, H_b, W_b) in x's memory format], [(C, 1, k, k), (H_b, 1, k, k), (W_b, 1, k, k)]
    """
    weights = (weight_channel, weight_height, weight_width)
    _, channels, height, width = x.shape
    grid, meta = launch_config(x.shape, gpu_launch(x))
    meta |= _output_order(interleave, channels)
    d_c, d_h, d_w = dilation
    consts = {"K": weight_channel.shape[-1], "D_C": d_c, "D_H": d_h, "D_W": d_w, **meta}
    grads = []
    if input_grad:
        grad_x = torch.empty_like(x)  # x's memory format (dense strides even for a view)
        _dim_conv_bwd_input_kernel[grid](
            grad_y, *weights, grad_x, channels, height, width, *grad_y.stride(), *grad_x.stride(),
            **consts,
        )  # fmt: skip
        grads.append(grad_x)
    if weight_grads:
        partials = [torch.zeros(w.shape, dtype=torch.float32, device=w.device) for w in weights]
        w_grid, batch_block = _weight_grid(grid, x.shape[0], gpu_launch(x))
        _dim_conv_bwd_weight_kernel[w_grid](
            x, grad_y, *partials, x.shape[0], channels, height, width,
            *x.stride(), *grad_y.stride(),
            BATCH_BLOCK=batch_block, **consts,
        )  # fmt: skip
        grads += [p.to(w.dtype) for p, w in zip(partials, weights, strict=True)]
    return grads


def dim_conv_operands(op: str, x: Tensor, weights: Weights) -> tuple[Tensor, Weights]:
    """The operands of a fused DimConv pass (``op`` names it in errors) as the kernels take them:
    x at the build size of the height- and width-wise kernels, cast by autocast's rule, all of one
    dtype in :data:`DTYPES`; ValueError or TypeError otherwise.

    Shape:
        x (B, C, H_b, W_b), weights as :data:`~src.kernels.dim_conv.contract.Weights`
    """
    weight_channel, weight_height, weight_width = weights
    height, width = x.shape[-2:]
    if (weight_height.shape[0], weight_width.shape[0]) != (height, width):
        raise ValueError(
            f"the fused kernel needs the build size: input {height}x{width}, "
            f"kernels built for {weight_height.shape[0]}x{weight_width.shape[0]}"
        )
    operands = autocast_operands(x.device.type, x, weight_channel, weight_height, weight_width)
    x, weight_channel, weight_height, weight_width = operands
    dtype = check_same_dtype(
        op,
        x=x,
        weight_channel=weight_channel,
        weight_height=weight_height,
        weight_width=weight_width,
    )
    if dtype not in DTYPES:
        raise TypeError(f"the fused {op} takes {DTYPES}, got {dtype}")
    return x, (weight_channel, weight_height, weight_width)


def dim_conv_triton(
    x: Tensor,
    weights: Weights,
    *,
    dilation: tuple[int, int, int] = (1, 1, 1),
    interleave: bool = True,
) -> Tensor:
    """Fused DimConv at the build size; the contract of
    :func:`src.kernels.dim_conv.dim_conv_reference`.

    Under ``torch.autocast`` the convolutions run in its dtype, as ``F.conv2d``'s (and so the
    reference's) do: the operands are cast to it first (float32 weights keep float32 gradients).
    Outside autocast the operands must share one dtype: float32, float16 or bfloat16, always
    accumulated in float32.

    Shape:
        x (B, C, H_b, W_b), weights as :data:`~src.kernels.dim_conv.contract.Weights`
        -> (B, 3C, H_b, W_b)
    """
    x, weights = dim_conv_operands("DimConv", x, weights)
    return _DimConvFunction.apply(x, tuple(dilation), interleave, *weights)
