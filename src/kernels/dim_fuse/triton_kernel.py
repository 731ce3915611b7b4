"""DimConv and DimFuse's local fusion in one pass: the 3C dimension-wise responses stay on chip.

In a DiCE unit (:class:`src.ops.dice.DiCE`) DimConv writes 3C channels that DimFuse's first half
reads back three times (BN, PReLU, the grouped 1x1 conv) to make C channels:

    h = DimConv(x)                        (B, 3C, H, W); channel 3c + b is branch b of channel c
    a = PReLU_3C(BN_3C(h))
    l[c] = sum_b w_local[c, b] a[3c + b]  (B, C, H, W)

Here one program computes the three branches of its (channel x row x column) tile in registers
(:func:`src.kernels.dim_conv.triton_kernel.dim_conv_branches`), applies BN and PReLU per branch and
writes only l. The per-channel BN is an affine map ``z = scale * h + shift``; in training its batch
statistics need every pixel first, so the forward is two passes over x
(:func:`local_fusion_statistics`, then :func:`local_fusion_forward` with the batch scale and shift)
and the backward recomputes h instead of keeping it:

1. :func:`local_fusion_backward_sums`: per channel, sum dz, sum dz (h - mean), PReLU's
   sum dz z [z <= 0] and the local conv's sum dl a, with ``dz = dl w_local (z > 0 ? 1 : alpha)``;
2. :func:`local_fusion_grad_h`: BN's input gradient ``dh = p dz + q (h - mean) + r``
   (per-channel p, q, r from the sums), written once as DimConv's output gradient, which
   :func:`src.kernels.dim_conv.triton_kernel.dim_conv_backward` takes back to x and the three
   kernels.

Autograd keeps x instead of h, BN's output and PReLU's output (3C channels each). Per-channel
sums are per-program partials summed by PyTorch, so they do not depend on the run; the DimConv
weight gradient's atomics do. In inference (running statistics) the second BN and PReLU, after the
local conv, are folded into the same pass, so the kernel writes DimFuse's Y_l directly.

Accumulation is float32 for every input dtype, and BN, PReLU and the local weights are applied in
float32 under autocast too (eager autocast runs PReLU and the 1x1 conv in the low precision); the
output is in the input's dtype. Covers the interleaved layout (``shuffle=True``, every
released model) at the build size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.dim_conv.contract import Weights, output_like
from src.kernels.dim_conv.triton_kernel import (
    dim_conv_backward,
    dim_conv_branches,
    dim_conv_operands,
)
from src.kernels.dim_fuse import contract as contract
from src.kernels.dispatch import autocast_off, opaque_op
from src.kernels.fused_norm import (
    batch_norm_backward,
    batch_statistics,
    check_batch,
    refuse_autograd,
    running_affine,
    update_running_statistics,
)
from src.kernels.triton.launch import gpu_launch
from src.kernels.triton.stencil import launch_config, tile

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from src.kernels.dim_fuse import LocalFusionState


@triton.jit
def _branch_params(scale_ptr, shift_ptr, alpha_ptr, wl_ptr, idx, ok):
    """Channel 3c + b's BN scale and shift, PReLU slope and local weight, each (BLOCK_C, 1, 1)."""
    s = tl.load(scale_ptr + idx, mask=ok, other=0.0)
    t = tl.load(shift_ptr + idx, mask=ok, other=0.0)
    alpha = tl.load(alpha_ptr + idx, mask=ok, other=0.0)
    wl = tl.load(wl_ptr + idx, mask=ok, other=0.0)
    return s, t, alpha, wl


