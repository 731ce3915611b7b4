"""EESP's pyramid in one pass: K dilated depth-wise convolutions, hierarchical fusion, BN and PReLU.

ESPNetv2's EESP unit (:class:`src.ops.eesp.EESP`) transforms its reduced input r (n channels) by K
depth-wise dilated 3x3 convolutions (dilation d_k, stride 1 or 2), adds each branch to the fused
output of the one before (hierarchical feature fusion, HFF), concatenates, and applies BN and PReLU
over the K n channels:

    y_k = conv_k(r),  f_k = f_{k-1} + y_k (f_k = y_k without HFF),  out[k n + c] = PReLU(BN(f_k))

Eager code writes every y_k, every partial sum, the concatenation and BN's output. Here one program
computes the K branches of its (channel x row x column) output tile in registers, keeps the running
sum there and writes only the K n output channels. BN is a per-channel affine map
``z = scale * f + shift``; in training its batch statistics need every pixel first, so the forward
is two passes over r (:func:`pyramid_statistics`, then :func:`pyramid_forward`), and the backward
recomputes the branches instead of keeping them:

1. :func:`pyramid_backward_sums`: per channel, sum dz, sum dz (f - mean) and PReLU's
   sum dout z [z <= 0], with ``dz = dout (z > 0 ? 1 : alpha)``;
2. :func:`pyramid_grad_branches`: BN's input gradient ``df = p dz + q (f - mean) + r`` and, through
   HFF, each branch's output gradient ``dy_k = sum_{j >= k} df_j`` (total minus running prefix),
   written once; PyTorch's convolution backward (cuDNN's depth-wise kernels on a GPU) takes them
   to r and the K kernels.

Autograd keeps r instead of BN's input and output (K n channels each). Per-channel sums are
per-program partials summed by PyTorch, so they do not depend on the run. In inference (running
statistics) it is one pass. Accumulation is float32 for every input dtype, and BN and PReLU are
applied in float32 under autocast too (eager autocast runs PReLU in the low precision); the output
is in the input's dtype. The entry, with the operands' checks and the running statistics' update,
is :func:`src.kernels.eesp.eesp_pyramid` (``impl="triton"``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.dispatch import autocast_off, opaque_op
from src.kernels.eesp import contract as contract
from src.kernels.fused_norm import batch_norm_backward, batch_statistics
from src.kernels.triton.launch import gpu_launch
from src.kernels.triton.stencil import launch_config, tile


@triton.jit
def _output_tile(
    r_ptr, sr_b, C, HO, WO,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """This program's image b and (channel, row, column) output tile (:func:`tile`), the image's
    start in r, and the mask of the tile's pixels inside the (K n, H', W') output."""
    b, c, i, j = tile(C, HO, WO, BLOCK_C, BLOCK_H, BLOCK_W)
    return b, c, i, j, r_ptr + b * sr_b, (c < C) & (i < HO) & (j < WO)


