"""Relative-position attention on the CPU as one autograd node whose score-sized temporaries are
reused from call to call (Transformer-XL, Group-Transformer).

Eagerly, a training step of the attention allocates about six (B, H, T, K) tensors: the content and
the position scores, the probabilities, and backward the probabilities' gradient and the two score
gradients. At the enwik8 sizes each is 32 MiB in float32, which glibc maps afresh and the kernel
page-faults in on every call (:mod:`src.kernels.cpu.scratch`): with the one-pass softmax kernels
(:mod:`src.kernels.relative_softmax`) that was about a third of a CPU training step. Here the score
products are written into scratch buffers, the softmax kernels read and write those buffers, and
the backward forms the five operand gradients with explicit batched products; only the
probabilities, kept for backward, are a fresh tensor (none under ``no_grad``). The values are
those of the eager ops with the softmax kernel: the same products in the same dtype, the same
kernel, the same reduction of the distance keys' gradient over the sequences: bit for bit the
eager ops' results.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.cpu.scratch import scratch
from src.kernels.dispatch import autocast_off, autocast_operands
from src.kernels.relative_softmax import KERNEL_DTYPES


def fused_attention_applies(
    query_w: Tensor, query_r: Tensor, k: Tensor, v: Tensor, rk: Tensor, mask: Tensor | None,
    dropout: bool,
) -> bool:  # fmt: skip
    """Whether :func:`relative_attention_cpu` computes this call: CPU tensors in eager mode, no
    attention dropout, (B, H, T, d) queries against (B, H, K, d) keys and values and (H, K, d)
    distance keys with K >= T >= 1, a (T, K) bool mask or none, one kernel dtype after autocast,
    and the kernels built.

    Shape:
        as :func:`relative_attention_cpu`
    """
    operands = (query_w, query_r, k, v, rk)
    if dropout or torch.compiler.is_compiling() or any(not t.is_cpu for t in operands):
        return False
    if query_w.dim() != 4 or query_r.shape != query_w.shape or k.dim() != 4 or rk.dim() != 3:
        return False
    batch, heads, qlen, d_head = query_w.shape
    klen = k.shape[-2]
    if (
        k.shape != (batch, heads, klen, d_head)
        or v.shape != k.shape
        or rk.shape != (heads, klen, d_head)
    ):
        return False
    if min(batch, heads, qlen, d_head) < 1 or klen < qlen:
        return False
    if mask is not None and (mask.dtype != torch.bool or mask.shape != (qlen, klen)):
        return False
    if torch.is_autocast_enabled("cpu"):
        dtypes = {torch.get_autocast_dtype("cpu")}
    else:
        dtypes = {t.dtype for t in operands}
    return len(dtypes) == 1 and dtypes.pop() in KERNEL_DTYPES and cpu_kernels_loaded()


def relative_attention_cpu(
    query_w: Tensor, query_r: Tensor, k: Tensor, v: Tensor, rk: Tensor, mask: Tensor | None,
    scale: float,
) -> Tensor:  # fmt: skip
    """``softmax(mask(-inf, (query_w k^T + rel_shift(query_r rk^T)) * scale)) v``, one
    autograd node.

    Under CPU autocast the five operands are cast to its dtype, as its matmuls would cast them.
    Check :func:`fused_attention_applies` first.

    Args:
        query_w: the queries plus the content bias (``q + r_w_bias``).
        query_r: the queries plus the position bias (``q + r_r_bias``).
        k, v: content keys and values of the memory and current positions.
        rk: distance keys for distances ``K-1 ... 0``.
        mask: True where a query must not see a key, or None.
        scale: the scores' scale, ``1/sqrt(d_head)``.

    Shape:
        query_w, query_r (B, H, T, d), k and v (B, H, K, d), rk (H, K, d), mask (T, K)
        -> (B, H, T, d)
    """
    operands = autocast_operands("cpu", query_w, query_r, k, v, rk)
    with autocast_off("cpu"):
        return RelativeAttentionCpuFunction.apply(*operands, mask, scale)


class RelativeAttentionCpuFunction(torch.autograd.Function):
    """:func:`relative_attention_cpu`'s node: forward the two score products into scratch, the
    softmax kernel, the value product; backward the value product's adjoints, the softmax kernel's
    backward into scratch, and the score products' adjoints."""

    @staticmethod
    def forward(
        ctx, query_w: Tensor, query_r: Tensor, k: Tensor, v: Tensor, rk: Tensor,
        mask: Tensor | None, scale: float,
    ) -> Tensor:  # type: ignore[override]  # fmt: skip
        batch, heads, qlen, d_head = query_w.shape
        klen = k.shape[-2]
        rows = (batch * heads, qlen, klen)
        # (B, H, n, d) -> (B H, n, d); a copy only where a view cannot merge B and H (k and v are
        # views into the key-value projection)
        query_w, query_r, k, v, rk = (t.contiguous() for t in (query_w, query_r, k, v, rk))
        dtype = query_w.dtype
        content = torch.bmm(
            query_w.view(-1, qlen, d_head), k.view(-1, klen, d_head).mT,
            out=scratch("scores", rows, dtype),
        )  # fmt: skip
        position = scratch("position", (batch, heads, qlen, klen), dtype)
        for b in range(batch):  # (H, T, d) x (H, d, K): the distance keys serve every sequence
            torch.bmm(query_r[b], rk.mT, out=position[b])
        grad = any(ctx.needs_input_grad[:5])
        # the probabilities outlive the call when kept for backward
        prob = torch.empty(rows, dtype=dtype) if grad else scratch("prob", rows, dtype)
        mask = None if mask is None else mask.contiguous()
        torch.ops.lightnets_cpu.relative_softmax_forward_out(
            content, position.view(rows), mask, scale, prob
        )
        out = torch.bmm(prob, v.view(-1, klen, d_head))  # (B H, T, d)
        if grad:
            ctx.save_for_backward(query_w, query_r, k, v, rk, prob, mask)
            ctx.scale = scale
        return out.view(batch, heads, qlen, d_head)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        query_w, query_r, k, v, rk, prob, mask = ctx.saved_tensors
        batch, heads, qlen, d_head = query_w.shape
        klen = k.shape[-2]
        rows = (batch * heads, qlen, klen)
        dtype = prob.dtype
        needs = ctx.needs_input_grad
        grad_out = grad_out.to(dtype).contiguous().view(-1, qlen, d_head)  # (B H, T, d)
        k_rows, v_rows = k.view(-1, klen, d_head), v.view(-1, klen, d_head)
        grad_v = torch.bmm(prob.mT, grad_out).view(v.shape) if needs[3] else None
        grad_prob = torch.bmm(grad_out, v_rows.mT, out=scratch("scores", rows, dtype))
        grad_content = scratch("position", rows, dtype)
        grad_position = scratch("grad_position", (batch, heads, qlen, klen), dtype)
        torch.ops.lightnets_cpu.relative_softmax_backward_out(
            grad_prob, prob, mask, ctx.scale, grad_content, grad_position.view(rows)
        )
        grad_query_w = grad_k = grad_query_r = grad_rk = None
        if needs[0]:
            grad_query_w = torch.bmm(grad_content, k_rows).view(query_w.shape)
        if needs[2]:
            grad_k = torch.bmm(grad_content.mT, query_w.view(-1, qlen, d_head)).view(k.shape)
        if needs[1]:
            grad_query_r = torch.empty_like(query_r)
            for b in range(batch):
                torch.bmm(grad_position[b], rk, out=grad_query_r[b])
        if needs[4]:
            # the distance keys serve every sequence: per sequence (H, K, T) x (H, T, d), rounded
            # to the dtype, then summed, as autograd reduces the broadcast operand's gradient
            per_sequence = torch.empty((batch, *rk.shape), dtype=dtype)
            for b in range(batch):
                torch.bmm(grad_position[b].mT, query_r[b], out=per_sequence[b])
            grad_rk = per_sequence.sum(0)
        return grad_query_w, grad_query_r, grad_k, grad_v, grad_rk, None, None
