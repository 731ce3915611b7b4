"""The row programs of the fused norms: their tiles, and the LayerNorm of a tile of rows.

A row program normalises ``BLOCK_R`` rows of one group (the whole width for the residual norm),
``BLOCK_N`` features each, as many rows as keep the tile within a budget of elements: the norm's own
``ELEMENTS_GPU`` on a GPU, :data:`ELEMENTS_INTERPRETER` in Triton's interpreter. The residual
norm, the shared-group norm and the per-group norm launch them
(:mod:`src.kernels.residual_layer_norm.triton_kernel`,
:mod:`~src.kernels.shared_group_layer_norm.triton_kernel`,
:mod:`~src.kernels.per_group_layer_norm.triton_kernel`); their column programs are
:mod:`.norm_columns`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ELEMENTS_INTERPRETER = 1 << 16  # elements of a tile in the interpreter
DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what the fused norms read and write


def row_launch(
    rows: int, width: int, *, on_gpu: bool, elements_gpu: int, warps_gpu: int
) -> tuple[int, dict]:
    """How many row blocks cover ``rows``, and their tile: ``BLOCK_N`` the power of two holding
    ``width`` features, ``BLOCK_R`` as many rows as keep the tile within ``elements_gpu`` on a GPU
    (``warps_gpu`` warps a program), :data:`ELEMENTS_INTERPRETER` in the interpreter."""
    block_n = triton.next_power_of_2(width)
    budget = elements_gpu if on_gpu else ELEMENTS_INTERPRETER
    block_r = max(1, min(triton.next_power_of_2(rows), budget // block_n))
    meta = {"BLOCK_R": block_r, "BLOCK_N": block_n}
    if on_gpu:
        meta["num_warps"] = warps_gpu
    return triton.cdiv(rows, block_r), meta


@triton.jit
def layer_norm_tile(x, m, w_ptr, b_ptr, cols, col_ok, n, eps):
    """LayerNorm of a (rows x ``n`` features) float32 tile ``x``, zero outside the mask ``m``, with
    the affine's ``cols`` (masked by ``col_ok``): (z, mean, 1 / sqrt(biased variance + eps)),
    z = (x - mean) rstd w + b."""
    mean = tl.sum(x, axis=1) / n
    c = tl.where(m, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=1) / n + eps)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    return c * rstd[:, None] * w[None, :] + b[None, :], mean, rstd
