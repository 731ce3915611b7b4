"""BatchNorm + PReLU fused for channels-last training on a GPU: the Triton counterpart of
``src/kernels/batch_norm_prelu/batch_norm_prelu.cpp``, under the same two ops' contract
(:mod:`src.kernels.batch_norm_prelu.contract`).

A channels-last (B, C, H, W) activation is read as (R, C) = (B H W, C) rows. With per-channel
batch mean m, biased variance v, 1/std s, BN's ``scale = w s`` and ``shift = b - m scale``:

    z = scale x + shift (+ r),  y = z where z > 0, a z elsewhere

(r: an optional residual, EESP's unit input, whose gradient is dz.)

Unfused, cuDNN's BN writes z, PReLU reads it back and writes y, and autograd keeps x and z. Here:

- forward: a statistics pass (per program, the sums of x - k and (x - k)^2 over a chunk of rows,
  k = x[0, c], so that a mean far from zero costs no float32 digits), then one pass writing y;
- backward: a pass of per-chunk sums (sum dz, sum dz (x - m), PReLU's sum min(z, 0) dy, with
  ``dz = dy (z > 0 ? 1 : a)``), then one writing ``dx = scale dz + q (x - m) + r``
  (:func:`src.kernels.fused_norm.batch_norm_backward`).

Autograd keeps x alone; z is recomputed. The per-chunk partial sums are added by PyTorch (float64
for the statistics), in a fixed order, so nothing depends on the run. Arithmetic is float32 for
every input dtype; y and dx take x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.batch_norm_prelu import contract as contract
from src.kernels.dispatch import opaque_op
from src.kernels.fused_norm import batch_norm_backward, batch_statistics
from src.kernels.triton.launch import gpu_launch, multi_processor_count

ELEMENTS_GPU = 4096  # elements of one program's (rows x channels) tile
WARPS_GPU = 8  # 16 elements a thread, as the per-group norm's tiles (docs/gpu.md)
ELEMENTS_INTERPRETER = 1 << 16
CHANNELS_GPU = 128  # a tile's channels on a GPU: 512 contiguous bytes of a float32 row
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rows(pid, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Tile ``pid``'s rows from ``pid * BLOCK_R``, this program's channels, offsets and mask."""
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    return r[:, None] * C + c[None, :], (r < R)[:, None] & c_ok[None, :], c, c_ok


@triton.jit
def _channel_vectors(scale_ptr, shift_ptr, alpha_ptr, c, c_ok):
    """BN's scale and shift and PReLU's slope at channels c, each (1, BLOCK_C)."""
    s = tl.load(scale_ptr + c, mask=c_ok, other=0.0)[None, :]
    t = tl.load(shift_ptr + c, mask=c_ok, other=0.0)[None, :]
    a = tl.load(alpha_ptr + c, mask=c_ok, other=0.0)[None, :]
    return s, t, a


@triton.jit
def _stats_kernel(
    x_ptr, part_ptr, R, C, TILES,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # partials (programs, 2, C): sum (x - k) and sum (x - k)^2 over TILES tiles of rows
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    k = tl.load(x_ptr + c, mask=c < C, other=0.0).to(tl.float32)  # the shift: row 0
    s1 = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for t in range(TILES):
        offs, m, _, _ = _rows(tl.program_id(0) * TILES + t, R, C, BLOCK_R, BLOCK_C)
        d = tl.where(m, tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32) - k[None, :], 0.0)
        s1 += d
        s2 += d * d
    row = part_ptr + tl.program_id(0) * 2 * C
    tl.store(row + c, tl.sum(s1, axis=0), mask=c < C)
    tl.store(row + C + c, tl.sum(s2, axis=0), mask=c < C)


