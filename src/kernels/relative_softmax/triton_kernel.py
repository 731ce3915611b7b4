"""The relative-attention softmax (:mod:`src.kernels.relative_softmax`) in one launch forward and
one backward: a program per query row of one head reads the content scores and, through the
realignment's indexing, the position scores, and writes the probabilities; backward, it reads the
output gradient and the probabilities and writes the content gradient and the position gradient
(the realignment's exact adjoint, as scattered stores that never collide).

For query i of T and key j of K, with v = K - T + i + 1, the realigned position score of row
``r = n T + i`` (flat offsets of the (N, T, K) position tensor) is

    j < v:  position[r K + j + T - 1 - i]    j = v:  0    j > v:  position[r K + j + T - 2 - i]

(the last from row i + 1: Transformer-XL's zero-pad-and-reshape). Scores are rounded as the eager
ops round them (the add, then the scale), the softmax is float32, the probabilities are stored in
the scores' dtype. Deterministic: no atomics, no reduction across programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.custom_ops import autograd_op
from src.kernels.dispatch import autocast_off, opaque_op
from src.kernels.relative_softmax import contract as contract
from src.kernels.triton.launch import gpu_launch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: the longest key row one program holds (in registers on a GPU); longer rows take the eager ops
MAX_KEYS = 8192
#: keys of a row per GPU thread, read at every launch: the warps of a program are
#: block / (32 x this), 1 to 16
ELEMENTS_PER_THREAD = 8


def _warps(block: int) -> int:
    """Warps for a row of ``block`` keys: about ``ELEMENTS_PER_THREAD`` per thread, 1 to 16."""
    return max(1, min(16, block // (32 * ELEMENTS_PER_THREAD)))


@triton.jit
def _row(T, K, BLOCK: tl.constexpr):
    """This program's query row r = n T + i of K keys: (i, key indices j, j < K, r K, the flat
    position offsets its realigned scores are read from, and which of them exist)."""
    row = tl.program_id(0).to(tl.int64)
    i = row % T
    j = tl.arange(0, BLOCK)
    inside = j < K
    visible_keys = K - T + i + 1
    base = row * K
    # this row from column T - 1 - i, then the pad (no source), then row i + 1 from column 0
    realigned = base + j + T - 1 - i - (j > visible_keys).to(tl.int64)
    return i, j, inside, base, realigned, inside & (j != visible_keys)


@triton.jit
def _relative_softmax_fwd_kernel(
    content_ptr, position_ptr, mask_ptr, prob_ptr,
    T, K, scale,
    HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    i, j, inside, base, realigned, from_position = _row(T, K, BLOCK)
    c = tl.load(content_ptr + base + j, mask=inside, other=0.0)
    p = tl.load(position_ptr + realigned, mask=from_position, other=0.0)
    # the eager ops' roundings: the add and the scale, each to the scores' dtype
    s = (c.to(tl.float32) + p.to(tl.float32)).to(c.dtype).to(tl.float32)
    s = (s * scale).to(c.dtype).to(tl.float32)
    if HAS_MASK:
        masked = tl.load(mask_ptr + i * K + j, mask=inside, other=1).to(tl.int1)
        s = tl.where(masked, float("-inf"), s)
    s = tl.where(inside, s, float("-inf"))
    top = tl.max(s, axis=0)
    e = tl.exp(s - top)  # a row masked entirely gives NaN, as the eager softmax
    e = tl.where(inside, e, 0.0)
    prob = e / tl.sum(e, axis=0)
    tl.store(prob_ptr + base + j, prob.to(prob_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _relative_softmax_bwd_kernel(
    grad_ptr, prob_ptr, mask_ptr, grad_content_ptr, grad_position_ptr,
    T, K, scale,
    HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    i, j, inside, base, realigned, from_position = _row(T, K, BLOCK)
    g = tl.load(grad_ptr + base + j, mask=inside, other=0.0).to(tl.float32)
    p = tl.load(prob_ptr + base + j, mask=inside, other=0.0).to(tl.float32)
    dot = tl.sum(g * p, axis=0)
    gs = p * (g - dot) * scale
    if HAS_MASK:
        masked = tl.load(mask_ptr + i * K + j, mask=inside, other=1).to(tl.int1)
        gs = tl.where(masked, 0.0, gs)
    gs = gs.to(grad_content_ptr.dtype.element_ty)
    tl.store(grad_content_ptr + base + j, gs, mask=inside)
    # the adjoint: each realigned entry back where it was read from (the pad's entry nowhere)
    tl.store(grad_position_ptr + realigned, gs, mask=from_position)
    # position row 0 of each head, columns < T - 1, feeds no entry
    tl.store(grad_position_ptr + base + j, tl.zeros_like(gs), mask=(i == 0) & (j < T - 1))


def _meta(keys: int, on_gpu: bool, has_mask: bool) -> dict:
    block = triton.next_power_of_2(keys)
    meta = {"HAS_MASK": has_mask, "BLOCK": block}
    if on_gpu:
        meta["num_warps"] = _warps(block)
    return meta


@opaque_op(
    "lightnets::relative_softmax_triton_backward",
    contract.BACKWARD_SCHEMA,
    contract.score_grads_like,
)
def relative_softmax_backward(
    grad_prob: Tensor, prob: Tensor, mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """(grad_content, grad_position), one launch.

    Shape:
        grad_prob, prob (N, T, K) contiguous, mask (T, K) -> ((N, T, K), (N, T, K))
    """
    rows, qlen, klen = prob.shape
    grad_content = torch.empty_like(prob)
    grad_position = torch.empty_like(prob)
    _relative_softmax_bwd_kernel[(rows * qlen,)](
        grad_prob, prob, mask if mask is not None else prob, grad_content, grad_position,
        qlen, klen, scale, **_meta(klen, gpu_launch(prob), mask is not None),
    )  # fmt: skip
    return grad_content, grad_position


def _relative_softmax_grads(ctx, grad_prob: Tensor) -> tuple[Tensor | None, ...]:
    prob, mask = ctx.saved_tensors
    with autocast_off(prob.device.type):
        grad_content, grad_position = relative_softmax_backward(
            grad_prob.to(prob.dtype).contiguous(), prob, mask, ctx.scale
        )
    return grad_content, grad_position, None, None


@autograd_op(
    "lightnets::relative_softmax_triton_forward",
    contract.FORWARD_SCHEMA,
    contract.probabilities_like,
    setup_context=contract.keep_for_backward,
    backward=_relative_softmax_grads,
)
def relative_softmax_forward(
    content: Tensor, position: Tensor, mask: Tensor | None, scale: float
) -> Tensor:
    """The probabilities, one launch; differentiable (the backward kernel's rule).

    Shape:
        content, position (N, T, K) contiguous, mask (T, K) bool contiguous -> (N, T, K)
    """
    rows, qlen, klen = content.shape
    prob = torch.empty_like(content)
    _relative_softmax_fwd_kernel[(rows * qlen,)](
        content, position, mask if mask is not None else content, prob,
        qlen, klen, scale, **_meta(klen, gpu_launch(content), mask is not None),
    )  # fmt: skip
    return prob


def relative_softmax_triton(
    content: Tensor, position: Tensor, mask: Tensor | None, scale: float
) -> Tensor:
    """The fused softmax; the contract of :func:`src.kernels.relative_softmax.relative_softmax` for
    the operands :func:`covers` accepts.

    Shape:
        content, position (B, H, T, K), mask (T, K) or None -> (B, H, T, K)
    """
    if not covers(content, position, mask):
        raise TypeError(
            "the fused relative softmax takes 4-D content and position scores of one shape and "
            f"dtype in {DTYPES}, K >= T >= 1 and K <= {MAX_KEYS}, and a (T, K) bool mask or none; "
            f"got {content.dtype} {tuple(content.shape)}, {position.dtype} "
            f"{tuple(position.shape)}, mask "
            f"{None if mask is None else (mask.dtype, tuple(mask.shape))}"
        )
    shape = content.shape
    rows = (contract.score_rows(t) for t in (content, position))
    mask = None if mask is None else mask.contiguous()
    with autocast_off(content.device.type):
        prob = relative_softmax_forward(*rows, mask, float(scale))
    return prob.view(shape)


def covers(content: Tensor, position: Tensor, mask: Tensor | None) -> bool:
    """Whether the kernel computes these operands (else the eager ops do)."""
    if content.dim() != 4 or position.shape != content.shape or position.dtype != content.dtype:
        return False
    qlen, klen = content.shape[-2:]
    if content.dtype not in DTYPES or not 1 <= qlen <= klen <= MAX_KEYS or content.numel() == 0:
        return False
    return mask is None or (mask.dtype == torch.bool and mask.shape == (qlen, klen))
