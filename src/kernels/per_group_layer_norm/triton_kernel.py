"""Fused per-group layer norm: Group-Transformer's norm in one launch each way.

Group-Transformer's per-group norm (:mod:`src.kernels.per_group_layer_norm`) as written in PyTorch
is six element-wise passes forward (mean, centre, std, add eps, divide, affine) and about twice
that backward; the model runs five such norms per layer. Here one program normalises a block of
rows of one group:

    c = x_g - mean(x_g),  s = sqrt(sum(c^2) / (n - 1)),  r = 1 / (s + eps),  y = c r w + b

keeping the per-(row, group) mean and s for the backward. With ``g = dy w`` (per feature) the input
gradient of one group row is

    dx = r (g - mean(g)) - r^2 sum(g c) c / ((n - 1) s)

(the second term is zero where s = 0, a constant row; the PyTorch path's autograd gives NaN there).
The weight and bias gradients (sums of ``dy x_hat`` and ``dy`` over the rows) come from column
programs of the same launch, each summing a slice of the features over every row in a fixed order:
no reduction launches after the kernel, and no atomics, so they do not depend on the run.

Statistics and arithmetic are float32 for every input dtype; the output is float32 for 16-bit
inputs (as the PyTorch path's, which normalises ``x.float()``) and x's dtype otherwise. The
forward is the custom op ``lightnets::per_group_layer_norm`` with the backward kernel as its
autograd rule: one node each way in a graph ``torch.compile`` traces.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.dispatch import autocast_off, opaque_op
from src.kernels.per_group_layer_norm import contract as contract
from src.kernels.triton.launch import gpu_launch
from src.kernels.triton.norm_columns import column_launch
from src.kernels.triton.norm_rows import DTYPES, row_launch

ELEMENTS_GPU = 4096  # elements of one program's (rows x group width) tile
# 8 warps, 16 elements per thread: with 4, the backward needed 128-168 registers per thread on an
# A100 or H100 (occupancy 0.19-0.25); with 8, 64-80 (0.38-0.50; docs/gpu.md). Speed: to be measured.
WARPS_GPU = 8
# features of one backward program that sums the weight and bias gradients over every row: D / 32
# such programs beside the row programs, instead of two reductions after them. Speed: to be
# measured
COLUMN_BLOCK_GPU = 32


@triton.jit
def _norm_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, std_ptr,
    R, D, G, n, eps,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    group = tl.program_id(1)
    cols = tl.arange(0, BLOCK_N)
    feature = group * n + cols  # (BLOCK_N,)
    row_ok = rows < R
    col_ok = cols < n
    m = row_ok[:, None] & col_ok[None, :]
    offsets = rows.to(tl.int64)[:, None] * D + feature[None, :]
    x = tl.load(x_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n
    c = tl.where(m, x - mean[:, None], 0.0)
    std = tl.sqrt(tl.sum(c * c, axis=1) / (n - 1))
    rden = 1.0 / (std + eps)
    w = tl.load(w_ptr + feature, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + feature, mask=col_ok, other=0.0).to(tl.float32)
    y = c * rden[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=m)
    tl.store(mean_ptr + rows * G + group, mean, mask=row_ok)
    tl.store(std_ptr + rows * G + group, std, mask=row_ok)


@triton.jit
def _norm_affine_grads(
    x_ptr, dy_ptr, mean_ptr, std_ptr, dw_ptr, db_ptr, R, D, G, n, eps, program,
    COLUMN_ROWS: tl.constexpr, COLUMN_BLOCK: tl.constexpr,
):  # fmt: skip
    # the weight and bias gradients of COLUMN_BLOCK features: sums of dy x_hat and dy over every
    # row, in one fixed order (no atomics: the same bits on every run)
    features = program * COLUMN_BLOCK + tl.arange(0, COLUMN_BLOCK)
    f_ok = features < D
    group = features // n
    acc_w = tl.zeros((COLUMN_ROWS, COLUMN_BLOCK), dtype=tl.float32)
    acc_b = tl.zeros((COLUMN_ROWS, COLUMN_BLOCK), dtype=tl.float32)
    for r0 in range(0, R, COLUMN_ROWS):
        rows = r0 + tl.arange(0, COLUMN_ROWS)
        m = (rows < R)[:, None] & f_ok[None, :]
        offsets = rows.to(tl.int64)[:, None] * D + features[None, :]
        x = tl.load(x_ptr + offsets, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=m, other=0.0).to(tl.float32)
        stats = rows[:, None] * G + group[None, :]
        mean = tl.load(mean_ptr + stats, mask=m, other=0.0)
        std = tl.load(std_ptr + stats, mask=m, other=1.0)
        acc_w += dy * tl.where(m, x - mean, 0.0) * (1.0 / (std + eps))
        acc_b += dy
    tl.store(dw_ptr + features, tl.sum(acc_w, axis=0).to(dw_ptr.dtype.element_ty), mask=f_ok)
    tl.store(db_ptr + features, tl.sum(acc_b, axis=0).to(db_ptr.dtype.element_ty), mask=f_ok)


@triton.jit
def _norm_input_grads(
    x_ptr, dy_ptr, w_ptr, mean_ptr, std_ptr, dx_ptr, R, D, G, n, eps, program,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = (program // G) * BLOCK_R + tl.arange(0, BLOCK_R)
    group = program % G
    cols = tl.arange(0, BLOCK_N)
    feature = group * n + cols
    row_ok = rows < R
    col_ok = cols < n
    m = row_ok[:, None] & col_ok[None, :]
    offsets = rows.to(tl.int64)[:, None] * D + feature[None, :]
    x = tl.load(x_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + rows * G + group, mask=row_ok, other=0.0)
    std = tl.load(std_ptr + rows * G + group, mask=row_ok, other=1.0)
    w = tl.load(w_ptr + feature, mask=col_ok, other=0.0).to(tl.float32)
    c = tl.where(m, x - mean[:, None], 0.0)
    g = dy * w[None, :]
    rden = 1.0 / (std + eps)
    # d std / d x = c / ((n - 1) s): zero for a constant row (c = 0)
    positive = std > 0
    safe_std = tl.where(positive, std, 1.0)
    coef = tl.where(positive, rden * rden * tl.sum(g * c, axis=1) / ((n - 1) * safe_std), 0.0)
    dx = rden[:, None] * (g - (tl.sum(g, axis=1) / n)[:, None]) - coef[:, None] * c
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=m)


@triton.jit
def _norm_bwd_kernel(
    x_ptr, dy_ptr, w_ptr, mean_ptr, std_ptr, dx_ptr, dw_ptr, db_ptr,
    R, D, G, n, eps, COLUMN_PROGRAMS,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, COLUMN_ROWS: tl.constexpr,
    COLUMN_BLOCK: tl.constexpr,
):  # fmt: skip
    # programs below COLUMN_PROGRAMS each own a slice of the features, the rest a (row block,
    # group) tile
    pid = tl.program_id(0)
    if pid < COLUMN_PROGRAMS:
        _norm_affine_grads(
            x_ptr, dy_ptr, mean_ptr, std_ptr, dw_ptr, db_ptr, R, D, G, n, eps, pid, COLUMN_ROWS,
            COLUMN_BLOCK,
        )  # fmt: skip
    else:
        _norm_input_grads(
            x_ptr, dy_ptr, w_ptr, mean_ptr, std_ptr, dx_ptr, R, D, G, n, eps,
            pid - COLUMN_PROGRAMS, BLOCK_R, BLOCK_N,
        )  # fmt: skip


def _launch(rows: int, width: int, groups: int, on_gpu: bool) -> tuple[tuple[int, int], dict]:
    blocks, meta = row_launch(
        rows, width, on_gpu=on_gpu, elements_gpu=ELEMENTS_GPU, warps_gpu=WARPS_GPU
    )
    return (blocks, groups), meta


def _column_launch(rows: int, width: int, on_gpu: bool) -> tuple[int, dict]:
    """The backward's column programs (:func:`~src.kernels.triton.norm_columns.column_launch`)."""
    return column_launch(
        rows, width, on_gpu=on_gpu, block_gpu=COLUMN_BLOCK_GPU, elements_gpu=ELEMENTS_GPU
    )


