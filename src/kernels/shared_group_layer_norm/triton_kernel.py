"""Fused DeLighT per-group LayerNorm, swish and dropout: one launch each way.

Inside DExTra every GLT is followed by :class:`src.ops.shared_group_layer_norm.SharedGroupLayerNorm`
and a swish. In PyTorch that is, under CUDA autocast, a cast of the 16-bit GLT output to float32,
``layer_norm``, ``silu`` and, at the next GLT, a cast back to 16 bits: four launches forward and as
many backward, for tensors a few hundred features wide, where the step is launch-bound (docs/gpu.md:
6,444 launches in a DeLighT MT training step). Here one program normalises a block of rows of one
group and applies the shared affine and the swish:

    c = x_g - mean(x_g),  r = 1 / sqrt(mean(c^2) + eps),  z = c r w + b,  y = z sigmoid(z)

then drops y out with probability p (DExTra's ``dextra_dropout``; PyTorch's dropout would be one
launch more each way), keeping the per-(row, group) mean and r for the backward, which recomputes
z and draws the mask again: element i is kept when Philox's ``tl.rand(seed, i)`` is at or above
p, the seed a tensor drawn on x's device, per call or once for the dropout sites of a forward,
and saved for the backward with the site's index (:mod:`src.kernels.dropout.triton_kernel`:
``torch.manual_seed`` fixes it, a traced or replayed graph draws it anew; the masks differ from
``F.dropout``'s, their distribution does not). With dy first
taken
through the mask and the 1 / (1 - p) scale, ``dz = dy sigmoid(z) (1 + z (1 - sigmoid(z)))`` (dy
itself without the swish), ``x_hat = c r`` and ``g = dz w``, the input gradient of one group row
is

    dx = r (g - mean(g) - x_hat mean(g x_hat))

and the shared weight and bias gradients (sums of ``dz x_hat`` and ``dz`` over rows and groups) come
from column programs of the same launch, each summing a slice of the group features over every
row and group in a fixed order: no reduction launch after the kernel, and no atomics, so they do
not depend on the run.

Statistics and arithmetic are float32; the output is in x's dtype (a 16-bit GLT output gives a
16-bit activation, which the next GLT reads without a cast). The forward is the custom op
``lightnets::shared_group_layer_norm`` with the backward kernel as its autograd rule: one node each
way in a graph ``torch.compile`` traces.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from src.kernels.custom_ops import autograd_op
from src.kernels.dispatch import autocast_off, opaque_op
from src.kernels.dropout.contract import DropoutSeeds, site_seed
from src.kernels.dropout.triton_kernel import kept
from src.kernels.shared_group_layer_norm import contract as contract
from src.kernels.triton.launch import gpu_launch
from src.kernels.triton.norm_columns import column_launch
from src.kernels.triton.norm_rows import DTYPES, layer_norm_tile, row_launch

ELEMENTS_GPU = 2048  # elements of one program's (rows x group width) tile
# 8 warps, 8 elements per thread: built for an A100 or H100 at DeLighT's widths
# (tests/kernels/test_kernel_builds.py), tiles of 4,096 elements needed 80-140 registers per thread
# (occupancy 0.12-0.38), tiles of 2,048 need 32-80 (0.38-1.00). Speed: to be measured.
WARPS_GPU = 8
# group features of one backward program that sums the shared weight and bias gradients over
# every row and group: d / (g 16) such programs beside the row programs, instead of a reduction
# launch after them. Speed: to be measured (benchmarks/gpu_tune.py)
COLUMN_BLOCK_GPU = 16


@triton.jit
def _norm_swish_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    R, D, G, n, eps, seed_ptr, site, p,
    SWISH: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    group = tl.program_id(1)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < R
    col_ok = cols < n
    m = row_ok[:, None] & col_ok[None, :]
    offsets = rows.to(tl.int64)[:, None] * D + (group * n + cols)[None, :]
    x = tl.load(x_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    # one affine of the group width, shared by every group: its features are ``cols``
    z, mean, rstd = layer_norm_tile(x, m, w_ptr, b_ptr, cols, col_ok, n, eps)
    if SWISH:
        z = z * tl.sigmoid(z)
    if DROPOUT:
        z = tl.where(kept(seed_ptr, site, offsets, p), z / (1.0 - p), 0.0)
    tl.store(y_ptr + offsets, z.to(y_ptr.dtype.element_ty), mask=m)
    tl.store(mean_ptr + rows * G + group, mean, mask=row_ok)
    tl.store(rstd_ptr + rows * G + group, rstd, mask=row_ok)


@triton.jit
def _norm_swish_grad_tile(
    x_ptr, dy_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, rows, group, cols, R, D, G, n,
    seed_ptr, site, p, SWISH: tl.constexpr, DROPOUT: tl.constexpr,
):  # fmt: skip
    """A tile of ``rows`` of ``group``, its features ``cols``: (offsets, in-bounds mask, x_hat,
    dz, w, rstd), dz the gradient of the affine's output z (zero outside the tensor)."""
    row_ok = rows < R
    col_ok = cols < n
    m = row_ok[:, None] & col_ok[None, :]
    offsets = rows.to(tl.int64)[:, None] * D + (group * n + cols)[None, :]
    x = tl.load(x_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + rows * G + group, mask=row_ok, other=0.0)
    rstd = tl.load(rstd_ptr + rows * G + group, mask=row_ok, other=0.0)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    x_hat = tl.where(m, (x - mean[:, None]) * rstd[:, None], 0.0)
    if DROPOUT:  # the forward's mask, drawn again
        dy = tl.where(kept(seed_ptr, site, offsets, p), dy / (1.0 - p), 0.0)
    dz = dy
    if SWISH:
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        z = x_hat * w[None, :] + b[None, :]
        s = tl.sigmoid(z)
        dz = dy * s * (1.0 + z * (1.0 - s))
    return offsets, m, x_hat, tl.where(m, dz, 0.0), w, rstd