@triton.jit
def _fwd_kernel(
    x_ptr, r_ptr, scale_ptr, shift_ptr, alpha_ptr, y_ptr, R, C,
    HAS_RES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    offs, m, c, c_ok = _rows(tl.program_id(0), R, C, BLOCK_R, BLOCK_C)
    s, t, a = _channel_vectors(scale_ptr, shift_ptr, alpha_ptr, c, c_ok)
    z = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32) * s + t
    if HAS_RES:
        z += tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, tl.where(z > 0, z, a * z).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bwd_sums_kernel(
    x_ptr, r_ptr, g_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, part_ptr, R, C, TILES,
    HAS_RES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # partials (programs, 3, C): sum dz, sum dz (x - m), sum min(z, 0) dy over TILES tiles
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    s, t, a = _channel_vectors(scale_ptr, shift_ptr, alpha_ptr, c, c_ok)
    mu = tl.load(mean_ptr + c, mask=c_ok, other=0.0)[None, :]
    sum_dz = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    sum_dz_centred = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    sum_slope = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for tile in range(TILES):
        offs, m, _, _ = _rows(tl.program_id(0) * TILES + tile, R, C, BLOCK_R, BLOCK_C)
        x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)  # 0 off the mask
        z = x * s + t
        if HAS_RES:
            z += tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32)
        positive = z > 0
        dz = tl.where(positive, g, a * g)
        sum_dz += dz
        sum_dz_centred += tl.where(m, dz * (x - mu), 0.0)
        sum_slope += tl.where(positive, 0.0, g * z)
    row = part_ptr + tl.program_id(0) * 3 * C
    tl.store(row + c, tl.sum(sum_dz, axis=0), mask=c_ok)
    tl.store(row + C + c, tl.sum(sum_dz_centred, axis=0), mask=c_ok)
    tl.store(row + 2 * C + c, tl.sum(sum_slope, axis=0), mask=c_ok)


