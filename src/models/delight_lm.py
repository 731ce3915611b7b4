"""The DeLighT language model for WikiText-103 (thesis Ch. 5, Secs. 5.4.2 and 5.6, Table 5.4b).

tokens -> adaptive input (128; or a plain 128-wide table scaled by sqrt(128)) -> per-sequence
dropout -> embedding DExTra (in 128, p d_model/2, out d_model, w_m, N_min) -> + fairseq sinusoidal
positions -> per-sequence dropout -> B = N_max pre-norm :class:`DeLighTDecoderBlock` without encoder
attention (causal), with block-wise scaling (Eq. 5.4) -> ``project_out`` Linear(d_model -> 128, no
bias) -> adaptive softmax tied to the adaptive input (or the tied plain table).

This follows the released code (sacmehta/delight, ``delight_transformer_lm.py``, arch
``delight_transformer_lm_wiki103``): the LM forces pre-norm ("training is not stable without
this") and has no LayerNorm after the last block (``no_decoder_final_norm``); the adaptive input
and softmax share every table and projection (:class:`AdaptiveInputSoftmax`), so the only
output-only weight is the 2 x 128 cluster projection. With V = 267,744 (fairseq's WikiText-103
dictionary) the parameter counts equal the official ``--print-stats`` totals, e.g. 99,247,668 for
d_model 1024, N 4 -> 12, w_m 2 (Table 5.4b: 99 M).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from src.models.delight_block import DeLighTDecoderBlock, block_wise_scaling
from src.models.delight_mt import EMBEDDING_DIM, recurrent_dropout
from src.models.fairseq_init import PADDING_IDX, init_official
from src.models.padding import keys_to_mask
from src.ops.adaptive_io import AdaptiveInputSoftmax
from src.ops.dextra import DExTra, dextra_max_groups
from src.ops.sinusoidal_positions import sinusoidal_positions


def wikitext103_dropout(d_model: int) -> float:
    """The official WT-103 rule for dropout, FFN, attention and DExTra dropout:
    ``round(0.1 * d_model / 1024, 2)`` (d_model 1024 -> 0.1, 512 -> 0.05, 384 -> 0.04,
    256 -> 0.03)."""
    return round(0.1 * d_model / 1024, 2)


def tied_lookup(
    vocab_size: int,
    embedding_dim: int,
    padding_idx: int,
    adaptive_input: bool,
    cutoffs: Sequence[int],
    adaptive_factor: float,
    adaptive_softmax_dropout: float,
) -> tuple[nn.Module, float]:
    """The lookup a :class:`TiedOutputLanguageModel` scores its output with, and the factor on
    its vectors: the adaptive input / softmax (each band scaled by sqrt(its width) inside, so 1.0)
    or one ``embedding_dim``-wide table (scaled by sqrt(embedding_dim))."""
    if adaptive_input:
        lookup = AdaptiveInputSoftmax(
            vocab_size,
            cutoffs,
            initial_dim=embedding_dim,
            output_dim=embedding_dim,
            factor=adaptive_factor,
            padding_idx=padding_idx,
            dropout=adaptive_softmax_dropout,
        )
        return lookup, 1.0
    return nn.Embedding(vocab_size, embedding_dim, padding_idx=padding_idx), math.sqrt(
        embedding_dim
    )


class TiedOutputLanguageModel(nn.Module):
    """A language model whose output is scored by its input lookup (adaptive softmax tied to the
    adaptive input, or logits against the embedding table). Subclasses provide ``lookup``,
    ``padding_idx`` and ``forward``: tokens (B, T) -> hidden states (B, T, embedding_dim)."""

    lookup: nn.Module
    padding_idx: int

    def loss(self, tokens: Tensor, targets: Tensor, *, reduction: str = "sum") -> Tensor:
        """Negative log-likelihood (nats) of ``targets`` given ``tokens``; pads in ``targets``
        are not scored. ``reduction``: ``"sum"``, ``"mean"`` over scored positions, or ``"none"``.

        Shape:
            tokens (B, T), targets (B, T) int64 -> scalar, or (B, T) for "none"
        """
        hidden = self(tokens)  # (B, T, embedding_dim)
        if isinstance(self.lookup, AdaptiveInputSoftmax):
            return self.lookup.loss(hidden, targets, reduction=reduction)
        logits = F.linear(hidden, self.lookup.weight).float()  # (B, T, V)
        nll = F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=self.padding_idx, reduction="none"
        ).view(targets.shape)
        if reduction == "none":
            return nll
        if reduction == "sum":
            return nll.sum()
        if reduction == "mean":
            return nll.sum() / targets.ne(self.padding_idx).sum().clamp_min(1)
        raise ValueError(f"reduction must be sum, mean or none, got {reduction!r}")

    def log_prob(self, tokens: Tensor) -> Tensor:
        """Next-token log-probabilities over the whole vocabulary.

        Shape:
            tokens (B, T) int64 -> (B, T, V) float32
        """
        hidden = self(tokens)
        if isinstance(self.lookup, AdaptiveInputSoftmax):
            return self.lookup.log_prob(hidden)
        return F.linear(hidden, self.lookup.weight).float().log_softmax(-1)


class DeLighTLMEmbedding(nn.Module):
    """lookup -> per-sequence dropout -> embedding DExTra -> + positions -> per-sequence dropout.

    The LM's variant of :class:`src.models.delight_mt.DeLighTEmbedding` whose lookup is any module
    mapping tokens to ``embedding_dim``-wide vectors (the adaptive input, which scales each band
    itself, so ``embed_scale`` is 1.0 there as in the official ``DExTraEmb``).

    Args:
        lookup: tokens (B, T) -> (B, T, embedding_dim).
        embedding_dim: the lookup's width.
        d_model: the model width.
        width_multiplier: w_m of the embedding DExTra.
        depth: N_min.
        max_groups: g_max.
        embed_scale: factor on the looked-up vectors.
        padding_idx: the pad token (positions skip it).
        embedding_dropout: per-sequence dropout after the lookup.
        dextra_dropout: inside the DExTra.
        position_dropout: per-sequence dropout after adding positions.

    Shape:
        tokens (B, T) int64, padding_mask (B, T) bool -> (B, T, d_model)
    """

    def __init__(
        self,
        lookup: nn.Module,
        embedding_dim: int,
        d_model: int,
        *,
        width_multiplier: float,
        depth: int,
        max_groups: int,
        embed_scale: float,
        padding_idx: int,
        embedding_dropout: float,
        dextra_dropout: float,
        position_dropout: float,
    ) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"d_model must be even (the DExTra's p is d_model / 2), got {d_model}")
        for name, p in (
            ("embedding_dropout", embedding_dropout),
            ("position_dropout", position_dropout),
        ):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        self.lookup = lookup
        self.d_model = d_model
        self.embed_scale = embed_scale
        self.padding_idx = padding_idx
        self.embedding_dropout = embedding_dropout
        self.position_dropout = position_dropout
        self.dextra = DExTra(
            embedding_dim,
            d_model // 2,
            d_model,
            width_multiplier=width_multiplier,
            depth=depth,
            max_groups=max_groups,
            dropout=dextra_dropout,
        )

    def forward(self, tokens: Tensor, padding_mask: Tensor) -> Tensor:
        x = self.lookup(tokens) * self.embed_scale  # (B, T, 128)
        x = recurrent_dropout(x, self.embedding_dropout, self.training)
        x = self.dextra(x)  # (B, T, d_model)
        positions = sinusoidal_positions(padding_mask, self.d_model, self.padding_idx)
        x = x + positions.to(x.dtype)
        return recurrent_dropout(x, self.position_dropout, self.training)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, embed_scale={self.embed_scale:.4g}, "
            f"embedding_dropout={self.embedding_dropout}, position_dropout={self.position_dropout}"
        )


class DeLighTLanguageModel(TiedOutputLanguageModel):
    """The DeLighT decoder-only language model with tied adaptive input and softmax.

    Args:
        vocab_size: V (fairseq dictionary order: specials, then words by descending count).
        d_model: the model width.
        n_min: N_min, the first block's DExTra depth and the embedding DExTra's.
        n_max: N_max, the last block's depth; B = N_max blocks unless ``num_blocks``.
        width_multiplier: w_m.
        adaptive_input: adaptive input + tied adaptive softmax (WT-103); False: one plain
            ``embedding_dim``-wide table, scaled by sqrt(embedding_dim), also scoring the output.
        cutoffs: the adaptive bands' boundaries (WT-103: 20000, 60000).
        adaptive_factor: band i is ``embedding_dim / factor^i`` wide.
        embedding_dim: the lookup width and the width scored at the output (128).
        num_blocks: B; N_max when None.
        max_groups: g_max; ``dextra_max_groups(d_model)`` (2^ceil(log2(d_model / 32))) when None.
        padding_idx: the pad token.
        dropout: on each branch before its residual sum; None: the official WT-103 rule
            :func:`wikitext103_dropout` (``round(0.1 d_model / 1024, 2)``).
        attention_dropout: on the attention probabilities; None: the same rule.
        activation_dropout: after the light FFN's swish (0).
        ffn_dropout: on the FFN branch; None: the same rule.
        dextra_dropout: inside every DExTra (``delight_dropout``); None: the same rule.
        embedding_dropout: per-sequence dropout after the lookup (0.1).
        position_dropout: per-sequence dropout after adding positions (0.1).
        adaptive_softmax_dropout: inside the adaptive softmax (0.1).

    Submodules: ``embedding`` (:class:`DeLighTLMEmbedding`; its ``lookup`` is the
    :class:`AdaptiveInputSoftmax` or an ``nn.Embedding``), ``blocks``, ``project_out`` (None when
    d_model equals embedding_dim).

    Shape:
        forward: tokens (B, T) int64 -> hidden (B, T, embedding_dim);
        loss: tokens (B, T), targets (B, T) -> scalar; log_prob: tokens (B, T) -> (B, T, V)
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 1024,
        n_min: int = 4,
        n_max: int = 12,
        width_multiplier: float = 2.0,
        *,
        adaptive_input: bool = True,
        cutoffs: Sequence[int] = (20000, 60000),
        adaptive_factor: float = 2.0,
        embedding_dim: int = EMBEDDING_DIM,
        num_blocks: int | None = None,
        max_groups: int | None = None,
        padding_idx: int = PADDING_IDX,
        dropout: float | None = None,
        attention_dropout: float | None = None,
        activation_dropout: float = 0.0,
        ffn_dropout: float | None = None,
        dextra_dropout: float | None = None,
        embedding_dropout: float = 0.1,
        position_dropout: float = 0.1,
        adaptive_softmax_dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if not 0 <= padding_idx < vocab_size:
            raise ValueError(
                f"padding_idx must index the vocabulary, got {padding_idx} for {vocab_size}"
            )
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_min = n_min
        self.n_max = n_max
        self.width_multiplier = width_multiplier
        self.max_groups = dextra_max_groups(d_model) if max_groups is None else max_groups
        self.padding_idx = padding_idx
        self.adaptive_input = adaptive_input
        self.scaling = block_wise_scaling(n_min, n_max, width_multiplier, num_blocks=num_blocks)
        rule = wikitext103_dropout(d_model)
        dropout = rule if dropout is None else dropout
        attention_dropout = rule if attention_dropout is None else attention_dropout
        ffn_dropout = rule if ffn_dropout is None else ffn_dropout
        dextra_dropout = rule if dextra_dropout is None else dextra_dropout
        self.dropout = dropout
        lookup, embed_scale = tied_lookup(
            vocab_size,
            embedding_dim,
            padding_idx,
            adaptive_input,
            cutoffs,
            adaptive_factor,
            adaptive_softmax_dropout,
        )
        self.embedding = DeLighTLMEmbedding(
            lookup,
            embedding_dim,
            d_model,
            width_multiplier=width_multiplier,
            depth=n_min,
            max_groups=self.max_groups,
            embed_scale=embed_scale,
            padding_idx=padding_idx,
            embedding_dropout=embedding_dropout,
            dextra_dropout=dextra_dropout,
            position_dropout=position_dropout,
        )
        self.blocks = nn.ModuleList(
            DeLighTDecoderBlock(
                d_model,
                cross_attention=False,
                width_multiplier=w,
                depth=n,
                max_groups=self.max_groups,
                normalize_before=True,
                dropout=dropout,
                attention_dropout=attention_dropout,
                activation_dropout=activation_dropout,
                ffn_dropout=ffn_dropout,
                dextra_dropout=dextra_dropout,
            )
            for n, w in self.scaling
        )
        self.project_out = (
            nn.Linear(d_model, embedding_dim, bias=False) if d_model != embedding_dim else None
        )
        self.init_weights()

    @property
    def lookup(self) -> nn.Module:
        return self.embedding.lookup

    def init_weights(self) -> None:
        """The official initialisation (sacmehta/delight ``nn_functions.py``, fairseq
        ``adaptive_input.py``): lookup tables N(0, width^-0.5) with a zero pad row; every Linear
        and GLT weight xavier-uniform, zero biases; LayerNorms at weight 1 and bias 0."""
        lookup = self.embedding.lookup
        # the adaptive input/softmax owns its init (fairseq's)
        adaptive = isinstance(lookup, AdaptiveInputSoftmax)
        init_official(self, skip=lookup if adaptive else None)
        if adaptive:
            lookup.reset_parameters()

    def forward(self, tokens: Tensor) -> Tensor:
        """The hidden states scored by the output layer.

        Shape:
            tokens (B, T) int64 -> (B, T, embedding_dim)
        """
        padding_mask = tokens.eq(self.padding_idx)  # (B, T)
        x = self.embedding(tokens, padding_mask).transpose(0, 1)  # (T, B, d_model)
        key_padding_mask = keys_to_mask(padding_mask)  # fairseq's rule (src.models.padding)
        for block in self.blocks:
            x, _ = block(x, self_attn_padding_mask=key_padding_mask)  # (T, B, d_model), causal
        x = x.transpose(0, 1)  # (B, T, d_model)
        return x if self.project_out is None else self.project_out(x)

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, d_model={self.d_model}, n_min={self.n_min}, "
            f"n_max={self.n_max}, width_multiplier={self.width_multiplier}, "
            f"max_groups={self.max_groups}, num_blocks={len(self.scaling)}, "
            f"adaptive_input={self.adaptive_input}, dropout={self.dropout}"
        )
