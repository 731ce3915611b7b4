"""Group-Transformer (Park et al., COLING 2020) for character- and word-level language modelling.

The official model (clovaai/group-transformer, ``model_type="group"``): the token embedding read
as G feature groups (Sec. 3.1), ``L`` layers of group attention (Sec. 3.2) and group feed-forward
(Sec. 3.3), both pre-norm, a final LayerNorm, dropout, a linear ``D -> D`` (``out_trans_layer``)
and the output layer. Relative positions come from a learnable table of ``tgt_len + mem_len``
vectors initialised to sinusoids (the official code), or from the fixed sinusoids of
Transformer-XL (``learnable_pos=False``, the paper's parameter accounting). Memory works as in
Transformer-XL: ``n_layer + 1`` slots, layer i reads slot i, the last ``mem_len`` positions kept.

Ablations (Table 3): ``group_attention=False`` / ``group_ffn=False`` put Transformer-XL's relative
attention / position-wise FFN in place of the group sublayer (pre-norm by default, like the group
sublayers); ``inter_group=False`` drops the inter-group maps of both group sublayers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from src.kernels.dispatch import check_impl
from src.kernels.dropout import dropout
from src.kernels.relative_attention import ATTENTION_PATHS
from src.models.lm_head import AdaptiveHead
from src.models.transformer_xl import (
    PAPER_PER_POSITION,
    RelativeDecoderLayer,
    check_memories,
    update_memories,
)
from src.ops.group_attention import GroupAttention
from src.ops.group_embedding import GroupEmbedding
from src.ops.group_feedforward import GroupFeedForward
from src.ops.positionwise_feedforward import PositionwiseFeedForward
from src.ops.relative_multihead_attention import RelativeMultiHeadAttention
from src.ops.relative_position import RelativePositionTable, relative_sinusoid


class GroupTransformer(AdaptiveHead, nn.Module):
    """Group-Transformer language model with segment-level recurrence.

    ``x = E[token] * sqrt(D)`` -> dropout -> L x [group attention, group FFN] -> LayerNorm ->
    dropout -> ``out_trans`` (Linear D -> D) -> output Linear D -> n_token (tied to ``E`` when
    ``tie_weight``). There is no non-linearity between the last two linears (official code).

    Args:
        n_token: vocabulary size.
        n_layer: L.
        d_model: D, divisible by ``n_head`` and ``n_group``.
        n_head: H, divisible by ``n_group``.
        d_inner: FFN hidden width (all groups together).
        n_group: G, the number of feature groups.
        tgt_len: segment length; with ``mem_len`` it sizes the learnable position table.
        mem_len: past positions kept per layer (0: no recurrence). With ``learnable_pos`` the
            attention span ``M + T`` may never exceed ``tgt_len + mem_len``.
        dropout: dropout on the embedding, the sublayer outputs and before ``out_trans``.
        dropatt: dropout on attention probabilities.
        tie_weight: share the output weight with the embedding (the official script unties it).
        learnable_pos: learnable position table (official); fixed sinusoids otherwise.
        group_attention: group attention; Transformer-XL relative attention otherwise.
        group_ffn: group feed-forward; Transformer-XL position-wise FFN otherwise.
        inter_group: keep the inter-group maps in the group sublayers.
        pre_norm: norm placement of the Transformer-XL sublayers used by the ablations (the group
            sublayers are always pre-norm).
        impl: every GLT's, per-group norm's and attention softmax's path,
            ``"auto" | "reference" | "triton"``.
        attention: every layer's relative-attention path, ``"auto" | "eager" | "sdpa"``
            (:func:`src.ops.relative_position.relative_attention`).
        cutoffs: word level: the adaptive input/softmax band boundaries (None: a plain embedding
            and output layer); needs ``tie_weight`` (the bands are shared by input and output).
        adaptive_factor: band i has width ``d_model / adaptive_factor^i``.
        adaptive_dropout: dropout on the hidden states inside the adaptive softmax.

    Shape:
        tokens (B, T) int64, memories ``n_layer + 1`` x (B, M, D) or None
        -> logits (B, T, n_token) (log-probabilities with ``cutoffs``), new memories
        ``n_layer + 1`` x (B, min(mem_len, M + T), D) (None when ``mem_len == 0``);
        ``loss(tokens, targets, memories)`` -> (B, T) negative log-likelihoods, new memories
    """

    def __init__(
        self,
        n_token: int,
        n_layer: int = 9,
        d_model: int = 256,
        n_head: int = 8,
        d_inner: int = 1024,
        n_group: int = 4,
        *,
        tgt_len: int = 512,
        mem_len: int = 512,
        dropout: float = 0.1,
        dropatt: float = 0.0,
        tie_weight: bool = False,
        learnable_pos: bool = True,
        group_attention: bool = True,
        group_ffn: bool = True,
        inter_group: bool = True,
        pre_norm: bool = True,
        impl: str = "auto",
        attention: str = "auto",
        cutoffs: Sequence[int] | None = None,
        adaptive_factor: float = 4.0,
        adaptive_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_impl(impl)
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
        if n_token < 1 or n_layer < 1 or tgt_len < 1 or mem_len < 0:
            raise ValueError(
                f"need n_token >= 1, n_layer >= 1, tgt_len >= 1, mem_len >= 0, got "
                f"{n_token}, {n_layer}, {tgt_len}, {mem_len}"
            )
        if n_head < 1 or d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.n_token = n_token
        self.n_layer = n_layer
        self.d_model = d_model
        self.n_group = n_group
        self.d_inner = d_inner
        self.group_attention = group_attention
        self.group_ffn = group_ffn
        self.inter_group = inter_group
        self.mem_len = mem_len
        self.dropout = dropout
        self.tie_weight = tie_weight
        self.learnable_pos = learnable_pos
        d_head = d_model // n_head
        self.embedding: nn.Module = (
            GroupEmbedding(n_token, d_model)
            if cutoffs is None
            else self.adaptive_io(
                n_token, d_model, cutoffs, adaptive_factor, adaptive_dropout, tie_weight
            )
        )
        self.pos_table = (
            RelativePositionTable(tgt_len + mem_len, d_model) if learnable_pos else None
        )
        self.r_w_bias = nn.Parameter(torch.empty(n_head, d_head))
        self.r_r_bias = nn.Parameter(torch.empty(n_head, d_head))
        layers = []
        for _ in range(n_layer):
            if group_attention:
                attn: nn.Module = GroupAttention(
                    d_model,
                    n_head,
                    n_group,
                    dropout=dropout,
                    dropatt=dropatt,
                    inter_group=inter_group,
                )
            else:
                attn = RelativeMultiHeadAttention(
                    d_model, n_head, dropout=dropout, dropatt=dropatt, pre_norm=pre_norm
                )
            if group_ffn:
                ff: nn.Module = GroupFeedForward(
                    d_model, d_inner, n_group, inter_group=inter_group, dropout=dropout
                )
            else:
                ff = PositionwiseFeedForward(d_model, d_inner, dropout=dropout, pre_norm=pre_norm)
            layers.append(RelativeDecoderLayer(attn, ff))
        self.layers = nn.ModuleList(layers)
        for module in self.layers.modules():  # the kernel switches of GLTs and norms
            if isinstance(getattr(module, "impl", None), str):
                module.impl = impl
            if isinstance(getattr(module, "attention", None), str):
                module.attention = attention
        self.out_norm = nn.LayerNorm(d_model)
        self.out_trans = nn.Linear(d_model, d_model)
        self.output = nn.Linear(d_model, n_token) if cutoffs is None else None
        if tie_weight and self.output is not None:
            self.output.weight = self.embedding.weight
        self.init_weights()

    def init_weights(self, std: float = 0.02) -> None:
        """clovaai/group-transformer ``train.py`` (``--init normal``), which dispatches on class
        names: ``nn.Linear`` weights N(0, std) and biases 0, the embedding N(0, std), ``out_norm``
        gains N(1, std), ``r_w_bias``/``r_r_bias`` N(0, std). Its 1x1 convolutions (every grouped
        map and the attention's k/v and inter-group query maps) and its custom norms keep their
        default init, and so do their counterparts here; the position table stays sinusoidal. An
        adaptive input/softmax keeps its own (fairseq's) init.
        """
        keep_default: set[nn.Module] = set(self.embedding.modules()) if self.adaptive else set()
        for module in self.modules():
            if isinstance(module, GroupAttention):
                keep_default.add(module.kv_net)
                if module.inter_q_net is not None:
                    keep_default.add(module.inter_q_net)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module not in keep_default:
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.normal_(module.weight, mean=1.0, std=std)
                nn.init.zeros_(module.bias)
        if not self.adaptive:
            nn.init.normal_(self.embedding.weight, std=std)
        nn.init.normal_(self.r_w_bias, std=std)
        nn.init.normal_(self.r_r_bias, std=std)

    def paper_flops(self, segment_len: int) -> int:
        """FLOPs of one segment in the paper's convention (Tables 2 and 3).

        ``2 * T * L * (W + 656 * D)`` with W the per-token weight MACs of a layer: group attention
        2 D^2 + 5 D^2 / G (3 D^2 / G without inter-group maps; 5 D^2 for Transformer-XL's), and the
        group FFN counted as 2 D d_inner / G (its true cost is higher: the paper omits the
        inter-group path; 2 D d_inner for Transformer-XL's FFN). This is the fit in the reference
        ``params.json`` that reproduces all of the paper's FLOP numbers; not a measurement.
        """
        d, g = self.d_model, self.n_group
        if self.group_attention:
            attention = 2 * d * d + (5 if self.inter_group else 3) * d * d // g
        else:
            attention = 5 * d * d
        ffn = 2 * d * self.d_inner // (g if self.group_ffn else 1)
        return 2 * segment_len * self.n_layer * (attention + ffn + PAPER_PER_POSITION * d)

    def hidden_states(
        self, tokens: Tensor, memories: list[Tensor] | None = None
    ) -> tuple[Tensor, list[Tensor] | None]:
        """The states the output layer scores, and the new memories.

        Shape:
            tokens (B, T) -> (B, T, D), new memories
        """
        batch, qlen = tokens.shape
        mlen = check_memories(memories, self.n_layer + 1, batch)
        h = dropout(self.embedding(tokens), p=self.dropout, training=self.training)  # (B, T, D)
        if self.pos_table is not None:
            if mlen + qlen > self.pos_table.max_len:
                raise ValueError(
                    f"memory + segment ({mlen} + {qlen}) exceed the position table "
                    f"({self.pos_table.max_len} = tgt_len + mem_len)"
                )
            # the rows for distances K-1 ... 0, copied: a view of a parameter passed between modules
            # under no_grad breaks torch's module tracker (used by FlopCounterMode), so the table's
            # own forward (which returns a view) is not used
            r = self.pos_table.table[self.pos_table.max_len - mlen - qlen :].clone()  # (K, D)
        else:
            r = relative_sinusoid(mlen + qlen, self.d_model, dtype=h.dtype, device=h.device)
        hiddens = [h]
        for i, layer in enumerate(self.layers):
            h = layer(h, r, self.r_w_bias, self.r_r_bias, None if memories is None else memories[i])
            hiddens.append(h)
        h = dropout(self.out_norm(h), p=self.dropout, training=self.training)
        return self.out_trans(h), update_memories(hiddens, memories, self.mem_len)

    def extra_repr(self) -> str:
        return (
            f"n_group={self.n_group}, mem_len={self.mem_len}, tie_weight={self.tie_weight}, "
            f"learnable_pos={self.learnable_pos}, adaptive={self.adaptive}"
        )
