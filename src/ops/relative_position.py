"""Transformer-XL relative positional attention (Dai et al., 2019, Sec. 3.3), shared by its users.

The score between query i and key j is

    A_ij = (q_i + u) . k_j  +  (q_i + v) . r_{i-j}          (terms (a)+(c) and (b)+(d) of Eq. 3)

with two learned biases u = ``r_w_bias``, v = ``r_r_bias`` and a key r_{i-j} for the relative
distance. The distance keys are computed once for distances ``klen-1 ... 0`` and the second term is
realigned with :func:`rel_shift` (:mod:`src.kernels.relative_softmax`, whose CPU kernel also does
the
softmax; on the CPU the whole attention is one autograd node,
:mod:`src.kernels.relative_attention_cpu`). Queries are the ``qlen`` current positions, keys the
``mlen`` memory positions followed by the current ones; query i may see key j iff ``j <= mlen + i``.

Layouts are batch-first: queries (B, H, T, d_head), keys (B, H, K, d_head), scores (B, H, T, K).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels import (
    ATEN,
    OURS,
    Timer,
    autocast_dtype,
    candidate_steps,
    choose,
    declare,
    needs_backward,
    size_bucket,
)
from src.kernels.dropout import dropout
from src.kernels.relative_attention_cpu import fused_attention_applies, relative_attention_cpu
from src.kernels.relative_softmax import rel_shift, relative_softmax


def relative_sinusoid(
    klen: int,
    d_model: int,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """Sinusoids of the distances ``klen-1, ..., 0`` (row i encodes distance ``klen-1-i``).

    Row i is ``cat(sin(t * f), cos(t * f))`` (concatenated halves, not interleaved) with
    ``f_k = 10000^(-2k / d_model)``, as in Transformer-XL's ``PositionalEmbedding``.

    Shape:
        (klen, d_model)
    """
    if d_model % 2:
        raise ValueError(f"d_model must be even for sin/cos halves, got {d_model}")
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0, device=device) / d_model))
    distance = torch.arange(klen - 1, -1, -1.0, device=device)
    angle = torch.outer(distance, inv_freq)  # (klen, d_model / 2)
    return torch.cat([angle.sin(), angle.cos()], dim=-1).to(dtype or torch.get_default_dtype())


class RelativePositionTable(nn.Module):
    """A learnable table of relative-position vectors, initialised to :func:`relative_sinusoid`.

    Group-Transformer learns its positional vectors (``pos_emb.pos_enc``, one row per distance
    ``max_len-1 ... 0``); a segment with ``klen`` keys reads the last ``klen`` rows. ``max_len`` is
    the longest attention span (target plus memory length) the table can serve.

    Args:
        max_len: number of distances, ``tgt_len + mem_len`` in the paper's setting.
        d_model: width of each vector.

    Shape:
        forward(klen) -> (klen, d_model), distances ``klen-1 ... 0``
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        if max_len < 1:
            raise ValueError(f"max_len must be positive, got {max_len}")
        self.max_len = max_len
        self.d_model = d_model
        self.table = nn.Parameter(torch.empty(max_len, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.table.copy_(relative_sinusoid(self.max_len, self.d_model))

    def forward(self, klen: int) -> Tensor:
        if not 1 <= klen <= self.max_len:
            raise ValueError(f"klen must be in [1, {self.max_len}] (the table size), got {klen}")
        return self.table[self.max_len - klen :]

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


def causal_memory_mask(qlen: int, mlen: int, *, device: torch.device | None = None) -> Tensor:
    """``mask[i, j] = j > mlen + i``: True where query i must not see key j.

    Shape:
        (qlen, mlen + qlen), bool
    """
    query = torch.arange(qlen, device=device).unsqueeze(1)  # (T, 1)
    return torch.arange(mlen + qlen, device=device) > query + mlen


def relative_attention_scores(
    q: Tensor, k: Tensor, rk: Tensor, r_w_bias: Tensor, r_r_bias: Tensor
) -> Tensor:
    """Unscaled relative attention scores ``(q + r_w_bias) k^T + rel_shift((q + r_r_bias) rk^T)``.

    Args:
        q: queries of the current positions.
        k: content keys of the memory and current positions.
        rk: distance keys for distances ``K-1 ... 0``.
        r_w_bias: u, the content bias per head.
        r_r_bias: v, the position bias per head.

    Shape:
        q (B, H, T, d_head), k (B, H, K, d_head), rk (H, K, d_head), biases (H, d_head)
        -> (B, H, T, K)
    """
    content = torch.matmul(q + r_w_bias.unsqueeze(-2), k.transpose(-1, -2))  # (B, H, T, K)
    position = torch.matmul(q + r_r_bias.unsqueeze(-2), rk.transpose(-1, -2))  # (B, H, T, K)
    return content + rel_shift(position)


#: how :func:`relative_attention` computes: "eager" (scores, softmax and the value product as
#: separate PyTorch ops) or "sdpa" (``F.scaled_dot_product_attention`` with the position term as
#: an additive bias); "auto" resolves per call (:func:`attention_path`)
ATTENTION_PATHS = ("auto", "eager", "sdpa")


def relative_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rk: Tensor,
    r_w_bias: Tensor,
    r_r_bias: Tensor,
    *,
    mask: Tensor | None,
    dropatt: float = 0.0,
    training: bool = False,
    path: str = "eager",
    impl: str = "auto",
) -> Tensor:
    """Softmax attention over :func:`relative_attention_scores` scaled by ``1/sqrt(d_head)``.

    Args:
        q, k, rk, r_w_bias, r_r_bias: as in :func:`relative_attention_scores`.
        v: values of the memory and current positions.
        mask: True where a query must not see a key (e.g. :func:`causal_memory_mask`), or None.
        dropatt: dropout probability on the attention probabilities.
        training: apply ``dropatt``.
        path: "eager", "sdpa" or "auto" (see :data:`ATTENTION_PATHS`). "sdpa" gives the same map:
            only the position term and the mask are formed as a (B, H, T, K) tensor, and the
            content scores, softmax and dropout happen inside the fused kernel (on CUDA the
            memory-efficient one, which also differentiates the bias); its dropout draws other
            random numbers than ``F.dropout``.
        impl: the eager path's softmax (:func:`src.kernels.relative_softmax.relative_softmax`):
            "auto", "reference" (the eager ops) or "triton". On the CPU, "auto" runs the whole
            attention as one node with reused score buffers
            (:func:`src.kernels.relative_attention_cpu.relative_attention_cpu`; not with attention
            dropout in training).

    Shape:
        q (B, H, T, d_head), k and v (B, H, K, d_head), rk (H, K, d_head), biases (H, d_head),
        mask broadcastable to (B, H, T, K) -> (B, H, T, d_head)
    """
    if path == "auto":
        path = attention_path(q, k, v, rk, r_w_bias, r_r_bias, mask, dropatt, training)
    elif path not in ATTENTION_PATHS:
        raise ValueError(f"path must be one of {ATTENTION_PATHS}, got {path!r}")
    if path == "sdpa":
        return _sdpa_relative_attention(q, k, v, rk, r_w_bias, r_r_bias, mask, dropatt, training)
    scale = 1.0 / math.sqrt(q.shape[-1])
    query_w, query_r = q + r_w_bias.unsqueeze(-2), q + r_r_bias.unsqueeze(-2)
    if (
        impl == "auto"
        and fused_attention_applies(query_w, query_r, k, v, rk, mask, training and dropatt > 0)
        and _cpu_path(query_w, query_r, k, v, rk, mask, scale) == OURS
    ):
        return relative_attention_cpu(query_w, query_r, k, v, rk, mask, scale)
    return eager_relative_attention(
        query_w, query_r, k, v, rk, mask, scale, dropatt=dropatt, training=training, impl=impl
    )


# OURS: the one-node CPU attention; ATEN: the eager ops
CPU_CHOICE = declare("relative_attention", (OURS, ATEN), device="cpu")


def _cpu_path(
    query_w: Tensor, query_r: Tensor, k: Tensor, v: Tensor, rk: Tensor, mask, scale: float
) -> str:
    """The one-node CPU attention or the eager ops, measured per shape on this machine
    (:func:`~src.kernels.choose`); both give the same numbers. The node saves the page
    faults of fresh score-sized tensors, which glibc maps afresh only above its mmap threshold:
    2 x 8 x 512 x 1,024 float32 scores (32 MiB each) ran 1.6-2.0x faster, 1 x 8 x 512 x 1,024
    (16 MiB) 0.95-0.98x, on an AMD EPYC natively and as AVX2."""
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


def eager_relative_attention(
    query_w: Tensor,
    query_r: Tensor,
    k: Tensor,
    v: Tensor,
    rk: Tensor,
    mask: Tensor | None,
    scale: float,
    *,
    dropatt: float = 0.0,
    training: bool = False,
    impl: str = "auto",
) -> Tensor:
    """The eager path of :func:`relative_attention`: the two score products, the softmax
    (:func:`src.kernels.relative_softmax.relative_softmax` by ``impl``), dropout and the value
    product
    as separate ops. On the CPU, :func:`relative_attention` runs the same ops in one node
    (:func:`src.kernels.relative_attention_cpu.relative_attention_cpu`) when it can.

    Args:
        query_w: the queries plus the content bias (``q + r_w_bias``).
        query_r: the queries plus the position bias (``q + r_r_bias``).
        k, v, rk, mask, dropatt, training: as in :func:`relative_attention`.
        scale: the scores' scale, ``1/sqrt(d_head)``.
        impl: the softmax's path.

    Shape:
        query_w, query_r (B, H, T, d_head), k and v (B, H, K, d_head), rk (H, K, d_head),
        mask broadcastable to (B, H, T, K) -> (B, H, T, d_head)
    """
    content = torch.matmul(query_w, k.transpose(-1, -2))  # (B, H, T, K)
    position = torch.matmul(query_r, rk.transpose(-1, -2))  # (B, H, T, K)
    # 16-bit scores are normalised in float32 (autocast's rule on CUDA, made explicit so that
    # CPU bf16 runs do it too); on the CPU, one kernel pass each way
    prob = relative_softmax(content, position, mask, scale, impl=impl).to(v.dtype)
    prob = dropout(prob, p=dropatt, training=training)
    return torch.matmul(prob, v)


def _sdpa_relative_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rk: Tensor,
    r_w_bias: Tensor,
    r_r_bias: Tensor,
    mask: Tensor | None,
    dropatt: float,
    training: bool,
) -> Tensor:
    """:func:`relative_attention` through ``F.scaled_dot_product_attention``: the content term is
    the kernel's own ``(q + u) k^T``, the scaled, realigned position term (masked with -inf) its
    additive bias.

    Shape:
        as :func:`relative_attention`
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    position = torch.matmul(q + r_r_bias.unsqueeze(-2), rk.transpose(-1, -2))  # (B, H, T, K)
    bias = rel_shift(position).mul_(scale)
    if mask is not None:
        bias = bias.masked_fill_(mask, float("-inf"))
    query = q + r_w_bias.unsqueeze(-2)
    operands = (query, k, v, bias)
    if not torch.is_autocast_enabled(q.device.type):  # autocast casts them all to its dtype
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in operands))
        operands = tuple(t.to(dtype) for t in operands)
    query, k, v, bias = operands
    return F.scaled_dot_product_attention(
        query, k, v, attn_mask=bias, dropout_p=dropatt if training else 0.0, scale=scale
    )


CHOICE = declare("relative_attention", ("eager", "sdpa"))


def attention_path(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rk: Tensor,
    r_w_bias: Tensor,
    r_r_bias: Tensor,
    mask: Tensor | None,
    dropatt: float,
    training: bool,
    timer: Timer | None = None,
) -> str:
    """``path="auto"``: on CUDA, the faster of "eager" and "sdpa" for this shape and dtype, timed on
    the first call (forward and backward when autograd records, forward otherwise;
    :func:`~src.kernels.choose`) and kept; "eager" on the CPU (where PyTorch's fused attention
    with a float bias measured slower: 466 vs 337 ms forward+backward over
    2 x 512 queries, 512 memory, 8 heads of 32, on 2 cores) and while ``torch.compile`` traces.
    Deterministic mode takes "eager" (the memory-efficient kernel's bias gradient is not
    deterministic).

    Shape:
        as :func:`relative_attention`
    """
    if timer is None and (not q.is_cuda or torch.compiler.is_compiling()):
        return "eager"
    device = q.device.type
    autocast = autocast_dtype(device)
    grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, k, v, rk, r_w_bias, r_r_bias)
    )
    dropout = dropatt if training else 0.0
    key = (
        size_bucket(q.shape[0]), *q.shape[1:], k.shape[-2], q.dtype, autocast, grad,
        mask is not None, dropout > 0, str(q.device),
    )  # fmt: skip

    def run(path: str) -> None:
        inputs = [t.detach().requires_grad_(grad) for t in (q, k, v, rk, r_w_bias, r_r_bias)]
        # the timed dropout draws leave the training's random stream where it was
        cuda = [q.device] if q.is_cuda else []
        with torch.random.fork_rng(devices=cuda), torch.set_grad_enabled(grad):
            out = relative_attention(
                *inputs, mask=mask, dropatt=dropatt, training=training, path=path
            )
            if grad:
                torch.autograd.grad(out, inputs, torch.ones_like(out))

    def candidates() -> dict:
        return {path: functools.partial(run, path) for path in ("eager", "sdpa")}

    return choose(CHOICE, key, candidates, default="eager", reference="eager", timer=timer)
