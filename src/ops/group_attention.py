"""Group attention (Park et al., 2020, Sec. 3.2): Transformer-XL attention with group maps.

The residual stream of width D is split into G contiguous groups of ``D_g = D / G`` features, and
group g owns heads ``g*H/G ... (g+1)*H/G - 1``. The query and the output of each group are
computed by a per-group (intra-group) map plus one inter-group map of the whole input that is
shared by every group (Eqs. 1 and 2); keys and values keep full D -> D maps over the memory and
the current segment; the distance keys come from a grouped map of the relative-position vectors.
The layer is pre-norm: the query reads the per-group norm of the current segment, the keys and
values a full-width norm of memory plus current segment (the official code normalises them
differently), and the output is added to the un-normalised input.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from src.kernels.dropout import dropout
from src.kernels.linear import linear
from src.ops.group_linear import GroupLinear
from src.ops.per_group_layer_norm import PerGroupLayerNorm
from src.ops.relative_position import RelativeAttentionSublayer


class GroupAttention(RelativeAttentionSublayer):
    """One pre-norm group-attention sublayer with Transformer-XL memory and relative positions.

    ``out = h + dropout(o)`` where, with ``a = norm_g(h)`` and ``c = norm(cat(memory, h))``,

    - query of group g: ``q_g = a_g Wq_g + a Wq_inter`` (Eq. 1),
    - keys and values: ``k = c Wk``, ``v = c Wv``; distance keys ``rk = grouped(r)``,
    - relative attention with the shared biases ``r_w_bias``/``r_r_bias`` and a causal mask,
    - output of group g: ``o_g = ov_g Wo_g + ov Wo_inter`` (Eq. 2).

    Args:
        d_model: D, the residual width, divisible by ``n_head`` and ``groups``.
        n_head: H, divisible by ``groups``; ``d_head = d_model / n_head``.
        groups: G, the number of feature groups.
        dropout: dropout on the sublayer output before the residual sum.
        dropatt: dropout on the attention probabilities.
        inter_group: keep the inter-group query and output maps; False is the paper's ablation
            without inter-group operations in the attention (intra-group maps only).

    The attention's paths are the knobs ``attention`` and ``impl``
    (:class:`~src.ops.relative_position.RelativeAttentionSublayer`), ``impl`` also the inter-group
    maps'.

    Parameters: ``q_norm`` (per-group norm), ``kv_norm`` (full-width norm), ``q_net``, ``r_net``,
    ``o_net`` (GroupLinear D -> D, no bias), ``inter_q_net``, ``inter_o_net`` (Linear D -> D/G, no
    bias), ``kv_net`` (Linear D -> 2D, no bias: keys then values). Weights ``2D^2 + 5D^2/G`` plus
    ``4D`` norm parameters (``2D^2 + 3D^2/G + 4D`` without inter-group maps).

    Shape:
        h (B, T, D), r (M + T, D) relative-position vectors for distances ``M+T-1 ... 0``,
        r_w_bias and r_r_bias (H, d_head), memory (B, M, D) or None -> (B, T, D)
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        groups: int,
        *,
        dropout: float = 0.0,
        dropatt: float = 0.0,
        inter_group: bool = True,
    ) -> None:
        super().__init__()
        if n_head < 1 or groups < 1 or d_model % n_head or n_head % groups:
            raise ValueError(
                f"need d_model ({d_model}) divisible by n_head ({n_head}), and n_head ({n_head}) "
                f"divisible by groups ({groups})"
            )
        self.d_model = d_model
        self.n_head = n_head
        self.groups = groups
        self.d_head = d_model // n_head
        self.d_group = d_model // groups
        self.dropout = dropout
        self.dropatt = dropatt
        self.inter_group = inter_group
        self.q_norm = PerGroupLayerNorm(d_model, groups)
        self.kv_norm = PerGroupLayerNorm(d_model, 1)
        self.q_net = GroupLinear(d_model, d_model, groups, bias=False)
        self.kv_net = nn.Linear(d_model, 2 * d_model, bias=False)
        self.r_net = GroupLinear(d_model, d_model, groups, bias=False)
        self.o_net = GroupLinear(d_model, d_model, groups, bias=False)
        self.inter_q_net = nn.Linear(d_model, self.d_group, bias=False) if inter_group else None
        self.inter_o_net = nn.Linear(d_model, self.d_group, bias=False) if inter_group else None

    def reset_parameters(self) -> None:
        for module in self.children():
            module.reset_parameters()

    def _add_inter(self, intra: Tensor, inter: Tensor) -> Tensor:
        """Add the one inter-group vector to every group: (..., D) + (..., D/G) -> (..., D)."""
        # (..., D) -> (..., G, D/G); the inter term broadcasts over G
        return (intra.unflatten(-1, (self.groups, self.d_group)) + inter.unsqueeze(-2)).flatten(-2)

    def forward(
        self, h: Tensor, r: Tensor, r_w_bias: Tensor, r_r_bias: Tensor, memory: Tensor | None = None
    ) -> Tensor:
        batch, qlen, _ = h.shape
        mlen = 0 if memory is None else memory.shape[1]
        klen = mlen + qlen
        if r.shape != (klen, self.d_model):
            raise ValueError(
                f"r must be (mlen + qlen, d_model) = ({klen}, {self.d_model}), got {tuple(r.shape)}"
            )
        heads = (self.n_head, self.d_head)

        a = self.q_norm(h)
        q = self.q_net(a)
        if self.inter_q_net is not None:
            q = self._add_inter(q, linear((a,), self.inter_q_net, impl=self.impl))
        q = q.unflatten(-1, heads).transpose(1, 2)  # (B, T, D) -> (B, H, T, d_head)

        context = h if memory is None else torch.cat([memory, h], dim=1)  # (B, K, D)
        kv = linear((self.kv_norm(context),), self.kv_net, impl=self.impl)  # (B, K, 2D)
        # (B, K, 2D) -> (B, K, 2, H, d_head) -> (2, B, H, K, d_head)
        k, v = kv.view(batch, klen, 2, *heads).permute(2, 0, 3, 1, 4)
        rk = self.r_net(r).view(klen, *heads).transpose(0, 1)  # (K, D) -> (H, K, d_head)

        attended = self.attend(q, k, v, rk, r_w_bias, r_r_bias)  # (B, H, T, d_head), causal
        ov = attended.transpose(1, 2).reshape(batch, qlen, self.d_model)  # (B, T, D), group-major

        o = self.o_net(ov)
        if self.inter_o_net is not None:
            o = self._add_inter(o, linear((ov,), self.inter_o_net, impl=self.impl))
        return h + dropout(o, p=self.dropout, training=self.training)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_head={self.n_head}, groups={self.groups}, "
            f"dropout={self.dropout}, dropatt={self.dropatt}, inter_group={self.inter_group}"
        )