@opaque_op(
    "lightnets::per_group_layer_norm_backward", contract.BACKWARD_SCHEMA, contract.backward_fake
)
def per_group_layer_norm_backward(
    grad_y: Tensor, x: Tensor, weight: Tensor, mean: Tensor, std: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Input, weight and bias gradients. One launch: (row block, group) programs give the first,
    column programs the other two.

    Shape:
        grad_y and x (R, D) contiguous, weight (D,), mean and std (R, G)
        -> ((R, D) in x's dtype, (D,), (D,) in weight's dtype)
    """
    rows, width = x.shape
    groups = mean.shape[1]
    on_gpu = gpu_launch(x)
    (row_blocks, _), meta = _launch(rows, width // groups, groups, on_gpu)
    column_programs, column_meta = _column_launch(rows, width, on_gpu)
    grad_x, grad_w, grad_b = contract.backward_fake(grad_y, x, weight, mean, std, eps)
    # the column programs first: on a GPU they start with the first wave, beside the row programs
    _norm_bwd_kernel[(column_programs + row_blocks * groups,)](
        x, grad_y, weight, mean, std, grad_x, grad_w, grad_b,
        rows, width, groups, width // groups, eps, column_programs, **meta, **column_meta,
    )  # fmt: skip
    return grad_x, grad_w, grad_b


@contract.forward_op("lightnets::per_group_layer_norm", per_group_layer_norm_backward)
def per_group_layer_norm_forward(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The normalised rows, and each (row, group)'s mean and std (kept for the backward, not
    differentiable). One launch.

    Shape:
        x (R, D) contiguous, weight and bias (D,) -> ((R, D), (R, G), (R, G))
    """
    rows, width = x.shape
    grid, meta = _launch(rows, width // groups, groups, gpu_launch(x))
    y, mean, std = contract.forward_fake(x, weight, bias, groups, eps)
    _norm_fwd_kernel[grid](
        x, weight, bias, y, mean, std, rows, width, groups, width // groups, eps, **meta
    )
    return y, mean, std


def per_group_layer_norm_triton(
    x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float
) -> Tensor:
    """The fused norm; the contract of
    :func:`src.kernels.per_group_layer_norm.per_group_layer_norm_reference`.

    Shape:
        x (..., D) float32/float16/bfloat16, weight and bias (D,) float32 -> (..., D)
    """
    if x.dtype not in DTYPES or weight.dtype != torch.float32 or bias.dtype != torch.float32:
        raise TypeError(
            f"the fused per-group norm takes x in {DTYPES} with float32 weight and bias, got "
            f"x {x.dtype}, weight {weight.dtype}, bias {bias.dtype}"
        )
    width = x.shape[-1]
    rows = x.reshape(-1, width).contiguous()  # (..., D) -> (R, D)
    with autocast_off(x.device.type):
        y = per_group_layer_norm_forward(
            rows, weight.contiguous(), bias.contiguous(), groups, float(eps)
        )[0]
    return y.view(*x.shape[:-1], width)