@triton.jit
def _local_fwd_kernel(
    x_ptr, wc_ptr, wh_ptr, ww_ptr,
    scale_ptr, shift_ptr, alpha_ptr, wl_ptr,
    post_scale_ptr, post_shift_ptr, post_alpha_ptr,
    l_ptr,
    C, H, W,
    sx_b, sx_c, sx_h, sx_w,
    sl_b, sl_c, sl_h, sl_w,
    POST: tl.constexpr,
    K: tl.constexpr, D_C: tl.constexpr, D_H: tl.constexpr, D_W: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    b, c, h, w = tile(C, H, W, BLOCK_C, BLOCK_H, BLOCK_W)
    branches = dim_conv_branches(
        x_ptr + b * sx_b, wc_ptr, wh_ptr, ww_ptr, c, h, w, C, H, W, sx_c, sx_h, sx_w,
        K, D_C, D_H, D_W, BLOCK_C, BLOCK_H, BLOCK_W,
    )  # fmt: skip
    c_ok = c < C
    local = tl.zeros((BLOCK_C, BLOCK_H, BLOCK_W), dtype=tl.float32)
    for slot in tl.static_range(3):
        s, t, alpha, wl = _branch_params(
            scale_ptr, shift_ptr, alpha_ptr, wl_ptr, 3 * c + slot, c_ok
        )
        z = branches[slot] * s + t
        local += wl * tl.where(z > 0, z, alpha * z)
    if POST:  # inference: DimFuse's second BN (running statistics) and PReLU
        s = tl.load(post_scale_ptr + c, mask=c_ok, other=0.0)
        t = tl.load(post_shift_ptr + c, mask=c_ok, other=0.0)
        alpha = tl.load(post_alpha_ptr + c, mask=c_ok, other=0.0)
        local = local * s + t
        local = tl.where(local > 0, local, alpha * local)
    m = c_ok & (h < H) & (w < W)
    out = l_ptr + b * sl_b + c * sl_c + h * sl_h + w * sl_w
    tl.store(out, local.to(l_ptr.dtype.element_ty), mask=m)


@triton.jit
def _local_stats_kernel(
    x_ptr, wc_ptr, wh_ptr, ww_ptr, part_ptr,
    C, H, W,
    sx_b, sx_c, sx_h, sx_w,
    K: tl.constexpr, D_C: tl.constexpr, D_H: tl.constexpr, D_W: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    # partials (programs over b, h and w, 2, 3C): sum h and sum h^2 of this tile per channel
    b, c, h, w = tile(C, H, W, BLOCK_C, BLOCK_H, BLOCK_W)
    branches = dim_conv_branches(
        x_ptr + b * sx_b, wc_ptr, wh_ptr, ww_ptr, c, h, w, C, H, W, sx_c, sx_h, sx_w,
        K, D_C, D_H, D_W, BLOCK_C, BLOCK_H, BLOCK_W,
    )  # fmt: skip
    m = (c < C) & (h < H) & (w < W)
    c1 = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row = part_ptr + (tl.program_id(0) * tl.num_programs(2) + tl.program_id(2)) * (6 * C)
    for slot in tl.static_range(3):
        v = tl.where(m, branches[slot], 0.0)
        total = tl.sum(tl.sum(v, axis=2), axis=1)
        squares = tl.sum(tl.sum(v * v, axis=2), axis=1)
        tl.store(row + 3 * c1 + slot, total, mask=c1 < C)
        tl.store(row + 3 * C + 3 * c1 + slot, squares, mask=c1 < C)


@triton.jit
def _local_bwd_sums_kernel(
    x_ptr, wc_ptr, wh_ptr, ww_ptr,
    scale_ptr, shift_ptr, alpha_ptr, wl_ptr, mean_ptr,
    gl_ptr, part_ptr,
    C, H, W,
    sx_b, sx_c, sx_h, sx_w,
    sg_b, sg_c, sg_h, sg_w,
    K: tl.constexpr, D_C: tl.constexpr, D_H: tl.constexpr, D_W: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    # partials (programs, 4, 3C): sum dz, sum dz (h - mean), sum dz z [z <= 0] (PReLU),
    # sum dl a (local); centred, so that BN's gradient does not cancel digits
    b, c, h, w = tile(C, H, W, BLOCK_C, BLOCK_H, BLOCK_W)
    branches = dim_conv_branches(
        x_ptr + b * sx_b, wc_ptr, wh_ptr, ww_ptr, c, h, w, C, H, W, sx_c, sx_h, sx_w,
        K, D_C, D_H, D_W, BLOCK_C, BLOCK_H, BLOCK_W,
    )  # fmt: skip
    c_ok = c < C
    m = c_ok & (h < H) & (w < W)
    g = tl.load(gl_ptr + b * sg_b + c * sg_c + h * sg_h + w * sg_w, mask=m, other=0.0)
    g = g.to(tl.float32)
    c1 = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row = part_ptr + (tl.program_id(0) * tl.num_programs(2) + tl.program_id(2)) * (12 * C)
    for slot in tl.static_range(3):
        s, t, alpha, wl = _branch_params(
            scale_ptr, shift_ptr, alpha_ptr, wl_ptr, 3 * c + slot, c_ok
        )
        hv = tl.where(m, branches[slot], 0.0)
        mu = tl.load(mean_ptr + 3 * c + slot, mask=c_ok, other=0.0)
        z = hv * s + t
        positive = z > 0
        da = g * wl
        dz = tl.where(positive, da, alpha * da)
        sums = (
            dz,
            dz * (hv - mu),
            tl.where(positive, 0.0, da * z),
            g * tl.where(positive, z, alpha * z),
        )
        for k in tl.static_range(4):
            part = tl.sum(tl.sum(tl.where(m, sums[k], 0.0), axis=2), axis=1)
            tl.store(row + k * 3 * C + 3 * c1 + slot, part, mask=c1 < C)


@triton.jit
def _local_grad_h_kernel(
    x_ptr, wc_ptr, wh_ptr, ww_ptr,
    scale_ptr, shift_ptr, alpha_ptr, wl_ptr, mean_ptr,
    p_ptr, q_ptr, r_ptr,
    gl_ptr, gh_ptr,
    C, H, W,
    sx_b, sx_c, sx_h, sx_w,
    sg_b, sg_c, sg_h, sg_w,
    sy_b, sy_c, sy_h, sy_w,
    K: tl.constexpr, D_C: tl.constexpr, D_H: tl.constexpr, D_W: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    b, c, h, w = tile(C, H, W, BLOCK_C, BLOCK_H, BLOCK_W)
    branches = dim_conv_branches(
        x_ptr + b * sx_b, wc_ptr, wh_ptr, ww_ptr, c, h, w, C, H, W, sx_c, sx_h, sx_w,
        K, D_C, D_H, D_W, BLOCK_C, BLOCK_H, BLOCK_W,
    )  # fmt: skip
    c_ok = c < C
    m = c_ok & (h < H) & (w < W)
    g = tl.load(gl_ptr + b * sg_b + c * sg_c + h * sg_h + w * sg_w, mask=m, other=0.0)
    g = g.to(tl.float32)
    out = gh_ptr + b * sy_b + (3 * c) * sy_c + h * sy_h + w * sy_w
    for slot in tl.static_range(3):
        idx = 3 * c + slot
        s, t, alpha, wl = _branch_params(scale_ptr, shift_ptr, alpha_ptr, wl_ptr, idx, c_ok)
        z = branches[slot] * s + t
        da = g * wl
        dz = tl.where(z > 0, da, alpha * da)
        p = tl.load(p_ptr + idx, mask=c_ok, other=0.0)
        q = tl.load(q_ptr + idx, mask=c_ok, other=0.0)
        r = tl.load(r_ptr + idx, mask=c_ok, other=0.0)
        mu = tl.load(mean_ptr + idx, mask=c_ok, other=0.0)
        gh = p * dz + q * (branches[slot] - mu) + r
        tl.store(out + slot * sy_c, gh.to(gh_ptr.dtype.element_ty), mask=m)


def _consts(x: Tensor, weight_channel: Tensor, dilation: tuple[int, int, int]) -> tuple:
    grid, meta = launch_config(x.shape, gpu_launch(x))
    d_c, d_h, d_w = dilation
    meta = {**meta, "K": weight_channel.shape[-1], "D_C": d_c, "D_H": d_h, "D_W": d_w}
    return grid, meta


@opaque_op(
    "lightnets::local_fusion_statistics", contract.STATISTICS_SCHEMA, contract.statistics_fake
)
def local_fusion_statistics(
    x: Tensor, wc: Tensor, wh: Tensor, ww: Tensor, dilation: list[int]
) -> Tensor:
    """Per-channel sum and sum of squares of DimConv(x), float64, not materialising it.

    Shape:
        x (B, C, H_b, W_b) any strides, weights contiguous -> (2, 3C)
    """
    grid, meta = _consts(x, wc, tuple(dilation))
    partials = torch.empty(
        (grid[0] * grid[2], 2, 3 * x.shape[1]), dtype=torch.float32, device=x.device
    )
    _local_stats_kernel[grid](x, wc, wh, ww, partials, *x.shape[1:], *x.stride(), **meta)
    # float64 over the partials: the E[h^2] - E[h]^2 variance formed from them needs the digits
    return partials.sum(0, dtype=torch.float64)


@opaque_op("lightnets::local_fusion_forward", contract.FORWARD_SCHEMA, contract.forward_fake)
def local_fusion_forward(
    x: Tensor, wc: Tensor, wh: Tensor, ww: Tensor, scale: Tensor, shift: Tensor, alpha: Tensor,
    w_local: Tensor, post: list[Tensor], dilation: list[int],
) -> Tensor:  # fmt: skip
    """l = local(PReLU(scale * DimConv(x) + shift)); with ``post = [scale2, shift2, alpha2]`` also
    the second BN and PReLU. One launch.

    Shape:
        x (B, C, H_b, W_b) any strides; scale, shift, alpha, w_local (3C,) float32;
        post [] or three (C,) float32 -> (B, C, H_b, W_b) in x's dtype and memory format
    """
    grid, meta = _consts(x, wc, tuple(dilation))
    local = contract.local_like(x)
    post_args = post if post else (scale, shift, alpha)  # unread when POST is off
    _local_fwd_kernel[grid](
        x, wc, wh, ww, scale, shift, alpha, w_local, *post_args, local, *x.shape[1:],
        *x.stride(), *local.stride(), POST=bool(post), **meta,
    )  # fmt: skip
    return local


@opaque_op(
    "lightnets::local_fusion_backward_sums",
    contract.BACKWARD_SUMS_SCHEMA,
    contract.backward_sums_fake,
)
def local_fusion_backward_sums(
    grad_local: Tensor, x: Tensor, wc: Tensor, wh: Tensor, ww: Tensor, scale: Tensor,
    shift: Tensor, alpha: Tensor, w_local: Tensor, mean: Tensor, dilation: list[int],
) -> Tensor:  # fmt: skip
    """Per channel: sum dz, sum dz (h - mean), sum dz z [z <= 0] and sum dl a (see the module
    docstring).

    Shape:
        grad_local and x (B, C, H_b, W_b) any strides -> (4, 3C) float32
    """
    grid, meta = _consts(x, wc, tuple(dilation))
    partials = torch.empty(
        (grid[0] * grid[2], 4, 3 * x.shape[1]), dtype=torch.float32, device=x.device
    )
    _local_bwd_sums_kernel[grid](
        x, wc, wh, ww, scale, shift, alpha, w_local, mean, grad_local, partials, *x.shape[1:],
        *x.stride(), *grad_local.stride(), **meta,
    )  # fmt: skip
    return partials.sum(0)


@opaque_op("lightnets::local_fusion_grad_h", contract.GRAD_H_SCHEMA, contract.grad_h_fake)
def local_fusion_grad_h(
    grad_local: Tensor, x: Tensor, wc: Tensor, wh: Tensor, ww: Tensor, scale: Tensor,
    shift: Tensor, alpha: Tensor, w_local: Tensor, mean: Tensor, p: Tensor, q: Tensor, r: Tensor,
    dilation: list[int],
) -> Tensor:  # fmt: skip
    """DimConv's output gradient ``p dz + q (h - mean) + r`` per channel, h recomputed.

    Shape:
        grad_local and x (B, C, H_b, W_b) any strides -> (B, 3C, H_b, W_b) in x's memory format
    """
    grid, meta = _consts(x, wc, tuple(dilation))
    grad_h = output_like(x)
    _local_grad_h_kernel[grid](
        x, wc, wh, ww, scale, shift, alpha, w_local, mean, p, q, r, grad_local, grad_h,
        *x.shape[1:], *x.stride(), *grad_local.stride(), *grad_h.stride(), **meta,
    )  # fmt: skip
    return grad_h


class _LocalFusionFunction(torch.autograd.Function):
    """Training forward and backward with BN's batch statistics. Returns l and, not differentiable,
    the batch mean and biased variance (for the running statistics)."""

    @staticmethod
    def forward(
        ctx, x: Tensor, wc: Tensor, wh: Tensor, ww: Tensor, gamma: Tensor, beta: Tensor,
        alpha: Tensor, w_local: Tensor, dilation: tuple[int, int, int], eps: float,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        weights = [w.contiguous() for w in (wc, wh, ww)]
        count = x.shape[0] * x.shape[2] * x.shape[3]
        with autocast_off(x.device.type):
            sums = local_fusion_statistics(x, *weights, list(dilation))
            mean, var, rstd, scale, shift = batch_statistics(sums, count, gamma, beta, eps)
            local = local_fusion_forward(
                x, *weights, scale, shift, alpha, w_local, [], list(dilation)
            )
        ctx.save_for_backward(x, *weights, alpha, w_local, mean, rstd, scale, shift)
        ctx.dilation = dilation
        ctx.count = count
        ctx.mark_non_differentiable(mean, var)
        return local, mean, var

    @staticmethod
    def backward(ctx, grad_local: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
        x, wc, wh, ww, alpha, w_local, mean, rstd, scale, shift = ctx.saved_tensors
        dilation = list(ctx.dilation)
        with autocast_off(x.device.type):
            sum_dz, sum_dz_centred, grad_alpha, grad_w_local = local_fusion_backward_sums(
                grad_local, x, wc, wh, ww, scale, shift, alpha, w_local, mean, dilation
            )
            grad_gamma, grad_beta, q, r = batch_norm_backward(
                sum_dz, sum_dz_centred, rstd, scale, ctx.count
            )
            grad_h = local_fusion_grad_h(
                grad_local, x, wc, wh, ww, scale, shift, alpha, w_local, mean, scale, q, r,
                dilation,
            )  # fmt: skip
            want_x = ctx.needs_input_grad[0]
            want_w = any(ctx.needs_input_grad[1:4])
            grads = iter(
                dim_conv_backward(grad_h, x, wc, wh, ww, dilation, True, want_x, want_w)
                if want_x or want_w
                else []
            )
        grad_x = next(grads) if want_x else None
        grad_wc, grad_wh, grad_ww = (next(grads) for _ in range(3)) if want_w else (None,) * 3
        return (
            grad_x, grad_wc, grad_wh, grad_ww, grad_gamma, grad_beta, grad_alpha, grad_w_local,
            None, None,
        )  # fmt: skip


def local_fusion_triton(
    x: Tensor,
    weights: Weights,
    *,
    dilation: tuple[int, int, int],
    **state: Unpack[LocalFusionState],
) -> Tensor:
    """The fused pass; the contract of :func:`src.kernels.dim_fuse.local_fusion_reference`.

    ``state["training"]`` normalises with the batch statistics and, when running statistics are
    given, updates them in place as ``F.batch_norm`` does (unbiased variance). Otherwise the
    running statistics are used, ``state["post"]`` may be folded in, and there is no backward: an
    inference pass.

    Shape:
        x (B, C, H_b, W_b); weights, DimConv's (:data:`~src.kernels.dim_conv.contract.Weights`);
        state as :class:`src.kernels.dim_fuse.LocalFusionState` -> (B, C, H_b, W_b)
    """
    training, post, eps = state["training"], state["post"], state["eps"]
    running_mean, running_var = state["running_mean"], state["running_var"]
    if post is not None and training:
        raise ValueError("post (the second BN folded) is for inference; it needs training=False")
    x, weights = dim_conv_operands("DimConv + local fusion", x, weights)
    # BN, PReLU and the local weights in float32, as the eager ops keep them under autocast
    gamma, beta, alpha = (state[name].float().contiguous() for name in ("weight", "bias", "alpha"))
    w_local = state["w_local"].float().reshape(-1)
    dilation = tuple(int(d) for d in dilation)
    count = x.shape[0] * x.shape[2] * x.shape[3]
    if training:
        check_batch(count, x.shape)
        local, mean, var = _LocalFusionFunction.apply(
            x, *weights, gamma, beta, alpha, w_local, dilation, eps
        )
        update_running_statistics(running_mean, running_var, mean, var, count, state["momentum"])
        return local
    refuse_autograd(
        "DimConv + local fusion", x, *weights, gamma, beta, alpha, w_local, *(post or ())
    )
    scale, shift = running_affine(running_mean, running_var, gamma, beta, eps)
    post_args = [t.float().contiguous() for t in post] if post is not None else []
    weights = [w.contiguous() for w in weights]
    with autocast_off(x.device.type):
        return local_fusion_forward(
            x, *weights, scale, shift, alpha, w_local, post_args, list(dilation)
        )
