"""The DeLighT block (thesis Sec. 5.3.2, App. B.1) and block-wise scaling (Sec. 5.3.3, Eq. 5.4).

A block is: DeLighT transformation (DExTra, d_model -> d_o = d_model / 2) -> single-head attention
of width d_o -> Linear(d_o -> d_model) -> residual; a decoder block then adds encoder-decoder
attention (query from the d_model residual stream, no DExTra); last the light-weight FFN d_model ->
d_ffn = d_model / r -> d_model (r = 4, swish) -> residual. The names of these widths against the
thesis's symbols and the official code's: :mod:`src.models.delight_mt`. Every sublayer is followed
by a LayerNorm (post-norm, the official MT default) or, with ``normalize_before``, preceded by it on
the branch (pre-norm, which the official LM forces). Dropout follows the official placement: on the
attention probabilities, after the FFN activation, and on each branch before its residual sum.

Layout is time-major, (T, B, d_model), as in the official code (sacmehta/delight,
``delight_transformer_layer.py``).

A decoder block also decodes incrementally (:meth:`DeLighTDecoderBlock.forward_step`): every
sublayer but the two attentions acts on each position alone, so only the attentions keep state, a
:class:`DecoderBlockCache` of their keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.dispatch import check_impl
from src.kernels.dropout import dropout
from src.kernels.dropout.contract import DropoutSeeds
from src.kernels.linear import linear
from src.kernels.residual_layer_norm import residual_layer_norm
from src.ops.dextra import DExTra
from src.ops.single_head_attention import (
    KeyValueCache,
    SingleHeadAttention,
    causal_attention_mask,
)

SCALING_RULES = ("official", "paper")


def block_wise_scaling(
    n_min: int, n_max: int, w_m: float, *, num_blocks: int | None = None, rule: str = "official"
) -> tuple[tuple[int, float], ...]:
    """Per-block DExTra depth and width multiplier ``(N^b, w^b)`` for b = 0 .. B-1.

    Thesis Eq. 5.4: ``N^b = N_min + (N_max - N_min) b / (B - 1)`` and
    ``w^b = w_m + (N_max - N_min) b / (N_min (B - 1))``, with B = N_max "for simplicity".

    ``rule="official"`` is what the released code computes:
    ``N^b = floor(linspace(N_min, N_max, B))`` (numpy's int linspace, i.e. truncation) and
    ``w^b = round(linspace(w_m, w_m + N_max / N_min - 1, B), 3)``. The widths are Eq. 5.4
    rounded to three decimals; the depths are truncated, so depths step up later than in the
    thesis (N 4 -> 8, B = 8: 4, 4, 5, 5, 6, 6, 7, 8).

    ``rule="paper"`` evaluates Eq. 5.4 itself: w^b unrounded and N^b rounded to the nearest
    integer (halves up), since a block needs a whole number of GLTs (N 4 -> 8, B = 8:
    4, 5, 5, 6, 6, 7, 7, 8).

    Args:
        n_min: N_min, the first block's depth.
        n_max: N_max >= N_min, the last block's depth.
        w_m: the first block's width multiplier.
        num_blocks: B; defaults to N_max, as in every official architecture.
        rule: ``"official"`` or ``"paper"``.
    """
    if rule not in SCALING_RULES:
        raise ValueError(f"rule must be one of {SCALING_RULES}, got {rule!r}")
    blocks = n_max if num_blocks is None else num_blocks
    if not 1 <= n_min <= n_max or blocks < 1 or w_m <= 0:
        raise ValueError(
            f"need 1 <= n_min <= n_max, num_blocks >= 1 and w_m > 0, got n_min={n_min}, "
            f"n_max={n_max}, num_blocks={blocks}, w_m={w_m}"
        )
    if rule == "official":
        depths = np.linspace(n_min, n_max, blocks, dtype=int)
        widths = np.around(np.linspace(w_m, w_m + n_max / n_min - 1, blocks), 3)
        return tuple((int(n), float(w)) for n, w in zip(depths, widths, strict=True))
    steps = [b / (blocks - 1) if blocks > 1 else 0.0 for b in range(blocks)]
    return tuple(
        (int(np.floor(n_min + (n_max - n_min) * s + 0.5)), w_m + (n_max - n_min) * s / n_min)
        for s in steps
    )


@dataclass(frozen=True)
class DecoderBlockCache:
    """One decoder block's incremental state.

    ``self_attn`` holds the keys and values of the target positions decoded so far (after
    DExTra and the qkv projection); ``encoder_attn`` those of the encoder output, computed on the
    first step (None in a block without encoder attention).

    Shape:
        self_attn key/value (T, B, d_o); encoder_attn key/value (S, B, d_o)
    """

    self_attn: KeyValueCache
    encoder_attn: KeyValueCache | None

    def reorder(self, order: Tensor, encoder: bool = True) -> DecoderBlockCache:
        """The cache of the sequences ``order`` picks; later steps' encoder padding mask must
        be reordered alike. ``encoder=False`` keeps the encoder keys and values as they are
        (the caller knows the picked rows hold the same ones).

        Shape:
            order (B',) int64 indices into B -> caches over B'
        """
        keep = self.encoder_attn is None or not encoder
        return DecoderBlockCache(
            self.self_attn.reorder(order),
            self.encoder_attn if keep else self.encoder_attn.reorder(order),
        )


class _DeLighTBlock(nn.Module):
    """The parts encoder and decoder blocks share: DExTra + self-attention, and the light FFN.

    Shape:
        (T, B, d_model) -> (T, B, d_model)
    """

    def __init__(
        self,
        d_model: int,
        *,
        width_multiplier: float,
        depth: int,
        max_groups: int,
        d_o: int | None = None,
        ffn_reduction: int = 4,
        normalize_before: bool = False,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        dextra_dropout: float = 0.0,
        schedule: str = "official",
        eps: float = 1e-5,
        glt_shuffle: bool = True,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        d_o = d_model // 2 if d_o is None else d_o
        if d_model < 1 or d_o < 1 or ffn_reduction < 1 or d_model % ffn_reduction:
            raise ValueError(
                "need positive d_model and d_o and d_model divisible by ffn_reduction, got "
                f"d_model={d_model}, d_o={d_o}, ffn_reduction={ffn_reduction}"
            )
        for name, p in (
            ("dropout", dropout),
            ("attention_dropout", attention_dropout),
            ("activation_dropout", activation_dropout),
            ("ffn_dropout", ffn_dropout),
        ):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        self.d_model = d_model
        self.d_o = d_o
        self.d_ffn = d_model // ffn_reduction
        self.normalize_before = normalize_before
        self.dropout = dropout
        self.activation_dropout = activation_dropout
        self.ffn_dropout = ffn_dropout
        self.impl = check_impl(impl)
        self.dextra = DExTra(
            d_model,
            d_o,
            d_o,
            width_multiplier=width_multiplier,
            depth=depth,
            max_groups=max_groups,
            schedule=schedule,
            dropout=dextra_dropout,
            eps=eps,
            glt_shuffle=glt_shuffle,
            impl=impl,
        )
        self.self_attn = SingleHeadAttention(d_model, d_o, dropout=attention_dropout, impl=impl)
        self.self_attn_norm = nn.LayerNorm(d_model, eps=eps)
        self.fc1 = nn.Linear(d_model, self.d_ffn)
        self.fc2 = nn.Linear(self.d_ffn, d_model)
        self.final_norm = nn.LayerNorm(d_model, eps=eps)

    def reset_parameters(self) -> None:
        for module in self.children():
            module.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_o={self.d_o}, d_ffn={self.d_ffn}, "
            f"normalize_before={self.normalize_before}, dropout={self.dropout}, "
            f"activation_dropout={self.activation_dropout}, ffn_dropout={self.ffn_dropout}"
        )

    def _residual(
        self,
        residual: Tensor,
        branch: Tensor,
        norm: nn.LayerNorm,
        p: float,
        seeds: DropoutSeeds | None,
    ) -> Tensor:
        if self.normalize_before:
            return residual + dropout(branch, p, self.training)
        # dropout, sum and LayerNorm: one launch each way on CUDA where the kernel times faster
        # (src/kernels/residual_layer_norm/__init__.py)
        p = p if self.training else 0.0
        return residual_layer_norm(
            residual, branch, norm.weight, norm.bias, norm.eps, p=p, seeds=seeds, impl=self.impl
        )

    def _pre(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        return norm(x) if self.normalize_before else x

    def _self_attention(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        seeds: DropoutSeeds | None,
    ) -> Tensor:
        h = self.dextra(self._pre(x, self.self_attn_norm), seeds)  # (T, B, d_o)
        h, _ = self.self_attn(h, key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        return self._residual(x, h, self.self_attn_norm, self.dropout, seeds)

    def _feed_forward(self, x: Tensor, seeds: DropoutSeeds | None) -> Tensor:
        # fc1 and fc2 on the GLT kernel where it times faster (src/kernels/linear.py)
        h = F.silu(
            linear((self._pre(x, self.final_norm),), self.fc1, impl=self.impl)
        )  # (T, B, d_model / r)
        h = linear((dropout(h, self.activation_dropout, self.training),), self.fc2, impl=self.impl)
        return self._residual(x, h, self.final_norm, self.ffn_dropout, seeds)


class DeLighTEncoderBlock(_DeLighTBlock):
    """A DeLighT encoder block: DExTra + single-head self-attention, then the light FFN.

    Args:
        d_model: the model width.
        width_multiplier: w^b of this block (see :func:`block_wise_scaling`).
        depth: N^b, the number of GLTs in its DExTra.
        max_groups: g_max (:func:`src.ops.dextra.dextra_max_groups`).
        d_o: the attention width; d_model / 2 by default, as in every experiment.
        ffn_reduction: r; the FFN's inner width is d_model / r.
        normalize_before: pre-norm; False (post-norm) is the official MT default.
        dropout: on the attention branch before its residual sum.
        attention_dropout: on the attention probabilities.
        activation_dropout: after the FFN's swish.
        ffn_dropout: on the FFN branch before its residual sum (officially set equal to dropout).
        dextra_dropout: inside DExTra (the official ``delight_dropout``).
        schedule: DExTra's group schedule, ``"official"`` or ``"paper"``.
        eps: of every LayerNorm.
        glt_shuffle: DExTra's feature shuffle between groups (official ``--no-glt-shuffle``
            turns it off).
        impl: the kernel paths of DExTra, the attention's projections and the FFN
            (:func:`src.kernels.linear.linear`): "auto" (Triton kernels on CUDA where they time
            faster), "triton" or "reference".

    Submodules: ``dextra`` (DExTra d_model -> d_o), ``self_attn`` (:class:`SingleHeadAttention`
    d_o -> d_model), ``self_attn_norm``, ``fc1`` (d_model -> d_ffn = d_model / r), ``fc2``
    (d_ffn -> d_model), ``final_norm``.

    Shape:
        x (T, B, d_model); padding_mask (B, T) bool, True = pad; attn_mask (T, T), its nonzero (or
        True) entries blocked; attn_bias (B, T, T) float added to the scores as it is (the pairs
        of packed rows: :mod:`src.models.packing`); seeds: the dropout seed the network's forward
        shares among its blocks (:class:`~src.kernels.dropout.contract.DropoutSeeds`), None for a
        seed per dropout -> (T, B, d_model)
    """

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        *,
        attn_bias: Tensor | None = None,
        seeds: DropoutSeeds | None = None,
    ) -> Tensor:
        if attn_bias is not None:
            if attn_mask is not None:
                raise ValueError("give attn_mask (the official blocked entries) or attn_bias")
            attn_mask = attn_bias
        elif attn_mask is not None:
            # the official encoder blocks with a large finite value, so no row is all -inf
            blocked = attn_mask.bool() if attn_mask.dtype != torch.bool else attn_mask
            attn_mask = torch.zeros(blocked.shape, dtype=x.dtype, device=x.device).masked_fill(
                blocked, -1e8
            )
        x = self._self_attention(x, padding_mask, attn_mask, seeds)
        return self._feed_forward(x, seeds)


class DeLighTDecoderBlock(_DeLighTBlock):
    """A DeLighT decoder block: causal DExTra + self-attention, optional encoder attention, FFN.

    With ``cross_attention=False`` this is the language model's block (the official LM passes
    ``no_encoder_attn`` and pre-norm).

    Args:
        d_model: the model width.
        width_multiplier: w^b of this block (see :func:`block_wise_scaling`).
        depth: N^b, the number of GLTs in its DExTra.
        max_groups: g_max (:func:`src.ops.dextra.dextra_max_groups`).
        cross_attention: add the encoder-decoder attention sublayer.
        d_o: the attention width; d_model / 2 by default.
        ffn_reduction: r; the FFN's inner width is d_model / r.
        normalize_before: pre-norm (the official LM); False (post-norm) is the MT default.
        dropout: on each attention branch before its residual sum.
        attention_dropout: on the attention probabilities.
        activation_dropout: after the FFN's swish.
        ffn_dropout: on the FFN branch before its residual sum.
        dextra_dropout: inside DExTra.
        schedule: DExTra's group schedule, ``"official"`` or ``"paper"``.
        eps: of every LayerNorm.

    Submodules: as :class:`DeLighTEncoderBlock`, plus with ``cross_attention`` ``encoder_attn``
    (:class:`SingleHeadAttention`, query d_model, keys/values d_model, head d_o) and
    ``encoder_attn_norm``.

    Shape:
        x (T, B, d_model); encoder_out (S, B, d_model), or its keys and values for this block
        already projected (:func:`~src.ops.single_head_attention.encoder_keys_values`);
        encoder_padding_mask (B, S) bool, True = pad; self_attn_mask (T, T) or (B, T, T) additive
        float, the causal mask when None; self_attn_padding_mask (B, T) bool;
        encoder_attn_mask (B, T, S) additive float (the pairs of packed rows:
        :mod:`src.models.packing`); seeds as the encoder block's -> x (T, B, d_model) and, with
        ``need_weights``, the encoder-attention probabilities (T, B, S), else None
    """

    def __init__(self, d_model: int, *, cross_attention: bool = True, **block_args: Any) -> None:
        super().__init__(d_model, **block_args)
        self.cross_attention = cross_attention
        if cross_attention:
            # the same attention dropout and LayerNorm eps as the self-attention sublayer
            self.encoder_attn = SingleHeadAttention(
                d_model, self.d_o, cross_attention=True, dropout=self.self_attn.dropout,
                impl=self.impl,
            )  # fmt: skip
            self.encoder_attn_norm = nn.LayerNorm(d_model, eps=self.self_attn_norm.eps)

    def forward(
        self,
        x: Tensor,
        encoder_out: Tensor | KeyValueCache | None = None,
        encoder_padding_mask: Tensor | None = None,
        *,
        self_attn_mask: Tensor | None = None,
        self_attn_padding_mask: Tensor | None = None,
        encoder_attn_mask: Tensor | None = None,
        need_weights: bool = False,
        seeds: DropoutSeeds | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        if (encoder_out is not None) != self.cross_attention:
            raise ValueError(
                f"encoder_out must be given exactly when cross_attention "
                f"(cross_attention={self.cross_attention})"
            )
        if self_attn_mask is None:
            self_attn_mask = causal_attention_mask(x.shape[0], device=x.device, dtype=x.dtype)
        x = self._self_attention(x, self_attn_padding_mask, self_attn_mask, seeds)
        weights = None
        if self.cross_attention:
            h, weights = self.encoder_attn(
                self._pre(x, self.encoder_attn_norm),
                encoder_out,
                key_padding_mask=encoder_padding_mask,
                attn_mask=encoder_attn_mask,
                need_weights=need_weights,
            )
            x = self._residual(x, h, self.encoder_attn_norm, self.dropout, seeds)
        return self._feed_forward(x, seeds), weights

    def forward_step(
        self,
        x: Tensor,
        encoder_out: Tensor | KeyValueCache | None,
        encoder_padding_mask: Tensor | None,
        cache: DecoderBlockCache | None,
    ) -> tuple[Tensor, DecoderBlockCache]:
        """The block on new target positions, given the cache of the earlier ones.

        Equals :meth:`forward` over the whole unpadded prefix at the new positions. Only the first
        step (``cache`` None) projects ``encoder_out``; later ones reuse its cached keys/values.

        Shape:
            x (T, B, d_model), the new positions; encoder_out (S, B, d_model);
            encoder_padding_mask (B, S) bool -> x (T, B, d_model) and the cache over all positions
            so far
        """
        if (encoder_out is not None) != self.cross_attention:
            raise ValueError(
                f"encoder_out must be given exactly when cross_attention "
                f"(cross_attention={self.cross_attention})"
            )
        past = 0 if cache is None else cache.self_attn.key.shape[0]
        mask = causal_attention_mask(x.shape[0], past_length=past, device=x.device, dtype=x.dtype)
        h = self.dextra(self._pre(x, self.self_attn_norm))  # (T, B, d_o)
        h, self_cache = self.self_attn.forward_step(
            h, None if cache is None else cache.self_attn, attn_mask=mask
        )
        x = self._residual(x, h, self.self_attn_norm, self.dropout, None)
        encoder_cache = None
        if self.cross_attention:
            encoder_cache = None if cache is None else cache.encoder_attn
            h, encoder_cache = self.encoder_attn.forward_step(
                self._pre(x, self.encoder_attn_norm),
                encoder_cache,
                encoder_out if encoder_cache is None else None,
                key_padding_mask=encoder_padding_mask,
            )
            x = self._residual(x, h, self.encoder_attn_norm, self.dropout, None)
        return self._feed_forward(x, None), DecoderBlockCache(self_cache, encoder_cache)