@triton.jit
def _fused_branch(
    f, r_img, w_ptr, dil_ptr, k, c, i, j, C, H, W, sr_c, sr_h, sr_w,
    HFF: tl.constexpr, STRIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """f_k at output pixels (i, j) of channels c, in float32: branch k's depth-wise 3x3 response
    y_k added to f = f_{k-1} (HFF), or y_k alone without HFF."""
    d = tl.load(dil_ptr + k)
    c_ok = c < C
    y = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    for u in tl.static_range(3):
        for v in tl.static_range(3):
            hs = i * STRIDE + (u - 1) * d
            ws = j * STRIDE + (v - 1) * d
            m = c_ok & (hs >= 0) & (hs < H) & (ws >= 0) & (ws < W)
            xv = tl.load(r_img + c * sr_c + hs * sr_h + ws * sr_w, mask=m, other=0.0)
            wv = tl.load(w_ptr + (k * C + c) * 9 + (u * 3 + v), mask=c_ok, other=0.0)
            y += xv.to(tl.float32) * wv.to(tl.float32)
    return f + y if HFF else y


@triton.jit
def _normalised_branch(
    f, r_img, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, k, c, i, j, C, H, W,
    sr_c, sr_h, sr_w,
    HFF: tl.constexpr, STRIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """f_k (:func:`_fused_branch`), BN's output ``z_k = scale f_k + shift`` and the PReLU slopes
    of its channels k n + c, (BLOCK_C, 1, 1)."""
    f = _fused_branch(f, r_img, w_ptr, dil_ptr, k, c, i, j, C, H, W, sr_c, sr_h, sr_w, HFF,
                      STRIDE, BLOCK_C, BLOCK_H, BLOCK_W)  # fmt: skip
    idx = k * C + c
    c_ok = c < C
    s = tl.load(scale_ptr + idx, mask=c_ok, other=0.0)
    t = tl.load(shift_ptr + idx, mask=c_ok, other=0.0)
    alpha = tl.load(alpha_ptr + idx, mask=c_ok, other=0.0)
    return f, f * s + t, alpha


@triton.jit
def _branch_output_grad(
    f, r_img, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, grad,
    k, c, i, j, m, C, H, W, sr_c, sr_h, sr_w, sg_c,
    HFF: tl.constexpr, STRIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """f_k, z_k (:func:`_normalised_branch`), the output gradient dout at this tile, PReLU's input
    gradient ``dz = dout (z > 0 ? 1 : alpha)`` and the centred ``f_k - mean``."""
    f, z, alpha = _normalised_branch(
        f, r_img, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, k, c, i, j, C, H, W,
        sr_c, sr_h, sr_w, HFF, STRIDE, BLOCK_C, BLOCK_H, BLOCK_W,
    )  # fmt: skip
    mu = tl.load(mean_ptr + k * C + c, mask=c < C, other=0.0)
    g = tl.load(grad + (k * C) * sg_c, mask=m, other=0.0).to(tl.float32)
    return f, z, g, tl.where(z > 0, g, alpha * g), f - mu


@triton.jit
def _pyramid_fwd_kernel(
    r_ptr, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, y_ptr,
    C, H, W, HO, WO,
    sr_b, sr_c, sr_h, sr_w,
    sy_b, sy_c, sy_h, sy_w,
    K: tl.constexpr, HFF: tl.constexpr, STRIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    b, c, i, j, r_img, m = _output_tile(r_ptr, sr_b, C, HO, WO, BLOCK_C, BLOCK_H, BLOCK_W)
    out = y_ptr + b * sy_b + c * sy_c + i * sy_h + j * sy_w
    f = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    for k in tl.static_range(K):
        f, z, alpha = _normalised_branch(
            f, r_img, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, k, c, i, j, C, H, W,
            sr_c, sr_h, sr_w, HFF, STRIDE, BLOCK_C, BLOCK_H, BLOCK_W,
        )  # fmt: skip
        z = tl.where(z > 0, z, alpha * z)
        tl.store(out + (k * C) * sy_c, z.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _pyramid_stats_kernel(
    r_ptr, w_ptr, dil_ptr, part_ptr,
    C, H, W, HO, WO,
    sr_b, sr_c, sr_h, sr_w,
    K: tl.constexpr, HFF: tl.constexpr, STRIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    # partials (programs over b, rows and columns, 2, K C): sum f and sum f^2 of this tile
    b, c, i, j, r_img, m = _output_tile(r_ptr, sr_b, C, HO, WO, BLOCK_C, BLOCK_H, BLOCK_W)
    c1 = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row = part_ptr + (tl.program_id(0) * tl.num_programs(2) + tl.program_id(2)) * (2 * K * C)
    f = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    for k in tl.static_range(K):
        f = _fused_branch(f, r_img, w_ptr, dil_ptr, k, c, i, j, C, H, W, sr_c, sr_h, sr_w, HFF,
                          STRIDE, BLOCK_C, BLOCK_H, BLOCK_W)  # fmt: skip
        v = tl.where(m, f, 0.0)
        tl.store(row + k * C + c1, tl.sum(tl.sum(v, axis=2), axis=1), mask=c1 < C)
        tl.store(row + (K + k) * C + c1, tl.sum(tl.sum(v * v, axis=2), axis=1), mask=c1 < C)


@triton.jit
def _pyramid_bwd_sums_kernel(
    r_ptr, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, g_ptr, part_ptr,
    C, H, W, HO, WO,
    sr_b, sr_c, sr_h, sr_w,
    sg_b, sg_c, sg_h, sg_w,
    K: tl.constexpr, HFF: tl.constexpr, STRIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    # partials (programs, 3, K C): sum dz, sum dz (f - mean), sum dout z [z <= 0] (PReLU)
    b, c, i, j, r_img, m = _output_tile(r_ptr, sr_b, C, HO, WO, BLOCK_C, BLOCK_H, BLOCK_W)
    grad = g_ptr + b * sg_b + c * sg_c + i * sg_h + j * sg_w
    c1 = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row = part_ptr + (tl.program_id(0) * tl.num_programs(2) + tl.program_id(2)) * (3 * K * C)
    f = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    for k in tl.static_range(K):
        f, z, g, dz, centred = _branch_output_grad(
            f, r_img, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, grad,
            k, c, i, j, m, C, H, W, sr_c, sr_h, sr_w, sg_c, HFF, STRIDE, BLOCK_C, BLOCK_H, BLOCK_W,
        )  # fmt: skip
        sums = (dz, dz * centred, tl.where(z > 0, 0.0, g * z))
        for q in tl.static_range(3):
            part = tl.sum(tl.sum(tl.where(m, sums[q], 0.0), axis=2), axis=1)
            tl.store(row + (q * K + k) * C + c1, part, mask=c1 < C)


@triton.jit
def _branch_grads(
    f, r_img, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, p_ptr, q_ptr, rr_ptr,
    grad, k, c, i, j, m, C, H, W, sr_c, sr_h, sr_w, sg_c,
    HFF: tl.constexpr, STRIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """Branch k's running sum f_k and BN's input gradient df_k at this tile."""
    f, _, _, dz, centred = _branch_output_grad(
        f, r_img, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, grad,
        k, c, i, j, m, C, H, W, sr_c, sr_h, sr_w, sg_c, HFF, STRIDE, BLOCK_C, BLOCK_H, BLOCK_W,
    )  # fmt: skip
    idx = k * C + c
    c_ok = c < C
    p = tl.load(p_ptr + idx, mask=c_ok, other=0.0)
    q = tl.load(q_ptr + idx, mask=c_ok, other=0.0)
    r = tl.load(rr_ptr + idx, mask=c_ok, other=0.0)
    return f, p * dz + q * centred + r


@triton.jit
def _pyramid_grad_branches_kernel(
    r_ptr, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, p_ptr, q_ptr, rr_ptr,
    g_ptr, dy_ptr,
    C, H, W, HO, WO,
    sr_b, sr_c, sr_h, sr_w,
    sg_b, sg_c, sg_h, sg_w,
    sy_b, sy_c, sy_h, sy_w,
    K: tl.constexpr, HFF: tl.constexpr, STRIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    b, c, i, j, r_img, m = _output_tile(r_ptr, sr_b, C, HO, WO, BLOCK_C, BLOCK_H, BLOCK_W)
    grad = g_ptr + b * sg_b + c * sg_c + i * sg_h + j * sg_w
    out = dy_ptr + b * sy_b + c * sy_c + i * sy_h + j * sy_w
    total = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    if HFF:  # dy_k = sum_{j >= k} df_j: the total first, then minus the running prefix
        f = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
        for k in tl.static_range(K):
            f, df = _branch_grads(
                f, r_img, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, p_ptr, q_ptr,
                rr_ptr, grad, k, c, i, j, m, C, H, W, sr_c, sr_h, sr_w, sg_c, HFF, STRIDE,
                BLOCK_C, BLOCK_H, BLOCK_W,
            )  # fmt: skip
            total += df
    f = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    prefix = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    for k in tl.static_range(K):
        f, df = _branch_grads(
            f, r_img, w_ptr, dil_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, p_ptr, q_ptr,
            rr_ptr, grad, k, c, i, j, m, C, H, W, sr_c, sr_h, sr_w, sg_c, HFF, STRIDE,
            BLOCK_C, BLOCK_H, BLOCK_W,
        )  # fmt: skip
        dy = total - prefix if HFF else df
        prefix += df
        tl.store(out + (k * C) * sy_c, dy.to(dy_ptr.dtype.element_ty), mask=m)


# (dilations, device) -> int32 tensor: built once, so that a forward copies nothing from the host
# (a host copy is not allowed while a CUDA graph is captured)
_dilation_tensors: dict[tuple, Tensor] = {}


def _dilation_tensor(dilations: tuple[int, ...], device: torch.device) -> Tensor:
    """The branch dilations as an int32 tensor on ``device``, cached."""
    key = (dilations, str(device))
    if key not in _dilation_tensors:
        _dilation_tensors[key] = torch.tensor(dilations, dtype=torch.int32, device=device)
    return _dilation_tensors[key]


def _launch(r: Tensor, branches: int, stride: int, hff: bool) -> tuple[tuple, dict]:
    batch, _, height, width = contract.output_shape(r, branches, stride)
    grid, meta = launch_config((batch, r.shape[1], height, width), gpu_launch(r))
    return grid, {**meta, "K": branches, "HFF": hff, "STRIDE": stride}


@opaque_op(
    "lightnets::eesp_pyramid_statistics", contract.STATISTICS_SCHEMA, contract.statistics_fake
)
def pyramid_statistics(
    r: Tensor, weight: Tensor, dilations: Tensor, stride: int, hff: bool
) -> Tensor:
    """Per-channel sum and sum of squares of the fused branches f, float64, not materialising them.

    Shape:
        r (B, n, H, W) any strides, weight (K, n, 9), dilations (K,) int32 -> (2, K n)
    """
    branches = weight.shape[0]
    grid, meta = _launch(r, branches, stride, hff)
    _, _, out_h, out_w = contract.output_shape(r, branches, stride)
    partials = torch.empty(
        (grid[0] * grid[2], 2, branches * r.shape[1]), dtype=torch.float32, device=r.device
    )
    _pyramid_stats_kernel[grid](
        r, weight, dilations, partials, *r.shape[1:], out_h, out_w, *r.stride(), **meta
    )
    # float64 over the partials: the E[f^2] - E[f]^2 variance formed from them needs the digits
    return partials.sum(0, dtype=torch.float64)


@opaque_op("lightnets::eesp_pyramid_forward", contract.FORWARD_SCHEMA, contract.forward_fake)
def pyramid_forward(
    r: Tensor, weight: Tensor, dilations: Tensor, scale: Tensor, shift: Tensor, alpha: Tensor,
    stride: int, hff: bool,
) -> Tensor:  # fmt: skip
    """``PReLU(scale * f + shift)`` per channel of the concatenated fused branches. One launch.

    Shape:
        r (B, n, H, W) any strides, scale, shift, alpha (K n,) float32
        -> (B, K n, H', W') in r's dtype and memory format
    """
    branches = weight.shape[0]
    grid, meta = _launch(r, branches, stride, hff)
    y = contract.pyramid_like(r, branches, stride)
    _pyramid_fwd_kernel[grid](
        r, weight, dilations, scale, shift, alpha, y, *r.shape[1:], *y.shape[2:],
        *r.stride(), *y.stride(), **meta,
    )  # fmt: skip
    return y


@opaque_op(
    "lightnets::eesp_pyramid_backward_sums",
    contract.BACKWARD_SUMS_SCHEMA,
    contract.backward_sums_fake,
)
def pyramid_backward_sums(
    grad: Tensor, r: Tensor, weight: Tensor, dilations: Tensor, scale: Tensor, shift: Tensor,
    alpha: Tensor, mean: Tensor, stride: int, hff: bool,
) -> Tensor:  # fmt: skip
    """Per channel: sum dz, sum dz (f - mean), sum dout z [z <= 0] (see the module docstring).

    Shape:
        grad (B, K n, H', W') and r (B, n, H, W) any strides -> (3, K n) float32
    """
    branches = weight.shape[0]
    grid, meta = _launch(r, branches, stride, hff)
    partials = torch.empty(
        (grid[0] * grid[2], 3, branches * r.shape[1]), dtype=torch.float32, device=r.device
    )
    _pyramid_bwd_sums_kernel[grid](
        r, weight, dilations, scale, shift, alpha, mean, grad, partials, *r.shape[1:],
        *grad.shape[2:], *r.stride(), *grad.stride(), **meta,
    )  # fmt: skip
    return partials.sum(0)


@opaque_op(
    "lightnets::eesp_pyramid_grad_branches",
    contract.GRAD_BRANCHES_SCHEMA,
    contract.grad_branches_fake,
)
def pyramid_grad_branches(
    grad: Tensor, r: Tensor, weight: Tensor, dilations: Tensor, scale: Tensor, shift: Tensor,
    alpha: Tensor, mean: Tensor, p: Tensor, q: Tensor, rr: Tensor, stride: int, hff: bool,
) -> Tensor:  # fmt: skip
    """Each branch's output gradient dy_k (BN's backward, then HFF's), branches recomputed.

    Shape:
        grad (B, K n, H', W') and r (B, n, H, W) any strides -> (B, K n, H', W') in r's memory
        format
    """
    branches = weight.shape[0]
    grid, meta = _launch(r, branches, stride, hff)
    grad_y = contract.pyramid_like(r, branches, stride)
    _pyramid_grad_branches_kernel[grid](
        r, weight, dilations, scale, shift, alpha, mean, p, q, rr, grad, grad_y, *r.shape[1:],
        *grad.shape[2:], *r.stride(), *grad.stride(), *grad_y.stride(), **meta,
    )  # fmt: skip
    return grad_y


class _PyramidFunction(torch.autograd.Function):
    """Training forward and backward with BN's batch statistics. Returns the output and, not
    differentiable, the batch mean and biased variance (for the running statistics)."""

    @staticmethod
    def forward(
        ctx, r: Tensor, weight: Tensor, gamma: Tensor, beta: Tensor, alpha: Tensor,
        dilations: tuple[int, ...], stride: int, hff: bool, eps: float,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        branches = weight.shape[0]
        _, _, out_h, out_w = contract.output_shape(r, branches, stride)
        count = r.shape[0] * out_h * out_w
        dil = _dilation_tensor(dilations, r.device)
        with autocast_off(r.device.type):
            sums = pyramid_statistics(r, weight, dil, stride, hff)
            mean, var, rstd, scale, shift = batch_statistics(sums, count, gamma, beta, eps)
            y = pyramid_forward(r, weight, dil, scale, shift, alpha, stride, hff)
        ctx.save_for_backward(r, weight, dil, alpha, mean, rstd, scale, shift)
        ctx.stride, ctx.hff, ctx.count, ctx.dilations = stride, hff, count, dilations
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, grad: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
        r, weight, dil, alpha, mean, rstd, scale, shift = ctx.saved_tensors
        with autocast_off(r.device.type):
            sum_dz, sum_dz_centred, grad_alpha = pyramid_backward_sums(
                grad, r, weight, dil, scale, shift, alpha, mean, ctx.stride, ctx.hff
            )
            grad_gamma, grad_beta, q, rr = batch_norm_backward(
                sum_dz, sum_dz_centred, rstd, scale, ctx.count
            )
            grad_y = pyramid_grad_branches(
                grad, r, weight, dil, scale, shift, alpha, mean, scale, q, rr, ctx.stride,
                ctx.hff,
            )  # fmt: skip
            grad_r, grad_weight = _conv_backward(
                grad_y, r, weight, ctx.dilations, ctx.stride, ctx.needs_input_grad[:2]
            )
        return grad_r, grad_weight, grad_gamma, grad_beta, grad_alpha, None, None, None, None


def _conv_backward(
    grad_y: Tensor,
    r: Tensor,
    weight: Tensor,
    dilations: Sequence[int],
    stride: int,
    needs: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None]:
    """The K depth-wise convolutions' input and weight gradients, by PyTorch (cuDNN on a GPU).

    Shape:
        grad_y (B, K n, H', W'), r (B, n, H, W), weight (K, n, 9) -> (B, n, H, W), (K, n, 9)
    """
    channels = r.shape[1]
    grad_r = torch.zeros_like(r) if needs[0] else None
    grad_weight = torch.empty_like(weight) if needs[1] else None
    for k, d in enumerate(dilations):
        g_r, g_w, _ = torch.ops.aten.convolution_backward(
            grad_y[:, k * channels : (k + 1) * channels], r,
            weight[k].view(channels, 1, 3, 3), None, [stride, stride], [d, d], [d, d], False,
            [0, 0], channels, [needs[0], needs[1], False],
        )  # fmt: skip
        if grad_r is not None:
            grad_r += g_r
        if grad_weight is not None:
            grad_weight[k] = g_w.view(channels, 9)
    return grad_r, grad_weight


def pyramid_training(
    r: Tensor, weight: Tensor, gamma: Tensor, beta: Tensor, alpha: Tensor,
    dilations: tuple[int, ...], stride: int, hff: bool, eps: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The training pass (BN's batch statistics), differentiable in r, the kernels, gamma, beta
    and alpha; with the batch mean and biased variance for the running statistics.

    Shape:
        r (B, n, H, W) any strides, weight (K, n, 9) contiguous, gamma, beta, alpha (K n,)
        float32 -> (B, K n, H', W') in r's dtype and memory format, two (K n,)
    """
    return _PyramidFunction.apply(r, weight, gamma, beta, alpha, dilations, stride, hff, eps)


def pyramid_inference(
    r: Tensor, weight: Tensor, scale: Tensor, shift: Tensor, alpha: Tensor,
    dilations: tuple[int, ...], stride: int, hff: bool,
) -> Tensor:  # fmt: skip
    """The inference pass, BN as the per-channel ``scale`` and ``shift``; no backward.

    Shape:
        r (B, n, H, W) any strides, weight (K, n, 9) contiguous, scale, shift, alpha (K n,)
        float32 -> (B, K n, H', W') in r's dtype and memory format
    """
    dil = _dilation_tensor(dilations, r.device)
    with autocast_off(r.device.type):
        return pyramid_forward(r, weight, dil, scale, shift, alpha, stride, hff)
