"""Relative-position attention over the biased queries (Transformer-XL, Group-Transformer): its
paths and their choice.

:func:`src.ops.relative_position.relative_attention` is the concept: it forms the content queries
``q + u`` and the position queries ``q + v`` and asks :func:`attend` for

    softmax(mask(-inf, (query_w k^T + rel_shift(query_r rk^T)) * scale)) v

on one of three paths:

- the eager ops (:func:`eager_relative_attention`, the reference): the two score products, the
  relative softmax (:func:`src.kernels.relative_softmax.relative_softmax`), dropout and the value
  product;
- on the CPU, the same ops as one autograd node with reused score buffers
  (:func:`.one_node_cpu.relative_attention_cpu`) where it applies, when it measured faster for the
  shape (:func:`cpu_path`);
- ``F.scaled_dot_product_attention`` with the position term as an additive bias
  (:func:`sdpa_relative_attention`), which ``path="auto"`` times against the eager ops on CUDA
  (:func:`attention_path`).

Layouts are batch-first: queries (B, H, T, d_head), keys (B, H, K, d_head), scores (B, H, T, K).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from src.kernels import ATEN, OURS, autocast_dtype, choose, declare, size_bucket
from src.kernels.dropout import dropout
from src.kernels.relative_attention.one_node_cpu import (
    fused_attention_applies,
    relative_attention_cpu,
)
from src.kernels.relative_softmax import rel_shift, relative_softmax
from src.kernels.timing import Timer, candidate_steps, needs_backward

#: how :func:`attend` computes: "eager" (scores, softmax and the value product as separate PyTorch
#: ops) or "sdpa" (``F.scaled_dot_product_attention`` with the position term as an additive bias);
#: "auto" resolves per call (:func:`attention_path`)
ATTENTION_PATHS = ("auto", "eager", "sdpa")


def attend(
    query_w: Tensor, query_r: Tensor, k: Tensor, v: Tensor, rk: Tensor, mask: Tensor | None,
    scale: float, *, dropatt: float = 0.0, training: bool = False, path: str = "eager",
    impl: str = "auto",
) -> Tensor:  # fmt: skip
    """``softmax(mask(-inf, (query_w k^T + rel_shift(query_r rk^T)) * scale)) v``, dropped out
    with probability ``dropatt`` in training, on the path ``path`` and ``impl`` choose.

    Args:
        query_w, query_r, k, v, rk, mask, scale: as in
            :func:`.one_node_cpu.relative_attention_cpu` (the queries plus
            the content bias u and the position bias v, the keys, values and distance keys, the
            mask and ``1/sqrt(d_head)``).
        dropatt: dropout probability on the attention probabilities.
        training: apply ``dropatt``.
        path: "eager", "sdpa" or "auto" (see :data:`ATTENTION_PATHS`). "sdpa" gives the same map:
            only the position term and the mask are formed as a (B, H, T, K) tensor, and the
            content scores, softmax and dropout happen inside the fused kernel (on CUDA the
            memory-efficient one, which also differentiates the bias); its dropout draws other
            random numbers than ``F.dropout``.
        impl: the eager path's softmax (:func:`src.kernels.relative_softmax.relative_softmax`):
            "auto", "reference" (the eager ops) or "triton". On the CPU, "auto" runs the whole
            attention as one node where it applies and measured faster (:func:`cpu_path`; not
            with attention dropout in training).

    Shape:
        query_w, query_r (B, H, T, d_head), k and v (B, H, K, d_head), rk (H, K, d_head),
        mask broadcastable to (B, H, T, K) -> (B, H, T, d_head)
    """
    operands = (query_w, query_r, k, v, rk, mask, scale)
    if path == "auto":
        path = attention_path(*operands, dropatt, training)
    elif path not in ATTENTION_PATHS:
        raise ValueError(f"path must be one of {ATTENTION_PATHS}, got {path!r}")
    if path == "sdpa":
        return sdpa_relative_attention(*operands, dropatt, training)
    if (
        impl == "auto"
        and fused_attention_applies(query_w, query_r, k, v, rk, mask, training and dropatt > 0)
        and cpu_path(*operands) == OURS
    ):
        return relative_attention_cpu(*operands)
    return eager_relative_attention(*operands, dropatt=dropatt, training=training, impl=impl)


def eager_relative_attention(
    query_w: Tensor, query_r: Tensor, k: Tensor, v: Tensor, rk: Tensor, mask: Tensor | None,
    scale: float, *, dropatt: float = 0.0, training: bool = False, impl: str = "auto",
) -> Tensor:  # fmt: skip
    """The eager path of :func:`attend`: the two score products, the softmax
    (:func:`src.kernels.relative_softmax.relative_softmax` by ``impl``), dropout and the value
    product as separate ops. On the CPU, :func:`attend` runs the same ops in one node
    (:func:`src.kernels.relative_attention.one_node_cpu.relative_attention_cpu`) when it can.

    Shape:
        as :func:`attend`
    """
    content = torch.matmul(query_w, k.transpose(-1, -2))  # (B, H, T, K)
    position = torch.matmul(query_r, rk.transpose(-1, -2))  # (B, H, T, K)
    # 16-bit scores are normalised in float32 (autocast's rule on CUDA, made explicit so that
    # CPU bf16 runs do it too); on the CPU, one kernel pass each way
    prob = relative_softmax(content, position, mask, scale, impl=impl).to(v.dtype)
    prob = dropout(prob, p=dropatt, training=training)
    return torch.matmul(prob, v)


# OURS: the one-node CPU attention; ATEN: the eager ops
CPU_CHOICE = declare("relative_attention", (OURS, ATEN), device="cpu")


def cpu_path(
    query_w: Tensor, query_r: Tensor, k: Tensor, v: Tensor, rk: Tensor, mask: Tensor | None,
    scale: float,
) -> str:  # fmt: skip
    """The one-node CPU attention or the eager ops, measured per shape on this machine
    (:func:`~src.kernels.choose`); both give the same numbers. The node saves the page
    faults of fresh score-sized tensors, which glibc maps afresh only above its mmap threshold:
    2 x 8 x 512 x 1,024 float32 scores (32 MiB each) ran 1.6-2.0x faster, 1 x 8 x 512 x 1,024
    (16 MiB) 0.95-0.98x, on an AMD EPYC natively and as AVX2.

    Shape:
        as :func:`attend`
    """
    autocast = autocast_dtype("cpu")
    operands = (query_w, query_r, k, v, rk)
    key = (
        size_bucket(query_w.shape[0]), *query_w.shape[1:3], k.shape[-2], query_w.shape[-1],
        query_w.dtype, autocast, needs_backward(*operands), mask is not None,
    )  # fmt: skip

    def run(path: str, *operands: Tensor) -> Tensor:
        attention = relative_attention_cpu if path == OURS else eager_relative_attention
        return attention(*operands, mask, scale)

    def candidates() -> dict:
        return candidate_steps(run, (OURS, ATEN), *operands)

    return choose(CPU_CHOICE, key, candidates, default=OURS, reference=ATEN, device="cpu")


def sdpa_relative_attention(
    query_w: Tensor, query_r: Tensor, k: Tensor, v: Tensor, rk: Tensor, mask: Tensor | None,
    scale: float, dropatt: float, training: bool,
) -> Tensor:  # fmt: skip
    """:func:`attend` through ``F.scaled_dot_product_attention``: the content term is the
    kernel's own ``query_w k^T``, the scaled, realigned position term (masked with -inf) its
    additive bias.

    Shape:
        as :func:`attend`
    """
    position = torch.matmul(query_r, rk.transpose(-1, -2))  # (B, H, T, K)
    bias = rel_shift(position).mul_(scale)
    if mask is not None:
        bias = bias.masked_fill_(mask, float("-inf"))
    operands = (query_w, k, v, bias)
    if not torch.is_autocast_enabled(query_w.device.type):  # autocast casts them all to its dtype
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in operands))
        operands = tuple(t.to(dtype) for t in operands)
    query, k, v, bias = operands
    return F.scaled_dot_product_attention(
        query, k, v, attn_mask=bias, dropout_p=dropatt if training else 0.0, scale=scale
    )


CHOICE = declare("relative_attention", ("eager", "sdpa"))


def attention_path(
    query_w: Tensor, query_r: Tensor, k: Tensor, v: Tensor, rk: Tensor, mask: Tensor | None,
    scale: float, dropatt: float, training: bool, timer: Timer | None = None,
) -> str:  # fmt: skip
    """``path="auto"``: on CUDA, the faster of "eager" and "sdpa" for this shape and dtype, timed on
    the first call (forward and backward when autograd records, forward otherwise;
    :func:`~src.kernels.choose`) and kept; "eager" on the CPU (where PyTorch's fused attention
    with a float bias measured slower: 466 vs 337 ms forward+backward over
    2 x 512 queries, 512 memory, 8 heads of 32, on 2 cores) and while ``torch.compile`` traces.
    Deterministic mode takes "eager" (the memory-efficient kernel's bias gradient is not
    deterministic).

    Shape:
        as :func:`attend`
    """
    if timer is None and (not query_w.is_cuda or torch.compiler.is_compiling()):
        return "eager"
    operands = (query_w, query_r, k, v, rk)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in operands)
    key = (
        size_bucket(query_w.shape[0]), *query_w.shape[1:], k.shape[-2], query_w.dtype,
        autocast_dtype(query_w.device.type), grad, mask is not None, training and dropatt > 0,
        str(query_w.device),
    )  # fmt: skip

    def run(path: str) -> None:
        inputs = [t.detach().requires_grad_(grad) for t in operands]
        # the timed dropout draws leave the training's random stream where it was
        cuda = [query_w.device] if query_w.is_cuda else []
        with torch.random.fork_rng(devices=cuda), torch.set_grad_enabled(grad):
            out = attend(*inputs, mask, scale, dropatt=dropatt, training=training, path=path)
            if grad:
                torch.autograd.grad(out, inputs, torch.ones_like(out))

    def candidates() -> dict:
        return {path: functools.partial(run, path) for path in ("eager", "sdpa")}

    return choose(CHOICE, key, candidates, default="eager", reference="eager", timer=timer)
