"""Fused post-norm residual: ``LayerNorm(residual + dropout(branch))`` in one launch each way.

Every sublayer of a post-norm Transformer block (DeLighT's: attention, encoder-decoder attention,
light-weight FFN) ends so. In PyTorch that is a dropout, an add and ``layer_norm`` forward, and
their backward kernels: five or six launches, for rows a few hundred features wide, where
DeLighT's training step is launch-bound (docs/gpu.md). Here one program takes a block of rows:

    s = residual + m(branch) / (1 - p),  c = s - mean(s),  r = 1 / sqrt(mean(c^2) + eps),
    y = c r w + b

keeping s (in the sum's dtype, as PyTorch's ``layer_norm`` keeps its input) and each row's mean
and r for the backward. The dropout mask m keeps element i when Philox's ``tl.rand(seed, i)`` is
at or above p, the seed a tensor drawn on the input's device, per call or once for the dropout
sites of a forward (:mod:`src.kernels.dropout.triton_kernel`: ``torch.manual_seed`` fixes it, a
traced or replayed graph draws it anew; the masks differ from ``F.dropout``'s, their distribution
does not), and the backward draws the mask again from the saved seed and site. With ``x_hat = c r``
and ``g = dy w`` the sum's gradient is

    ds = r (g - mean(g) - x_hat mean(g x_hat))

which is the residual's gradient; the branch's is ``m ds / (1 - p)``. The weight and bias
gradients (sums of ``dy x_hat`` and ``dy`` over rows) come from column programs of the same launch,
each summing a slice of the features over every row in a fixed order: no reduction launch after
the kernel, and no atomics, so they do not depend on the run.

Statistics and arithmetic are float32. The output is in the dtype PyTorch's path gives: the
promotion of residual and branch (a float32 residual stream and a 16-bit branch under autocast:
float32, as CUDA's autocast runs ``layer_norm``). The forward is the custom op
``lightnets::residual_layer_norm`` with the backward kernel as its autograd rule: one node each
way in a graph ``torch.compile`` traces.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.custom_ops import autograd_op
from src.kernels.dispatch import autocast_off, opaque_op
from src.kernels.dropout.contract import DropoutSeeds, site_seed
from src.kernels.dropout.triton_kernel import kept
from src.kernels.residual_layer_norm import contract as contract
from src.kernels.triton.launch import gpu_launch
from src.kernels.triton.norm_columns import column_launch
from src.kernels.triton.norm_rows import DTYPES, layer_norm_tile, row_launch

# a program's (rows x features) tile and warps on a GPU: the per-group norm's (its builds:
# tests/kernels/test_kernel_builds.py); speed to be measured by benchmarks/gpu_tune.py
ELEMENTS_GPU = 2048
WARPS_GPU = 8
# features of one backward program that sums the weight and bias gradients over every row: D / 32
# such programs (10 at DeLighT MT's d_m = 320) beside the row programs, instead of a reduction
# launch after them. Speed: to be measured (benchmarks/gpu_tune.py)
COLUMN_BLOCK_GPU = 32


@triton.jit
def _branch_rows(rows, R, n0):
    """The branch's rows holding the residual's ``rows``: row i n1 + j of (n0, n1) is row
    j n0 + i when the branch lies as (n1, n0), the same row for n0 = 1."""
    rows = rows.to(tl.int64)
    n1 = R // n0
    return (rows % n1) * n0 + rows // n1


@triton.jit
def _residual_norm_fwd_kernel(
    r_ptr, x_ptr, w_ptr, b_ptr, y_ptr, s_ptr, mean_ptr, rstd_ptr,
    R, D, eps, seed_ptr, site, p, n0,
    DROPOUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < R
    col_ok = cols < D
    m = row_ok[:, None] & col_ok[None, :]
    offsets = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x_offsets = _branch_rows(rows, R, n0)[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + x_offsets, mask=m, other=0.0).to(tl.float32)
    if DROPOUT:
        x = tl.where(kept(seed_ptr, site, offsets, p), x / (1.0 - p), 0.0)
    s = tl.load(r_ptr + offsets, mask=m, other=0.0).to(tl.float32) + x
    s = s.to(s_ptr.dtype.element_ty)
    tl.store(s_ptr + offsets, s, mask=m)
    # normalised as stored, as PyTorch normalises the sum it has rounded to its dtype
    y, mean, rstd = layer_norm_tile(s.to(tl.float32), m, w_ptr, b_ptr, cols, col_ok, D, eps)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=m)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _residual_norm_grad_tile(s_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, R, D):
    """A tile of ``rows``, its features ``cols``: (offsets, in-bounds mask, x_hat, dy, rstd),
    x_hat and dy zero outside the tensor."""
    row_ok = rows < R
    m = row_ok[:, None] & (cols < D)[None, :]
    offsets = rows.to(tl.int64)[:, None] * D + cols[None, :]
    s = tl.load(s_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
    return offsets, m, tl.where(m, (s - mean[:, None]) * rstd[:, None], 0.0), dy, rstd


@triton.jit
def _residual_norm_affine_grads(
    s_ptr, dy_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, R, D, program,
    COLUMN_ROWS: tl.constexpr, COLUMN_BLOCK: tl.constexpr,
):  # fmt: skip
    # the weight and bias gradients of COLUMN_BLOCK features: sums of dy x_hat and dy over every
    # row, in one fixed order (no atomics: the same bits on every run)
    cols = program * COLUMN_BLOCK + tl.arange(0, COLUMN_BLOCK)
    col_ok = cols < D
    acc_w = tl.zeros((COLUMN_ROWS, COLUMN_BLOCK), dtype=tl.float32)
    acc_b = tl.zeros((COLUMN_ROWS, COLUMN_BLOCK), dtype=tl.float32)
    for r0 in range(0, R, COLUMN_ROWS):
        rows = r0 + tl.arange(0, COLUMN_ROWS)
        _, _, x_hat, dy, _ = _residual_norm_grad_tile(
            s_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, R, D
        )
        acc_w += dy * x_hat
        acc_b += dy
    tl.store(dw_ptr + cols, tl.sum(acc_w, axis=0).to(dw_ptr.dtype.element_ty), mask=col_ok)
    tl.store(db_ptr + cols, tl.sum(acc_b, axis=0).to(db_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _residual_norm_input_grads(
    s_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dr_ptr, dx_ptr, R, D, seed_ptr, site, p, n0, program,
    DROPOUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = program * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    offsets, m, x_hat, dy, rstd = _residual_norm_grad_tile(
        s_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, R, D
    )
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    g = dy * w[None, :]
    ds = rstd[:, None] * (
        g - (tl.sum(g, axis=1) / D)[:, None] - x_hat * (tl.sum(g * x_hat, axis=1) / D)[:, None]
    )
    tl.store(dr_ptr + offsets, ds.to(dr_ptr.dtype.element_ty), mask=m)
    dx = ds
    if DROPOUT:  # the forward's mask, drawn again
        dx = tl.where(kept(seed_ptr, site, offsets, p), ds / (1.0 - p), 0.0)
    x_offsets = _branch_rows(rows, R, n0)[:, None] * D + cols[None, :]
    tl.store(dx_ptr + x_offsets, dx.to(dx_ptr.dtype.element_ty), mask=m)


@triton.jit
def _residual_norm_bwd_kernel(
    s_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dr_ptr, dx_ptr, dw_ptr, db_ptr,
    R, D, seed_ptr, site, p, n0, COLUMN_PROGRAMS,
    DROPOUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    COLUMN_ROWS: tl.constexpr, COLUMN_BLOCK: tl.constexpr,
):  # fmt: skip
    # programs below COLUMN_PROGRAMS each own a slice of features, the rest a block of rows
    pid = tl.program_id(0)
    if pid < COLUMN_PROGRAMS:
        _residual_norm_affine_grads(
            s_ptr, dy_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, R, D, pid, COLUMN_ROWS, COLUMN_BLOCK
        )
    else:
        _residual_norm_input_grads(
            s_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dr_ptr, dx_ptr, R, D, seed_ptr, site, p, n0,
            pid - COLUMN_PROGRAMS, DROPOUT, BLOCK_R, BLOCK_N,
        )  # fmt: skip


def _launch(rows: int, width: int, on_gpu: bool) -> tuple[tuple[int], dict]:
    blocks, meta = row_launch(
        rows, width, on_gpu=on_gpu, elements_gpu=ELEMENTS_GPU, warps_gpu=WARPS_GPU
    )
    return (blocks,), meta


def _column_launch(rows: int, width: int, on_gpu: bool) -> tuple[int, dict]:
    """The backward's column programs (:func:`~src.kernels.triton.norm_columns.column_launch`)."""
    return column_launch(
        rows, width, on_gpu=on_gpu, block_gpu=COLUMN_BLOCK_GPU, elements_gpu=ELEMENTS_GPU
    )


