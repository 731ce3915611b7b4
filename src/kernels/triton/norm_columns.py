"""The column programs of the fused norms' backward: the weight and bias gradients of a LayerNorm,
summed over the rows inside the backward's own launch.

Each column program owns ``COLUMN_BLOCK`` features and loops over every row, ``COLUMN_ROWS`` at a
time, in a fixed order: no atomics, so the sums are the same on every run. The residual norm, the
shared-group norm and the per-group norm launch them beside their row programs
(:mod:`src.kernels.residual_layer_norm.triton_kernel`,
:mod:`~src.kernels.shared_group_layer_norm.triton_kernel`,
:mod:`~src.kernels.per_group_layer_norm.triton_kernel`).
"""

from __future__ import annotations

import triton

from src.kernels.triton.norm_rows import ELEMENTS_INTERPRETER


def column_launch(
    rows: int, width: int, *, on_gpu: bool, block_gpu: int, elements_gpu: int
) -> tuple[int, dict]:
    """How many column programs cover ``width`` features, and their (rows x features) tile:
    ``block_gpu`` features each on a GPU (all of them in the interpreter), as many rows as keep
    the tile within ``elements_gpu`` on a GPU, :data:`~.norm_rows.ELEMENTS_INTERPRETER` in the
    interpreter."""
    block_c = triton.next_power_of_2(width)
    if on_gpu:
        block_c = min(block_c, block_gpu)
    elements = elements_gpu if on_gpu else ELEMENTS_INTERPRETER
    block_r = max(1, min(triton.next_power_of_2(rows), elements // block_c))
    return triton.cdiv(width, block_c), {"COLUMN_ROWS": block_r, "COLUMN_BLOCK": block_c}