@triton.jit
def _norm_swish_affine_grads(
    x_ptr, dy_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, R, D, G, n, seed_ptr, site,
    p, program, SWISH: tl.constexpr, DROPOUT: tl.constexpr, COLUMN_ROWS: tl.constexpr,
    COLUMN_BLOCK: tl.constexpr,
):  # fmt: skip
    # the shared weight and bias gradients of COLUMN_BLOCK group features: sums of dz x_hat and
    # dz over every row and group, in one fixed order (no atomics: the same bits on every run)
    cols = program * COLUMN_BLOCK + tl.arange(0, COLUMN_BLOCK)
    acc_w = tl.zeros((COLUMN_ROWS, COLUMN_BLOCK), dtype=tl.float32)
    acc_b = tl.zeros((COLUMN_ROWS, COLUMN_BLOCK), dtype=tl.float32)
    for group in range(0, G):
        for r0 in range(0, R, COLUMN_ROWS):
            rows = r0 + tl.arange(0, COLUMN_ROWS)
            _, _, x_hat, dz, _, _ = _norm_swish_grad_tile(
                x_ptr, dy_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, rows, group, cols, R, D, G, n,
                seed_ptr, site, p, SWISH, DROPOUT,
            )  # fmt: skip
            acc_w += dz * x_hat
            acc_b += dz
    col_ok = cols < n
    tl.store(dw_ptr + cols, tl.sum(acc_w, axis=0).to(dw_ptr.dtype.element_ty), mask=col_ok)
    tl.store(db_ptr + cols, tl.sum(acc_b, axis=0).to(db_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _norm_swish_input_grads(
    x_ptr, dy_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, dx_ptr, R, D, G, n, seed_ptr, site, p,
    program, SWISH: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = (program // G) * BLOCK_R + tl.arange(0, BLOCK_R)
    group = program % G
    offsets, m, x_hat, dz, w, rstd = _norm_swish_grad_tile(
        x_ptr, dy_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, rows, group, tl.arange(0, BLOCK_N), R, D,
        G, n, seed_ptr, site, p, SWISH, DROPOUT,
    )  # fmt: skip
    g = dz * w[None, :]
    dx = rstd[:, None] * (
        g - (tl.sum(g, axis=1) / n)[:, None] - x_hat * (tl.sum(g * x_hat, axis=1) / n)[:, None]
    )
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=m)


@triton.jit
def _norm_swish_bwd_kernel(
    x_ptr, dy_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr,
    R, D, G, n, seed_ptr, site, p, COLUMN_PROGRAMS,
    SWISH: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    COLUMN_ROWS: tl.constexpr, COLUMN_BLOCK: tl.constexpr,
):  # fmt: skip
    # programs below COLUMN_PROGRAMS each own a slice of the group features, the rest a (row
    # block, group) tile
    pid = tl.program_id(0)
    if pid < COLUMN_PROGRAMS:
        _norm_swish_affine_grads(
            x_ptr, dy_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, R, D, G, n, seed_ptr,
            site, p, pid, SWISH, DROPOUT, COLUMN_ROWS, COLUMN_BLOCK,
        )  # fmt: skip
    else:
        _norm_swish_input_grads(
            x_ptr, dy_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, dx_ptr, R, D, G, n, seed_ptr, site, p,
            pid - COLUMN_PROGRAMS, SWISH, DROPOUT, BLOCK_R, BLOCK_N,
        )  # fmt: skip


def _launch(rows: int, width: int, on_gpu: bool) -> tuple[int, dict]:
    """Row blocks of a launch, and the tile (BLOCK_R rows of one group's ``width`` features)."""
    return row_launch(rows, width, on_gpu=on_gpu, elements_gpu=ELEMENTS_GPU, warps_gpu=WARPS_GPU)


def _column_launch(rows: int, width: int, on_gpu: bool) -> tuple[int, dict]:
    """The backward's column programs (:func:`~src.kernels.triton.norm_columns.column_launch`)."""
    return column_launch(
        rows, width, on_gpu=on_gpu, block_gpu=COLUMN_BLOCK_GPU, elements_gpu=ELEMENTS_GPU
    )


@opaque_op(
    "lightnets::shared_group_layer_norm_backward",
    contract.BACKWARD_SCHEMA,
    contract.backward_fake,
)
def shared_group_layer_norm_backward(
    grad_y: Tensor, x: Tensor, weight: Tensor, bias: Tensor, mean: Tensor, rstd: Tensor,
    swish: bool, seed: Tensor | None, site: int, p: float,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The input gradient, and the weight and bias gradients stacked. One launch: (row block,
    group) programs give the first, column programs the second.

    Shape:
        grad_y and x (R, D) contiguous, weight and bias (D / G,), mean and rstd (R, G), seed (1,)
        int64 or None -> ((R, D) in x's dtype, (2, D / G) in weight's dtype)
    """
    rows, width = x.shape
    groups = mean.shape[1]
    on_gpu = gpu_launch(x)
    row_blocks, meta = _launch(rows, width // groups, on_gpu)
    column_programs, column_meta = _column_launch(rows, width // groups, on_gpu)
    grad_x, grad_affine = contract.backward_fake(
        grad_y, x, weight, bias, mean, rstd, swish, seed, site, p
    )
    # the column programs first: on a GPU they start with the first wave, beside the row programs
    _norm_swish_bwd_kernel[(column_programs + row_blocks * groups,)](
        x, grad_y, weight, bias, mean, rstd, grad_x, grad_affine[0], grad_affine[1],
        rows, width, groups, width // groups, mean if seed is None else seed, site, p,
        column_programs, SWISH=swish, DROPOUT=p > 0, **meta, **column_meta,
    )  # fmt: skip
    return grad_x, grad_affine  # (2, D / G): weight, then bias


def _keep_for_backward(ctx, inputs: tuple, output: tuple) -> None:
    x, weight, bias, _, _, swish, seed, site, p = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, weight, bias, mean, rstd, seed)
    ctx.swish, ctx.site, ctx.p = swish, site, p


def _shared_group_layer_norm_grads(ctx, grad_y: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
    x, weight, bias, mean, rstd, seed = ctx.saved_tensors
    with autocast_off(x.device.type):
        grad_x, grad_affine = shared_group_layer_norm_backward(
            grad_y.contiguous(), x, weight, bias, mean, rstd, ctx.swish, seed, ctx.site, ctx.p
        )
    return grad_x, grad_affine[0], grad_affine[1], None, None, None, None, None, None


@autograd_op(
    "lightnets::shared_group_layer_norm",
    contract.FORWARD_SCHEMA,
    contract.forward_fake,
    setup_context=_keep_for_backward,
    backward=_shared_group_layer_norm_grads,
)
def shared_group_layer_norm_forward(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float, swish: bool,
    seed: Tensor | None, site: int, p: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The normalised (activated, dropped out with probability p > 0 by the mask of ``seed``)
    rows, and each (row, group)'s mean and 1 / std (kept for the backward, not differentiable).
    One launch.

    Shape:
        x (R, D) contiguous, weight and bias (D / groups,), seed (1,) int64 (None for p = 0)
        -> ((R, D), (R, G), (R, G))
    """
    rows, width = x.shape
    row_blocks, meta = _launch(rows, width // groups, gpu_launch(x))
    y, mean, rstd = contract.forward_fake(x, weight, bias, groups, eps, swish, seed, site, p)
    _norm_swish_fwd_kernel[(row_blocks, groups)](
        x, weight, bias, y, mean, rstd, rows, width, groups, width // groups, eps,
        mean if seed is None else seed, site, p, SWISH=swish, DROPOUT=p > 0, **meta,
    )  # fmt: skip
    return y, mean, rstd


def shared_group_layer_norm_triton(
    x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float, swish: bool, p: float = 0.0,
    seeds: DropoutSeeds | None = None,
) -> Tensor:  # fmt: skip
    """The fused norm (and swish, and dropout with probability p); the contract of
    :func:`src.kernels.shared_group_layer_norm.shared_group_layer_norm` (then ``F.silu`` and
    dropout), with the output in x's dtype. The dropout mask is Philox's from a seed tensor on
    x's device (the forward's shared seed and this site's index from ``seeds``, else a seed of its
    own), not ``F.dropout``'s; the backward draws it again.

    Shape:
        x (..., D) float32/float16/bfloat16, weight and bias (D / groups,) -> (..., D)
    """
    if x.dtype not in DTYPES or weight.dtype not in DTYPES or bias.dtype != weight.dtype:
        raise TypeError(
            f"the fused per-group LayerNorm takes x, weight and bias in {DTYPES} (weight and bias "
            f"of one dtype), got x {x.dtype}, weight {weight.dtype}, bias {bias.dtype}"
        )
    width = x.shape[-1]
    if groups < 1 or width % groups or {weight.shape, bias.shape} != {(width // groups,)}:
        raise ValueError(
            f"cannot normalise {width} features in {groups} groups with a shared affine of "
            f"{tuple(weight.shape)} and {tuple(bias.shape)}"
        )
    rows = x.reshape(-1, width).contiguous()  # (..., D) -> (R, D)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    seed, site = site_seed(seeds, x.device) if p > 0 else (None, 0)
    with autocast_off(x.device.type):
        y = shared_group_layer_norm_forward(
            rows, weight.contiguous(), bias.contiguous(), groups, float(eps), bool(swish), seed,
            site, float(p),
        )[0]  # fmt: skip
    return y.view(*x.shape[:-1], width)