@opaque_op(
    "lightnets::residual_layer_norm_backward", contract.BACKWARD_SCHEMA, contract.backward_fake
)
def residual_layer_norm_backward(
    grad_y: Tensor, total: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor,
    branch_dtype: torch.dtype, seed: Tensor | None, site: int, p: float, n0: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The residual's and the branch's gradients, and the weight and bias gradients stacked. One
    launch: row programs give the first two, column programs the last.

    Shape:
        grad_y and total (R, D) contiguous, weight (D,), mean and rstd (R,), seed (1,) int64 or
        None -> ((R, D), (R, D) in branch_dtype and the branch's row order, (2, D) in weight's
        dtype)
    """
    rows, width = total.shape
    on_gpu = gpu_launch(total)
    (row_programs,), meta = _launch(rows, width, on_gpu)
    column_programs, column_meta = _column_launch(rows, width, on_gpu)
    grad_r, grad_x, grad_affine = contract.backward_fake(
        grad_y, total, weight, mean, rstd, branch_dtype, seed, site, p, n0
    )
    # the column programs first: on a GPU they start with the first wave, beside the row programs
    _residual_norm_bwd_kernel[(column_programs + row_programs,)](
        total, grad_y, weight, mean, rstd, grad_r, grad_x, grad_affine[0], grad_affine[1], rows,
        width, mean if seed is None else seed, site, p, n0, column_programs, DROPOUT=p > 0,
        **meta, **column_meta,
    )  # fmt: skip
    return grad_r, grad_x, grad_affine  # (2, D): weight, then bias


def _keep_for_backward(ctx, inputs: tuple, output: tuple) -> None:
    _, branch, weight, _, _, seed, site, p, n0 = inputs
    _, total, mean, rstd = output
    ctx.mark_non_differentiable(total, mean, rstd)
    ctx.save_for_backward(total, weight, mean, rstd, seed)
    ctx.branch_dtype, ctx.site, ctx.p, ctx.n0 = branch.dtype, site, p, n0


def _residual_layer_norm_grads(ctx, grad_y: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
    total, weight, mean, rstd, seed = ctx.saved_tensors
    with autocast_off(total.device.type):
        grad_r, grad_x, grad_affine = residual_layer_norm_backward(
            grad_y.contiguous(), total, weight, mean, rstd, ctx.branch_dtype, seed, ctx.site,
            ctx.p, ctx.n0,
        )  # fmt: skip
    return grad_r, grad_x, grad_affine[0], grad_affine[1], None, None, None, None, None


@autograd_op(
    "lightnets::residual_layer_norm",
    contract.FORWARD_SCHEMA,
    contract.forward_fake,
    setup_context=_keep_for_backward,
    backward=_residual_layer_norm_grads,
)
def residual_layer_norm_forward(
    residual: Tensor, branch: Tensor, weight: Tensor, bias: Tensor, eps: float,
    seed: Tensor | None, site: int, p: float, n0: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The normalised rows, the sum they normalise, and each row's mean and 1 / std (the last
    three kept for the backward, not differentiable). One launch.

    Shape:
        residual and branch (R, D) contiguous, the branch's rows in the order ``n0`` gives
        (:mod:`src.kernels.residual_layer_norm.contract`), weight and bias (D,), seed (1,) int64
        (None for p = 0) -> ((R, D), (R, D), (R,), (R,))
    """
    rows, width = residual.shape
    grid, meta = _launch(rows, width, gpu_launch(residual))
    y, total, mean, rstd = contract.forward_fake(
        residual, branch, weight, bias, eps, seed, site, p, n0
    )
    _residual_norm_fwd_kernel[grid](
        residual, branch, weight, bias, y, total, mean, rstd, rows, width, eps,
        mean if seed is None else seed, site, p, n0, DROPOUT=p > 0, **meta,
    )  # fmt: skip
    return y, total, mean, rstd


def residual_layer_norm_triton(
    residual: Tensor, branch: Tensor, weight: Tensor, bias: Tensor, eps: float, p: float = 0.0,
    seeds: DropoutSeeds | None = None,
) -> Tensor:  # fmt: skip
    """The fused post-norm residual; the contract of
    :func:`src.kernels.residual_layer_norm.residual_layer_norm`. The dropout mask is Philox's from a
    seed tensor on the input's device (the forward's shared seed and this site's index from
    ``seeds``, else a seed of its own), not ``F.dropout``'s; the backward draws it again.

    Shape:
        residual and branch (..., D) float32/float16/bfloat16, weight and bias (D,) -> (..., D)
    """
    if {residual.dtype, branch.dtype, weight.dtype} - set(DTYPES) or bias.dtype != weight.dtype:
        raise TypeError(
            f"the fused residual LayerNorm takes residual, branch, weight and bias in {DTYPES} "
            f"(weight and bias of one dtype), got {residual.dtype}, {branch.dtype}, "
            f"{weight.dtype}, {bias.dtype}"
        )
    width = residual.shape[-1]
    if branch.shape != residual.shape or {weight.shape, bias.shape} != {(width,)}:
        raise ValueError(
            f"residual {tuple(residual.shape)} and branch {tuple(branch.shape)} must match, and "
            f"weight {tuple(weight.shape)} and bias {tuple(bias.shape)} be ({width},)"
        )
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    n0 = 1
    if branch.dim() == 3 and not branch.is_contiguous() and branch.transpose(0, 1).is_contiguous():
        # (n0, n1, D) lying as (n1, n0, D), as an attention's output of (B, T, D) seen as
        # (T, B, D): read and its gradient written in place, without a copy either way
        n0 = branch.shape[0]
        branch = branch.transpose(0, 1)
    rows = [t.reshape(-1, width).contiguous() for t in (residual, branch)]  # (..., D) -> (R, D)
    seed, site = site_seed(seeds, residual.device) if p > 0 else (None, 0)
    with autocast_off(residual.device.type):
        y = residual_layer_norm_forward(
            *rows, weight.contiguous(), bias.contiguous(), float(eps), seed, site, float(p), n0
        )[0]
    return y.view(*residual.shape[:-1], width)
