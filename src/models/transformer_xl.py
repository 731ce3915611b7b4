"""Transformer-XL (Dai et al., 2019) for character-level language modelling, as kimiyoung builds it.

The original code's ``MemTransformerLM`` with ``attn_type=0``: a scaled token embedding
(``E[token] * sqrt(D)``, no projection), ``L`` decoder layers of relative multi-head attention
(Sec. 3.3, the biases ``u = r_w_bias`` and ``v = r_r_bias`` shared by all layers) and a
position-wise feed-forward network, each either post-norm (the official default) or pre-norm, then
dropout and the output layer (optionally tied to the embedding). Segment-level recurrence
(Sec. 3.2): layer i reads, as its memory, the last ``mem_len`` inputs it saw in earlier segments;
they are detached.

Memories are a list of ``n_layer + 1`` batch-first tensors: slot 0 holds the embedding output
(after dropout), slot i the output of layer i; layer i reads slot i.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from src.kernels.dropout import dropout
from src.kernels.relative_attention import ATTENTION_PATHS
from src.models.lm_head import AdaptiveHead
from src.ops.positionwise_feedforward import PositionwiseFeedForward
from src.ops.relative_multihead_attention import RelativeMultiHeadAttention
from src.ops.relative_position import relative_sinusoid

# Per-position attention cost (x d_model MACs per token) of the paper's FLOP convention; the
# reference params.json fits it to the published numbers (any value in 654..658 works).
PAPER_PER_POSITION = 656


class RelativeDecoderLayer(nn.Module):
    """One decoder layer: a relative-attention sublayer, then a feed-forward sublayer.

    Both sublayers hold their own residual connection and norm; any attention with the signature
    of :class:`RelativeMultiHeadAttention` (e.g. ``GroupAttention``) and any
    ``(..., D) -> (..., D)`` feed-forward (e.g. ``GroupFeedForward``) fit.

    Shape:
        h (B, T, D), r (M + T, D), biases (H, d_head), memory (B, M, D) or None -> (B, T, D)
    """

    def __init__(self, attn: nn.Module, ff: nn.Module) -> None:
        super().__init__()
        self.attn = attn
        self.ff = ff

    def forward(
        self, h: Tensor, r: Tensor, r_w_bias: Tensor, r_r_bias: Tensor, memory: Tensor | None = None
    ) -> Tensor:
        return self.ff(self.attn(h, r, r_w_bias, r_r_bias, memory))


def check_memories(memories: list[Tensor] | None, n_slots: int, batch: int) -> int:
    """Validate a memory list and return its length ``M`` (0 for None or empty memories)."""
    if memories is None:
        return 0
    if len(memories) != n_slots:
        raise ValueError(f"expected {n_slots} memory tensors (n_layer + 1), got {len(memories)}")
    mlen = memories[0].shape[1]
    for memory in memories:
        if memory.dim() != 3 or memory.shape[0] != batch or memory.shape[1] != mlen:
            raise ValueError(
                f"memories must all be (B={batch}, M={mlen}, D), got "
                f"{[tuple(m.shape) for m in memories]}"
            )
    return mlen


def update_memories(
    hiddens: list[Tensor], memories: list[Tensor] | None, mem_len: int
) -> list[Tensor] | None:
    """The last ``mem_len`` positions of ``cat(memory, hidden)`` per slot, detached (Sec. 3.2).

    Returns None when ``mem_len`` is 0 (no recurrence).

    Shape:
        hiddens: n_slots x (B, T, D); memories: n_slots x (B, M, D) or None
        -> n_slots x (B, min(mem_len, M + T), D)
    """
    if mem_len == 0:
        return None
    with torch.no_grad():
        if memories is None:
            return [h[:, -mem_len:].detach() for h in hiddens]
        return [torch.cat([m, h], dim=1)[:, -mem_len:].detach() for m, h in zip(memories, hiddens)]


class TransformerXL(AdaptiveHead, nn.Module):
    """Transformer-XL language model (Dai et al., 2019) with segment-level recurrence.

    ``emb = E[token] * sqrt(D)`` -> dropout -> L x [relative attention, FFN] -> dropout -> output
    Linear D -> n_token (weight tied to ``E`` when ``tie_weight``). Distance vectors are the fixed
    sinusoids of distances ``K-1 ... 0`` (dropout applied, as in the official code).

    Args:
        n_token: vocabulary size.
        n_layer: L, number of decoder layers.
        d_model: D, the residual width.
        n_head: H, attention heads (``d_head = D / H``).
        d_inner: FFN hidden width.
        mem_len: number of past positions kept per layer (0: no recurrence); may be changed
            between calls, e.g. longer for evaluation.
        dropout: dropout on embeddings, distance vectors, sublayer outputs and the final hidden.
        dropatt: dropout on attention probabilities.
        pre_norm: pre-norm layers (the official ``pre_lnorm``); post-norm otherwise.
        tie_weight: share the output weight with the embedding (the official enwik8 script).
        attention: every layer's relative-attention path, ``"auto" | "eager" | "sdpa"``
            (:func:`src.ops.relative_position.relative_attention`).
        cutoffs: word level: the adaptive input/softmax band boundaries
            (:class:`~src.ops.adaptive_io.AdaptiveInputSoftmax`, which scales each band's vectors
            by ``sqrt(d_i)`` before projecting them; the official AdaptiveEmbedding scales after,
            by ``sqrt(D)``); None: a plain embedding and output layer. Needs ``tie_weight``.
        adaptive_factor: band i has width ``d_model / adaptive_factor^i`` (the official div_val).
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
        *,
        mem_len: int = 512,
        dropout: float = 0.1,
        dropatt: float = 0.0,
        pre_norm: bool = False,
        tie_weight: bool = True,
        attention: str = "auto",
        cutoffs: Sequence[int] | None = None,
        adaptive_factor: float = 4.0,
        adaptive_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
        if n_token < 1 or n_layer < 1 or mem_len < 0:
            raise ValueError(
                "need n_token >= 1, n_layer >= 1, mem_len >= 0, got "
                f"{n_token}, {n_layer}, {mem_len}"
            )
        if n_head < 1 or d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.n_token = n_token
        self.n_layer = n_layer
        self.d_model = d_model
        self.n_head = n_head
        self.d_inner = d_inner
        self.mem_len = mem_len
        self.dropout = dropout
        self.tie_weight = tie_weight
        d_head = d_model // n_head
        self.embedding: nn.Module = (
            nn.Embedding(n_token, d_model)
            if cutoffs is None
            else self.adaptive_io(
                n_token, d_model, cutoffs, adaptive_factor, adaptive_dropout, tie_weight
            )
        )
        self.r_w_bias = nn.Parameter(torch.empty(n_head, d_head))
        self.r_r_bias = nn.Parameter(torch.empty(n_head, d_head))
        self.layers = nn.ModuleList(
            RelativeDecoderLayer(
                RelativeMultiHeadAttention(
                    d_model, n_head, dropout=dropout, dropatt=dropatt, pre_norm=pre_norm
                ),
                PositionwiseFeedForward(d_model, d_inner, dropout=dropout, pre_norm=pre_norm),
            )
            for _ in range(n_layer)
        )
        for layer in self.layers:
            layer.attn.attention = attention
        self.output = nn.Linear(d_model, n_token) if cutoffs is None else None
        if tie_weight and self.output is not None:
            self.output.weight = self.embedding.weight
        self.init_weights()

    def init_weights(self, std: float = 0.02) -> None:
        """kimiyoung/transformer-xl ``train.py`` (``--init normal``): weights and the embedding
        N(0, std), biases 0, LayerNorm gains N(1, std), ``r_w_bias``/``r_r_bias`` N(0, std). An
        adaptive input/softmax keeps its own (fairseq's) init."""
        keep_default = set(self.embedding.modules()) if self.adaptive else set()
        for module in self.modules():
            if module in keep_default:
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.normal_(module.weight, mean=1.0, std=std)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.r_w_bias, std=std)
        nn.init.normal_(self.r_r_bias, std=std)

    def paper_flops(self, segment_len: int) -> int:
        """FLOPs of one segment in the Group-Transformer paper's convention (Tables 2 and 3).

        ``2 * T * L * (W + 656 * D)`` with W = 5 D^2 + 2 D d_inner per-token weight MACs of a layer
        (q, k, v, output and position maps; FFN); the fit in the reference ``params.json``, which
        reproduces every FLOP number of the paper to 0.1 B. Not a measurement: see complexity.py.
        """
        weights = 5 * self.d_model**2 + 2 * self.d_model * self.d_inner
        return 2 * segment_len * self.n_layer * (weights + PAPER_PER_POSITION * self.d_model)

    def hidden_states(
        self, tokens: Tensor, memories: list[Tensor] | None = None
    ) -> tuple[Tensor, list[Tensor] | None]:
        """The states the output layer scores, and the new memories.

        Shape:
            tokens (B, T) -> (B, T, D), new memories
        """
        batch, qlen = tokens.shape
        mlen = check_memories(memories, self.n_layer + 1, batch)
        scale = (
            1.0 if self.adaptive else math.sqrt(self.d_model)
        )  # the adaptive input scales its bands
        h = dropout(self.embedding(tokens) * scale, p=self.dropout, training=self.training)
        r = relative_sinusoid(mlen + qlen, self.d_model, dtype=h.dtype, device=h.device)  # (K, D)
        r = dropout(r, p=self.dropout, training=self.training)
        hiddens = [h]
        for i, layer in enumerate(self.layers):
            h = layer(h, r, self.r_w_bias, self.r_r_bias, None if memories is None else memories[i])
            hiddens.append(h)
        h = dropout(h, p=self.dropout, training=self.training)
        return h, update_memories(hiddens, memories, self.mem_len)

    def extra_repr(self) -> str:
        return f"mem_len={self.mem_len}, tie_weight={self.tie_weight}, adaptive={self.adaptive}"
