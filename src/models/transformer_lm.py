"""The Transformer language model, the baseline of DeLighT's language-modelling comparison.

fairseq's ``transformer_lm`` (``transformer_lm_wiki103`` semantics: decoder-only, pre-norm,
no LayerNorm after the last layer, adaptive input tied to the adaptive softmax) around torch's
``nn.TransformerEncoderLayer`` run causally:

tokens -> adaptive input (``embedding_dim`` wide; or a plain table scaled by sqrt(embedding_dim))
-> ``project_in`` Linear(embedding_dim -> d_model, no bias; absent when equal) -> + fairseq
sinusoidal positions -> dropout -> L pre-norm layers (causal self-attention, ReLU FFN)
-> ``project_out`` Linear(d_model -> embedding_dim, no bias; absent when equal) -> adaptive softmax
tied to the adaptive input.

The input and output side are those of :class:`src.models.delight_lm.DeLighTLanguageModel`
(the same :class:`src.ops.adaptive_io.AdaptiveInputSoftmax`), so a comparison at equal parameters
differs only in the blocks: DeLighT's embedding DExTra and block-wise scaled DeLighT blocks against
L identical Transformer layers. Differences from fairseq, for that reason: the embedding is not
scaled by sqrt(d_model) after the adaptive input (the adaptive input scales each band by
sqrt(band width) itself, as DeLighT's LM uses it), and dropout after the embedding is ordinary
dropout (fairseq's), not DeLighT's per-sequence dropout.

Parameters (``sum(p.numel() for p in model.parameters())``, tied tables once): the lookup
(adaptive: sum over bands of rows x width + width x embedding_dim projections, + 2 x embedding_dim
cluster weights), the projections, and per layer 4(d^2 + d) + 2(d f) + f + d + 4d.

Shape:
    forward: tokens (B, T) int64 -> hidden (B, T, embedding_dim);
    loss: tokens (B, T), targets (B, T) -> scalar; log_prob: tokens (B, T) -> (B, T, V)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from src.kernels.dropout import dropout
from src.models.delight_lm import TiedOutputLanguageModel, tied_lookup
from src.models.delight_mt import EMBEDDING_DIM
from src.models.fairseq_init import PADDING_IDX
from src.models.padding import keys_to_mask
from src.ops.adaptive_io import AdaptiveInputSoftmax
from src.ops.sinusoidal_positions import sinusoidal_positions


class TransformerLanguageModel(TiedOutputLanguageModel):
    """A pre-norm causal Transformer with tied adaptive input and softmax.

    Args:
        vocab_size: V (fairseq dictionary order: specials, then words by descending count).
        d_model: the layers' width.
        num_layers: L.
        num_heads: attention heads per layer.
        ffn_dim: the FFN's hidden width.
        adaptive_input: adaptive input + tied adaptive softmax; False: one plain
            ``embedding_dim``-wide table, scaled by sqrt(embedding_dim), also scoring the output.
        cutoffs: the adaptive bands' boundaries.
        adaptive_factor: band i is ``embedding_dim / factor^i`` wide.
        embedding_dim: the lookup width and the width scored at the output.
        padding_idx: the pad token.
        dropout: after the embedding and on each branch before its residual sum (0.1).
        attention_dropout: on the attention probabilities.
        activation_dropout: after the FFN's ReLU (torch's layer has one dropout for both the
            activation and the branch, so a value other than ``dropout`` is refused).
        adaptive_softmax_dropout: inside the adaptive softmax (0.1).
        final_norm: a LayerNorm after the last layer (fairseq's WT-103 LM has none).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 128,
        num_layers: int = 4,
        num_heads: int = 4,
        ffn_dim: int = 512,
        *,
        adaptive_input: bool = True,
        cutoffs: Sequence[int] = (20000, 60000),
        adaptive_factor: float = 2.0,
        embedding_dim: int = EMBEDDING_DIM,
        padding_idx: int = PADDING_IDX,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float | None = None,
        adaptive_softmax_dropout: float = 0.1,
        final_norm: bool = False,
    ) -> None:
        super().__init__()
        if not 0 <= padding_idx < vocab_size:
            raise ValueError(
                f"padding_idx must index the vocabulary, got {padding_idx} for {vocab_size}"
            )
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of num_heads ({num_heads})")
        for name, p in (("dropout", dropout), ("attention_dropout", attention_dropout)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        if activation_dropout is not None and activation_dropout != dropout:
            raise ValueError(
                "torch's TransformerEncoderLayer applies one dropout after the activation and on "
                f"the branch: set activation_dropout to dropout ({dropout}) or null, got "
                f"{activation_dropout}"
            )
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.padding_idx = padding_idx
        self.adaptive_input = adaptive_input
        self.dropout = dropout
        self.lookup, self.embed_scale = tied_lookup(
            vocab_size,
            embedding_dim,
            padding_idx,
            adaptive_input,
            cutoffs,
            adaptive_factor,
            adaptive_softmax_dropout,
        )
        self.project_in = (
            nn.Linear(embedding_dim, d_model, bias=False) if d_model != embedding_dim else None
        )
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model,
                num_heads,
                dim_feedforward=ffn_dim,
                dropout=dropout,
                activation="relu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(num_layers)
        )
        for layer in self.layers:
            layer.self_attn.dropout = attention_dropout
        self.norm = nn.LayerNorm(d_model) if final_norm else None
        self.project_out = (
            nn.Linear(d_model, embedding_dim, bias=False) if d_model != embedding_dim else None
        )
        self.init_weights()

    def init_weights(self) -> None:
        """fairseq's initialisation: Linear weights xavier-uniform with zero biases; the lookup
        tables N(0, width^-0.5) with a zero pad row (the adaptive input's own init)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for layer in self.layers:
            # the packed q/k/v projection: xavier over each (d, d) block, as fairseq's three Linears
            weight = layer.self_attn.in_proj_weight
            for block in weight.detach().chunk(3, dim=0):
                nn.init.xavier_uniform_(block)
            nn.init.zeros_(layer.self_attn.in_proj_bias)
        if isinstance(self.lookup, AdaptiveInputSoftmax):
            self.lookup.reset_parameters()
        else:
            nn.init.normal_(self.lookup.weight, 0.0, self.lookup.embedding_dim**-0.5)
            with torch.no_grad():
                self.lookup.weight[self.padding_idx].zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        """The hidden states scored by the output layer.

        Shape:
            tokens (B, T) int64 -> (B, T, embedding_dim)
        """
        padding_mask = tokens.eq(self.padding_idx)  # (B, T)
        x = self.lookup(tokens) * self.embed_scale  # (B, T, embedding_dim)
        if self.project_in is not None:
            x = self.project_in(x)  # (B, T, d_model)
        x = x + sinusoidal_positions(padding_mask, self.d_model, self.padding_idx).to(x.dtype)
        x = dropout(x, self.dropout, self.training)
        length = tokens.shape[1]
        # boolean like the key padding mask (True = masked): mixed kinds of mask make torch warn,
        # which a traced step cannot
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu(1)
        key_padding_mask = keys_to_mask(padding_mask)  # fairseq's rule (src.models.padding)
        for layer in self.layers:
            x = layer(x, src_mask=causal, src_key_padding_mask=key_padding_mask, is_causal=True)
        if self.norm is not None:
            x = self.norm(x)
        return x if self.project_out is None else self.project_out(x)

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, d_model={self.d_model}, "
            f"num_layers={len(self.layers)}, adaptive_input={self.adaptive_input}, "
            f"dropout={self.dropout}"
        )
