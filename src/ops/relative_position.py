"""Transformer-XL relative positional attention (Dai et al., 2019, Sec. 3.3), shared by its users.

The score between query i and key j is

    A_ij = (q_i + u) . k_j  +  (q_i + v) . r_{i-j}          (terms (a)+(c) and (b)+(d) of Eq. 3)

with two learned biases u = ``r_w_bias``, v = ``r_r_bias`` and a key r_{i-j} for the relative
distance. The distance keys are computed once for distances ``klen-1 ... 0`` and the second term is
realigned with :func:`rel_shift` (:mod:`src.kernels.relative_softmax`, whose kernels also do the
softmax). Queries are the ``qlen`` current positions, keys the ``mlen`` memory positions followed
by the current ones; query i may see key j iff ``j <= mlen + i``. :func:`relative_attention`
forms the biased queries; :mod:`src.kernels.relative_attention` holds the paths the attention
runs on (the eager ops, one autograd node on the CPU, PyTorch's fused attention) and their choice.

Layouts are batch-first: queries (B, H, T, d_head), keys (B, H, K, d_head), scores (B, H, T, K).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from src.kernels.relative_attention import attend
from src.kernels.relative_softmax import rel_shift


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
        path: "eager", "sdpa" or "auto" (:data:`src.kernels.relative_attention.ATTENTION_PATHS`;
            on CUDA "auto" times PyTorch's fused attention against the eager ops):
            :func:`src.kernels.relative_attention.attend`.
        impl: the eager path's softmax (:func:`src.kernels.relative_softmax.relative_softmax`):
            "auto", "reference" (the eager ops) or "triton". On the CPU, "auto" runs the whole
            attention as one node where it applies and measured faster
            (:func:`src.kernels.relative_attention.one_node_cpu.relative_attention_cpu`).

    Shape:
        q (B, H, T, d_head), k and v (B, H, K, d_head), rk (H, K, d_head), biases (H, d_head),
        mask broadcastable to (B, H, T, K) -> (B, H, T, d_head)
    """
    query_w = q + r_w_bias.unsqueeze(-2)  # q_i + u, against the content keys k_j
    query_r = q + r_r_bias.unsqueeze(-2)  # q_i + v, against the distance keys r_{i-j}
    scale = 1.0 / math.sqrt(q.shape[-1])
    # softmax(mask((query_w k^T + rel_shift(query_r rk^T)) * scale)) v, on the path chosen for
    # these operands
    return attend(
        query_w, query_r, k, v, rk, mask, scale,
        dropatt=dropatt, training=training, path=path, impl=impl,
    )  # fmt: skip


class RelativeAttentionSublayer(nn.Module):
    """What Transformer-XL's and Group-Transformer's attention sublayers share: the paths of
    :func:`relative_attention` as knobs a model sets on them, and the attention of their projected
    heads (:meth:`attend`). A subclass sets ``dropatt``.
    """

    #: :func:`relative_attention`'s path: "auto" (on CUDA the measured faster of PyTorch's fused
    #: attention and the eager ops; eager on the CPU), "eager" or "sdpa"
    attention: str = "auto"
    #: the eager attention's softmax (:func:`src.kernels.relative_softmax.relative_softmax`): "auto"
    #: (the CPU kernel; on CUDA the measured faster of the Triton kernel and the eager ops),
    #: "reference" or "triton"
    impl: str = "auto"
    dropatt: float

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, rk: Tensor, r_w_bias: Tensor, r_r_bias: Tensor
    ) -> Tensor:
        """:func:`relative_attention` under a causal mask over the memory (K - T positions) and
        the current segment, dropping the probabilities out with ``dropatt`` in training.

        Shape:
            q (B, H, T, d_head), k and v (B, H, K, d_head), rk (H, K, d_head), biases (H, d_head)
            -> (B, H, T, d_head)
        """
        qlen, klen = q.shape[-2], k.shape[-2]
        return relative_attention(
            q, k, v, rk, r_w_bias, r_r_bias,
            mask=causal_memory_mask(qlen, klen - qlen, device=q.device),
            dropatt=self.dropatt, training=self.training, path=self.attention, impl=self.impl,
        )  # fmt: skip