@triton.jit
def _bwd_dx_kernel(
    x_ptr, res_ptr, g_ptr, scale_ptr, shift_ptr, alpha_ptr, mean_ptr, q_ptr, r_ptr, dx_ptr,
    dres_ptr, R, C,
    HAS_RES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    offs, m, c, c_ok = _rows(tl.program_id(0), R, C, BLOCK_R, BLOCK_C)
    s, t, a = _channel_vectors(scale_ptr, shift_ptr, alpha_ptr, c, c_ok)
    mu = tl.load(mean_ptr + c, mask=c_ok, other=0.0)[None, :]
    q = tl.load(q_ptr + c, mask=c_ok, other=0.0)[None, :]
    r = tl.load(r_ptr + c, mask=c_ok, other=0.0)[None, :]
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
    z = x * s + t
    if HAS_RES:
        z += tl.load(res_ptr + offs, mask=m, other=0.0).to(tl.float32)
    dz = tl.where(z > 0, g, a * g)
    tl.store(dx_ptr + offs, (s * dz + q * (x - mu) + r).to(dx_ptr.dtype.element_ty), mask=m)
    if HAS_RES:
        tl.store(dres_ptr + offs, dz.to(dres_ptr.dtype.element_ty), mask=m)


def _launch(rows: Tensor) -> tuple[int, int, int, int, dict]:
    """(row tiles, channel blocks, reduction programs per channel block, row tiles per reduction
    program, meta): a tile holds ``ELEMENTS_GPU`` elements on a GPU (up to ``CHANNELS_GPU``
    channels), as many as the interpreter's budget allows there."""
    R, C = rows.shape
    on_gpu = gpu_launch(rows)
    block_c = min(triton.next_power_of_2(C), CHANNELS_GPU if on_gpu else ELEMENTS_INTERPRETER)
    budget = ELEMENTS_GPU if on_gpu else ELEMENTS_INTERPRETER
    block_r = max(1, min(triton.next_power_of_2(R), budget // block_c))
    meta = {"BLOCK_R": block_r, "BLOCK_C": block_c}
    if on_gpu:
        meta["num_warps"] = WARPS_GPU
    tiles, channel_blocks = triton.cdiv(R, block_r), triton.cdiv(C, block_c)
    per_program = _tiles_per_program(tiles, channel_blocks, rows.device)
    return tiles, channel_blocks, triton.cdiv(tiles, per_program), per_program, meta


def _tiles_per_program(tiles: int, channel_blocks: int, device: torch.device) -> int:
    """Row tiles each reduction program sums: on a GPU about four programs per SM in all, so that
    the partial sums stay few; one program in the interpreter."""
    programs = 4 * multi_processor_count(device)
    if programs == 0:
        return tiles
    return triton.cdiv(tiles, max(1, programs // channel_blocks))


def _check(x: Tensor, vectors: dict[str, Tensor], residual: Tensor | None) -> None:
    if x.dim() != 2 or not x.is_contiguous() or x.dtype not in DTYPES:
        raise ValueError(
            f"x must be contiguous (R, C) rows in {DTYPES}, got shape {tuple(x.shape)}, "
            f"dtype {x.dtype}, strides {x.stride()}"
        )
    if x.shape[0] < 2:
        raise ValueError(
            f"x has shape {tuple(x.shape)}: BatchNorm's training statistics need more than one "
            "value per channel"
        )
    if residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous()
    ):
        raise ValueError(
            f"residual must be contiguous rows of x's shape {tuple(x.shape)} and dtype {x.dtype}, "
            f"got shape {tuple(residual.shape)}, dtype {residual.dtype}"
        )
    for name, v in vectors.items():
        if v.shape != (x.shape[1],) or v.dtype != torch.float32 or not v.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous float32 ({x.shape[1]},) vector (C of x), got shape "
                f"{tuple(v.shape)}, dtype {v.dtype}"
            )


@opaque_op(
    "lightnets::batch_norm_prelu_forward_triton", contract.FORWARD_SCHEMA, contract.forward_fake
)
def batch_norm_prelu_forward_triton(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    slope: Tensor,
    eps: float,
    residual: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, batch mean, 1/std, unbiased variance) of (R, C) rows: a statistics launch, then one
    writing y. The contract of ``lightnets_cpu::batch_norm_prelu_forward``.

    Shape:
        x (R, C), weight, bias, slope (C,) float32, residual (R, C) or None
        -> ((R, C), (C,), (C,), (C,))
    """
    _check(x, {"weight": weight, "bias": bias, "slope": slope}, residual)
    R, C = x.shape
    tiles, channel_blocks, programs, per_program, meta = _launch(x)
    part = torch.empty((programs, 2, C), dtype=torch.float32, device=x.device)
    _stats_kernel[(programs, channel_blocks)](x, part, R, C, per_program, **meta)
    shifted = part.double().sum(0)  # (2, C): sum d, sum d^2 with d = x - k
    k = x[0].double()
    sums = torch.stack((shifted[0] + R * k, shifted[1] + 2 * k * shifted[0] + R * k * k))
    mean, var, rstd, scale, shift = batch_statistics(sums, R, weight, bias, eps)
    y = torch.empty_like(x)
    has_res = residual is not None
    _fwd_kernel[(tiles, channel_blocks)](
        x, residual if has_res else x, scale, shift, slope, y, R, C, HAS_RES=has_res, **meta
    )
    return y, mean, rstd, var * (R / (R - 1))


@opaque_op(
    "lightnets::batch_norm_prelu_backward_triton", contract.BACKWARD_SCHEMA, contract.backward_fake
)
def batch_norm_prelu_backward_triton(
    grad_y: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    slope: Tensor,
    save_mean: Tensor,
    save_invstd: Tensor,
    residual: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(grad_x, grad_weight, grad_bias, grad_slope, grad_residual): a launch of per-chunk sums,
    then one writing grad_x (and grad_residual). The contract of
    ``lightnets_cpu::batch_norm_prelu_backward``.

    Shape:
        grad_y, x, residual (R, C), the rest (C,) float32
        -> ((R, C), (C,), (C,), (C,), (R, C) or (0,))
    """
    vectors = {"weight": weight, "bias": bias, "slope": slope, "save_mean": save_mean,
               "save_invstd": save_invstd}  # fmt: skip
    _check(x, vectors, residual)
    if grad_y.shape != x.shape or grad_y.dtype != x.dtype or not grad_y.is_contiguous():
        raise ValueError(
            f"grad_y must be contiguous rows of x's shape {tuple(x.shape)} and dtype {x.dtype}, "
            f"got shape {tuple(grad_y.shape)}, dtype {grad_y.dtype}"
        )
    R, C = x.shape
    scale = weight * save_invstd
    shift = bias - save_mean * scale
    tiles, channel_blocks, programs, per_program, meta = _launch(x)
    part = torch.empty((programs, 3, C), dtype=torch.float32, device=x.device)
    has_res = residual is not None
    res = residual if has_res else x  # not read without a residual
    _bwd_sums_kernel[(programs, channel_blocks)](
        x, res, grad_y, scale, shift, slope, save_mean, part, R, C, per_program,
        HAS_RES=has_res, **meta,
    )  # fmt: skip
    sum_dz, sum_dz_centred, grad_slope = part.sum(0)
    grad_weight, grad_bias, q, r = batch_norm_backward(
        sum_dz, sum_dz_centred, save_invstd, scale, R
    )
    grad_x = torch.empty_like(x)
    grad_res = torch.empty_like(x) if has_res else x.new_empty(0)
    _bwd_dx_kernel[(tiles, channel_blocks)](
        x, res, grad_y, scale, shift, slope, save_mean, q.contiguous(), r.contiguous(), grad_x,
        grad_res if has_res else grad_x, R, C, HAS_RES=has_res, **meta,
    )  # fmt: skip
    return grad_x, grad_weight, grad_bias.clone(), grad_slope, grad_res
