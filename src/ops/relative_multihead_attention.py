"""Transformer-XL relative multi-head attention (Dai et al., 2019, Sec. 3.3; kimiyoung's
``RelPartialLearnableMultiHeadAttn``): full D -> D maps for queries, keys, values and the distance
keys, around :func:`src.ops.relative_position.relative_attention`. The Transformer-XL and the
Group-Transformer's ablations without group attention build their layers from it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.dropout import dropout
from src.ops.relative_position import RelativeAttentionSublayer


class RelativeMultiHeadAttention(RelativeAttentionSublayer):
    """Transformer-XL relative multi-head attention sublayer (kimiyoung's
    ``RelPartialLearnable...``).

    With ``c = cat(memory, h)`` (normalised first when ``pre_norm``): ``q = c_cur Wq``,
    ``k = c Wk``, ``v = c Wv``, distance keys ``rk = r Wr``; scores
    ``(q + u) k^T + shift((q + v) rk^T)`` scaled by ``1/sqrt(d_head)`` under a causal mask;
    ``o = attn Wo``. Post-norm: ``norm(h + dropout(o))``; pre-norm: ``h + dropout(o)``. Queries
    are computed for the current positions only (the official code also projects the memory rows
    and discards them; the result is the same).

    Args:
        d_model: D, divisible by ``n_head``; ``d_head = D / n_head``.
        n_head: H.
        dropout: dropout on the sublayer output.
        dropatt: dropout on the attention probabilities.
        pre_norm: normalise the sublayer input (memory included) instead of the residual sum.

    The attention's paths are the knobs ``attention`` and ``impl``
    (:class:`~src.ops.relative_position.RelativeAttentionSublayer`).

    Parameters: ``qkv_net`` (Linear D -> 3D, rows q, k, v), ``r_net``, ``o_net`` (Linear D -> D),
    all without bias, and ``norm`` (LayerNorm D): ``5D^2 + 2D``.

    Shape:
        h (B, T, D), r (M + T, D) distance vectors for ``M+T-1 ... 0``, r_w_bias and r_r_bias
        (H, d_head), memory (B, M, D) or None -> (B, T, D)
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        dropout: float = 0.0,
        dropatt: float = 0.0,
        pre_norm: bool = False,
    ) -> None:
        super().__init__()
        if n_head < 1 or d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.d_model = d_model
        self.n_head = n_head
        self.d_head = d_model // n_head
        self.dropout = dropout
        self.dropatt = dropatt
        self.pre_norm = pre_norm
        self.qkv_net = nn.Linear(d_model, 3 * d_model, bias=False)
        self.r_net = nn.Linear(d_model, d_model, bias=False)
        self.o_net = nn.Linear(d_model, d_model, bias=False)
        self.norm = nn.LayerNorm(d_model)

    def reset_parameters(self) -> None:
        for module in self.children():
            module.reset_parameters()

    def forward(
        self, h: Tensor, r: Tensor, r_w_bias: Tensor, r_r_bias: Tensor, memory: Tensor | None = None
    ) -> Tensor:
        batch, qlen, d_model = h.shape
        context = h if memory is None else torch.cat([memory, h], dim=1)  # (B, K, D)
        klen = context.shape[1]
        mlen = klen - qlen
        if r.shape != (klen, d_model):
            raise ValueError(
                f"r must be (mlen + qlen, d_model) = ({klen}, {d_model}), got {tuple(r.shape)}"
            )
        if self.pre_norm:
            context = self.norm(context)
        heads = (self.n_head, self.d_head)
        w_q, w_kv = self.qkv_net.weight.split([d_model, 2 * d_model])
        q = F.linear(context[:, mlen:], w_q)  # (B, T, D)
        q = q.view(batch, qlen, *heads).transpose(1, 2)  # (B, T, D) -> (B, H, T, d_head)
        kv = F.linear(context, w_kv)  # (B, K, 2D)
        # (B, K, 2D) -> (B, K, 2, H, d_head) -> (2, B, H, K, d_head)
        k, v = kv.view(batch, klen, 2, *heads).permute(2, 0, 3, 1, 4)
        rk = self.r_net(r).view(klen, *heads).transpose(0, 1)  # (K, D) -> (H, K, d_head)
        attended = self.attend(q, k, v, rk, r_w_bias, r_r_bias)  # (B, H, T, d_head), causal
        o = self.o_net(attended.transpose(1, 2).reshape(batch, qlen, d_model))  # (B, T, D)
        out = h + dropout(o, p=self.dropout, training=self.training)
        return out if self.pre_norm else self.norm(out)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_head={self.n_head}, dropout={self.dropout}, "
            f"dropatt={self.dropatt}, pre_norm={self.pre_norm}"
        )
