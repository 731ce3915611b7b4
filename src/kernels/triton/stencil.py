"""The tiles of the stencil kernels: DimConv (:mod:`src.kernels.dim_conv.triton_kernel`), DiCE's
local fusion (:mod:`src.kernels.dim_fuse.triton_kernel`) and EESP's pyramid
(:mod:`src.kernels.eesp.triton_kernel`).

A program of these kernels covers a (channel x row x column) tile of one image of a (B, C, H, W)
tensor: grid axis 0 walks the images and their blocks of rows, axis 1 the blocks of channels,
axis 2 the blocks of columns. The globals below are read at every launch.
"""

from __future__ import annotations

from collections.abc import Sequence

import triton
import triton.language as tl

TILE_GPU = 512  # pixels of one tile on a GPU
# Warps per GPU tile: 8, two pixels per thread. With Triton's default of 4, the fused DiCE and EESP
# passes built for an H100 need 128-188 registers per thread, leaving 8-16 of 64 warps resident
# (occupancy 0.12-0.25) to hide the memory latency of these stencils; with 8 they need 32-128 and
# reach 0.25-1.00 (benchmarks/kernel_builds.py, docs/gpu.md). Their speed is still to be measured.
WARPS_GPU = 8
TILE_INTERPRETER = 1 << 14


@triton.jit
def tile(C, H, W, BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """This program's image b and (channel, row, column) index tiles, each 3-D for broadcasting."""
    n_hblocks = tl.cdiv(H, BLOCK_H)
    pid_bh = tl.program_id(0)  # b * n_hblocks + row block
    b = (pid_bh // n_hblocks).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    h = (pid_bh % n_hblocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    w = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)
    # (BLOCK_C, 1, 1), (1, BLOCK_H, 1), (1, 1, BLOCK_W)
    return b, c[:, None, None], h[None, :, None], w[None, None, :]


def launch_config(shape: Sequence[int], on_gpu: bool) -> tuple[tuple[int, int, int], dict]:
    """Grid, tile sizes (``BLOCK_C``, ``BLOCK_H``, ``BLOCK_W``) over (B, C, H, W) and, on a GPU, the
    warp count. A tile holds up to ``TILE_GPU`` pixels on a GPU (``WARPS_GPU`` warps); the
    interpreter pays per operation, not per element, so there one tile covers as much of the image
    as it can."""
    batch, channels, height, width = shape
    budget = TILE_GPU if on_gpu else TILE_INTERPRETER
    block_w = min(triton.next_power_of_2(width), budget)
    block_h = min(triton.next_power_of_2(height), budget // block_w)
    block_c = min(triton.next_power_of_2(channels), budget // (block_w * block_h))
    grid = (
        batch * triton.cdiv(height, block_h),
        triton.cdiv(channels, block_c),
        triton.cdiv(width, block_w),
    )
    meta = {"BLOCK_C": block_c, "BLOCK_H": block_h, "BLOCK_W": block_w}
    if on_gpu:
        meta["num_warps"] = WARPS_GPU
    return grid, meta
