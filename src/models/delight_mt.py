"""The DeLighT encoder-decoder for machine translation (thesis Ch. 5, Secs. 5.3-5.4).

Both sides start with a :class:`DeLighTEmbedding`: a 128-wide lookup table, scaled by sqrt(128),
per-sequence dropout, a DeLighT transformation ("embedding DExTra") from 128 to d_model, then
fixed sinusoidal positions and their dropout. The encoder stacks B :class:`DeLighTEncoderBlock`,
the decoder B :class:`DeLighTDecoderBlock` with encoder attention, both with block-wise scaling
(Eq. 5.4, B = N_max) and post-norm. The decoder then maps d_model back to 128 with a bias-free
Linear and scores the vocabulary with the 128-wide lookup table (tied).

Each size has one name from the config (``conf/model/delight_*.yaml``) through the models, the
blocks and the ops down to the kernels; the thesis's symbols and the official code's names are:

=================================  ====================  ========================================
thesis                             here                  official (sacmehta/delight)
=================================  ====================  ========================================
d_m, the model width               ``d_model``           ``--delight-emb-out-dim``; ``embed_dim``
d_o = d_m / 2, attention width     ``d_o``               ``proj_dim``
d_m / r, the light FFN's width     ``d_ffn``             ``light_ffn_dim``
r = 4                              ``ffn_reduction``     ``--delight-{enc,dec}-ffn-red``
w_m; w^b of block b                ``width_multiplier``  ``--delight-{enc,dec}-width-mult``
N_min, N_max                       ``n_min``, ``n_max``  ``--delight-{enc,dec}-{min,max}-depth``
N^b, block b's DExTra depth        ``depth``             ``dextra_depth``
B, blocks a side                   ``num_blocks``        ``--delight-{enc,dec}-layers``
g_max                              ``max_groups``        ``--delight-{enc,dec}-max-groups``
d_max = w_m d_in, DExTra's widest  ``d_max``             ``max_features``
the lookup width (128)             ``embedding_dim``     ``--delight-emb-map-dim``
=================================  ====================  ========================================

A DExTra's own widths keep the official ``DExTraUnit`` names: ``in_features`` (d_in),
``in_proj_features`` (p) and ``out_features`` (o) are (d_model, d_o, d_o) in a block and
(embedding_dim, d_model / 2, d_model) in the embedding. ``d_model`` rather than d_m because every
text model's config takes that key (``model.d_model=320`` sizes DeLighT and the Transformer alike).

This follows the released code (sacmehta/delight, ``delight_transformer.py`` and
``dextra_emb.py``); the embedding DExTra and the d_model -> 128 projection are code details the
thesis does not describe ([D] in the spec):

- Embedding DExTra: in = 128, p = d_model / 2, o = d_model, w = w_m, N = N_min, the blocks' g_max;
  so its widest layer is w_m * 128, which can be narrower than d_model.
- Post-norm MT models have no LayerNorm after the last block of either side (the official one
  exists only with ``normalize_before``), and no ``project_out`` when d_model = 128.
- ``share_all_embeddings`` (WMT) ties only the lookup table: each side keeps its own embedding
  DExTra. ``share_decoder_input_output_embed`` (every official MT arch) scores with the decoder's
  table; otherwise a bias-free Linear(128 -> V_tgt) does.

With these the parameter counts equal the official ``--print-stats`` totals for every MT row of the
reference ``params.json``.

For generation the decoder also runs incrementally (:meth:`DeLighTEncoderDecoder.decode_step`),
carrying a :class:`DecoderState`: the number of target positions so far (for the sinusoidal
positions) and each block's :class:`DecoderBlockCache`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.dropout.contract import DropoutSeeds
from src.models.checks import check_dropout
from src.models.delight_block import (
    DecoderBlockCache,
    DeLighTDecoderBlock,
    DeLighTEncoderBlock,
    block_wise_scaling,
)
from src.models.fairseq_init import PADDING_IDX, init_official
from src.models.packing import PackedRows, cross_segment_mask, per_segment, segment_mask
from src.ops.dextra import DExTra, dextra_max_groups
from src.ops.shared_group_layer_norm import SharedGroupLayerNorm
from src.ops.single_head_attention import (
    KeyValueCache,
    attention_dtype,
    causal_attention_mask,
    encoder_keys_values,
    padding_bias,
)
from src.ops.sinusoidal_positions import sinusoidal_positions

EMBEDDING_DIM = 128  # the official ``delight_emb_map_dim`` of every MT and LM architecture


def recurrent_dropout(
    x: Tensor, p: float, training: bool, segments: Tensor | None = None
) -> Tensor:
    """Dropout with one mask per sequence for all its time steps (official ``RecurrentDropout``);
    with ``segments``, one per pair of a packed row (:mod:`src.models.packing`).

    Shape:
        x (B, T, C); segments (B, T) int64 or None -> (B, T, C)
    """
    if not training or p <= 0.0:
        return x
    keep = 1.0 - p
    rows = 1 if segments is None else x.shape[1] + 1  # a row's segments number at most T
    mask = x.new_empty(x.shape[0], rows, x.shape[2]).bernoulli_(keep) / keep  # (B, rows, C)
    return x * (mask if segments is None else per_segment(mask, segments))


class DeLighTEmbedding(nn.Module):
    """DeLighT's input embedding: lookup (128) -> DeLighT transformation -> + positions (d_model).

    ``lookup[token] * sqrt(128)`` (the scale only for a plain table, as in MT) -> per-sequence
    dropout -> DExTra(in=128, p=d_model/2, o=d_model, w=w_m, N=N_min) -> + fairseq sinusoidal
    positions (:func:`sinusoidal_positions`: positions start at ``padding_idx + 1``, pads get
    zeros) -> per-sequence dropout. Official ``DExTraEmb`` plus the encoder's/decoder's position
    step.

    Args:
        num_embeddings: V, the vocabulary size.
        d_model: the model width, the output's.
        width_multiplier: w_m; the embedding DExTra's widest layer is about w_m * embedding_dim.
        depth: N, the embedding DExTra's depth (officially N_min).
        max_groups: g_max (officially the blocks' one).
        embedding_dim: the lookup table's width (128 in every official model).
        padding_idx: the pad token; its row is zero and receives no gradient.
        scale_embedding: multiply the looked-up vectors by sqrt(embedding_dim).
        embedding_dropout: per-sequence dropout after the lookup (``delight_emb_dropout``).
        dextra_dropout: inside the DExTra (``delight_dropout``).
        position_dropout: per-sequence dropout after adding positions (``pe_dropout``).
        schedule: DExTra's group schedule, ``"official"`` or ``"paper"``.

    Submodules: ``lookup`` (nn.Embedding V x embedding_dim), ``dextra`` (:class:`DExTra`).

    Shape:
        tokens (B, T) int64; padding_mask (B, T) bool, True = pad, from ``padding_idx`` when None;
        ``offset`` unpadded tokens precede ``tokens`` (incremental decoding); segments and
        positions (B, T) int64 of a packed batch (:class:`~src.models.packing.PackedRows`) or
        None; seeds: the dropout seed shared with the network's blocks
        (:class:`~src.kernels.dropout.contract.DropoutSeeds`) -> (B, T, d_model)
    """

    def __init__(
        self,
        num_embeddings: int,
        d_model: int,
        *,
        width_multiplier: float,
        depth: int,
        max_groups: int,
        embedding_dim: int = EMBEDDING_DIM,
        padding_idx: int = PADDING_IDX,
        scale_embedding: bool = True,
        embedding_dropout: float = 0.1,
        dextra_dropout: float = 0.0,
        position_dropout: float = 0.1,
        schedule: str = "official",
    ) -> None:
        super().__init__()
        if not 0 <= padding_idx < num_embeddings:
            raise ValueError(
                f"padding_idx must index the vocabulary, got {padding_idx} for {num_embeddings}"
            )
        if d_model % 2:
            raise ValueError(f"d_model must be even (the DExTra's p is d_model / 2), got {d_model}")
        check_dropout(embedding_dropout=embedding_dropout, position_dropout=position_dropout)
        self.d_model = d_model
        self.padding_idx = padding_idx
        self.embed_scale = math.sqrt(embedding_dim) if scale_embedding else 1.0
        self.embedding_dropout = embedding_dropout
        self.position_dropout = position_dropout
        self.lookup = nn.Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx)
        self.dextra = DExTra(
            embedding_dim,
            d_model // 2,
            d_model,
            width_multiplier=width_multiplier,
            depth=depth,
            max_groups=max_groups,
            schedule=schedule,
            dropout=dextra_dropout,
        )

    def forward(
        self,
        tokens: Tensor,
        padding_mask: Tensor | None = None,
        *,
        offset: int = 0,
        segments: Tensor | None = None,
        positions: Tensor | None = None,
        seeds: DropoutSeeds | None = None,
    ) -> Tensor:
        if padding_mask is None:
            padding_mask = tokens.eq(self.padding_idx)
        x = self.lookup(tokens) * self.embed_scale  # (B, T, 128)
        x = recurrent_dropout(x, self.embedding_dropout, self.training, segments)
        x = self.dextra(x, seeds)  # (B, T, d_model)
        vectors = sinusoidal_positions(
            padding_mask, self.d_model, self.padding_idx, offset=offset, positions=positions
        )  # (B, T, d_model)
        x = x + vectors.to(x.dtype)
        return recurrent_dropout(x, self.position_dropout, self.training, segments)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, padding_idx={self.padding_idx}, "
            f"embed_scale={self.embed_scale:.4g}, embedding_dropout={self.embedding_dropout}, "
            f"position_dropout={self.position_dropout}"
        )


@dataclass(frozen=True)
class DecoderState:
    """The decoder's incremental state after ``length`` target positions.

    Shape:
        blocks: one :class:`DecoderBlockCache` per decoder block, self-attention keys/values
        (length, B, d_o), encoder-attention keys/values (S, B, d_o)
    """

    length: int
    blocks: tuple[DecoderBlockCache, ...]
    # (B,) int64: rows with one id hold the same encoder keys and values (a source's beams)
    sources: Tensor | None = None

    def reorder(self, order: Tensor) -> DecoderState:
        """The state of the sequences ``order`` picks, e.g. the surviving beams; later steps'
        ``src_padding_mask`` must be reordered alike (beams of one source share it).

        Where every row keeps its source (beams moving among one source's rows, as in a beam
        search), the encoder keys and values are left as they are: they are the same for the rows
        exchanged. At IWSLT size their 18 index copies were 16% of a beam search.

        Shape:
            order (B',) int64 indices into B -> caches over B'
        """
        sources = None if self.sources is None else self.sources.index_select(0, order)
        same = sources is not None and sources.shape == self.sources.shape
        same = same and torch.equal(sources, self.sources)
        blocks = tuple(block.reorder(order, encoder=not same) for block in self.blocks)
        return DecoderState(self.length, blocks, self.sources if same else sources)


def source_ids(encoder_out: Tensor, src_padding_mask: Tensor | None) -> Tensor:
    """An id per row, equal for rows whose encoder output and padding are equal (the widened
    copies of one source in a beam search).

    Shape:
        encoder_out (S, B, d), src_padding_mask (B, S) -> (B,) int64
    """
    rows = encoder_out.transpose(0, 1).reshape(encoder_out.shape[1], -1)
    if src_padding_mask is not None:
        rows = torch.cat((rows, src_padding_mask.to(rows.dtype)), dim=1)
    return torch.unique(rows, dim=0, return_inverse=True)[1]


def _linear_params(module: nn.Module | None) -> int:
    """Weights and biases of the linear maps and GLTs in ``module`` (not norms, not lookups):
    what one token costs in the official profiler's convention."""
    if module is None:
        return 0
    skip = (nn.LayerNorm, SharedGroupLayerNorm, nn.Embedding)
    return sum(
        p.numel()
        for m in module.modules()
        if not isinstance(m, skip)
        for p in m.parameters(recurse=False)
    )


class DeLighTEncoderDecoder(nn.Module):
    """The DeLighT translation network: embeddings, B encoder and B decoder blocks, tied output.

    Encoder: :class:`DeLighTEmbedding` -> B :class:`DeLighTEncoderBlock` (post-norm, no final
    LayerNorm). Decoder: :class:`DeLighTEmbedding` -> B :class:`DeLighTDecoderBlock` with encoder
    attention -> ``project_out`` Linear(d_model -> 128, no bias; absent when d_model = 128) ->
    logits against the decoder's lookup table (``share_decoder_input_output_embed``) or a
    bias-free ``output`` Linear(128 -> V_tgt). Block b has depth N^b and width multiplier w^b from
    :func:`block_wise_scaling` (Eq. 5.4, the official truncation and rounding; B = N_max).

    Args:
        src_vocab: V_src.
        tgt_vocab: V_tgt.
        d_model: the model width.
        n_min: N_min, the first block's DExTra depth and the embedding DExTra's.
        n_max: N_max, the last block's depth.
        width_multiplier: w_m, the first block's and the embedding DExTra's.
        share_all_embeddings: one lookup table for the source, the target and the output (WMT;
            needs ``src_vocab == tgt_vocab``, a joined dictionary).
        share_decoder_input_output_embed: score with the decoder's lookup table (IWSLT and WMT).
        num_blocks: B, on each side; N_max when None, as in every official architecture.
        max_groups: g_max of every DExTra; ``dextra_max_groups(d_model)`` (the code's
            2^ceil(log2(d_model / 32)), 16 for d_model = 384) when None.
        embedding_dim: the lookup tables' width.
        padding_idx: the pad token of both dictionaries.
        dropout: on each attention branch before its residual sum.
        attention_dropout: on the attention probabilities.
        activation_dropout: after the light FFN's swish.
        ffn_dropout: on the FFN branch before its residual sum (officially equal to ``dropout``).
        dextra_dropout: inside every DExTra (the official ``delight_dropout``).
        embedding_dropout: per-sequence dropout after the lookup.
        position_dropout: per-sequence dropout after adding positions.
        schedule: DExTra's group schedule, ``"official"`` or ``"paper"``.
        scaling_rule: :func:`block_wise_scaling`'s rule, ``"official"`` or ``"paper"``.

    Submodules: ``encoder_embedding``, ``encoder_blocks``, ``decoder_embedding``,
    ``decoder_blocks``, ``project_out`` (or None), ``output`` (or None when tied).

    Shape:
        src_tokens (B, S) int64; src_padding_mask (B, S) bool, True = pad, from ``padding_idx``
        when None; prev_output_tokens (B, T) int64, right-padded; packing: where the pairs of
        packed rows sit (:class:`~src.models.packing.PackedRows`), None for a pair a row ->
        logits (B, T, V_tgt)
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int = 512,
        n_min: int = 4,
        n_max: int = 8,
        width_multiplier: float = 2.0,
        *,
        share_all_embeddings: bool = False,
        share_decoder_input_output_embed: bool = True,
        num_blocks: int | None = None,
        max_groups: int | None = None,
        embedding_dim: int = EMBEDDING_DIM,
        padding_idx: int = PADDING_IDX,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.0,
        ffn_dropout: float = 0.1,
        dextra_dropout: float = 0.0,
        embedding_dropout: float = 0.1,
        position_dropout: float = 0.1,
        schedule: str = "official",
        scaling_rule: str = "official",
    ) -> None:
        super().__init__()
        if share_all_embeddings and src_vocab != tgt_vocab:
            raise ValueError(
                "share_all_embeddings needs a joined dictionary, got src_vocab="
                f"{src_vocab} and tgt_vocab={tgt_vocab}"
            )
        self.d_model = d_model
        self.n_min = n_min
        self.n_max = n_max
        self.width_multiplier = width_multiplier
        self.max_groups = dextra_max_groups(d_model) if max_groups is None else max_groups
        self.padding_idx = padding_idx
        self.share_all_embeddings = share_all_embeddings
        self.share_decoder_input_output_embed = share_decoder_input_output_embed
        self.scaling = block_wise_scaling(
            n_min, n_max, width_multiplier, num_blocks=num_blocks, rule=scaling_rule
        )
        embedding = {
            "width_multiplier": width_multiplier,
            "depth": n_min,
            "max_groups": self.max_groups,
            "embedding_dim": embedding_dim,
            "padding_idx": padding_idx,
            "embedding_dropout": embedding_dropout,
            "dextra_dropout": dextra_dropout,
            "position_dropout": position_dropout,
            "schedule": schedule,
        }
        block = {
            "max_groups": self.max_groups,
            "dropout": dropout,
            "attention_dropout": attention_dropout,
            "activation_dropout": activation_dropout,
            "ffn_dropout": ffn_dropout,
            "dextra_dropout": dextra_dropout,
            "schedule": schedule,
        }
        self.encoder_embedding = DeLighTEmbedding(src_vocab, d_model, **embedding)
        self.decoder_embedding = DeLighTEmbedding(tgt_vocab, d_model, **embedding)
        if share_all_embeddings:
            # only the table is shared; each side keeps its own embedding DExTra (official)
            self.decoder_embedding.lookup.weight = self.encoder_embedding.lookup.weight
        self.encoder_blocks = nn.ModuleList(
            DeLighTEncoderBlock(d_model, width_multiplier=w, depth=n, **block)
            for n, w in self.scaling
        )
        self.decoder_blocks = nn.ModuleList(
            DeLighTDecoderBlock(d_model, width_multiplier=w, depth=n, **block)
            for n, w in self.scaling
        )
        self.project_out = (
            nn.Linear(d_model, embedding_dim, bias=False) if d_model != embedding_dim else None
        )
        self.output = (
            None
            if share_decoder_input_output_embed
            else nn.Linear(embedding_dim, tgt_vocab, bias=False)
        )
        self.init_weights()

    def init_weights(self) -> None:
        """The official initialisation (:func:`init_official`)."""
        init_official(self)

    def encode(
        self,
        src_tokens: Tensor,
        src_padding_mask: Tensor | None = None,
        packing: PackedRows | None = None,
    ) -> Tensor:
        """The encoder output, time-major as the blocks keep it; with ``packing``, each pair of a
        row attends within itself (:mod:`src.models.packing`).

        Shape:
            src_tokens (B, S); src_padding_mask (B, S) bool or None -> (S, B, d_model)
        """
        if src_padding_mask is None:
            src_padding_mask = src_tokens.eq(self.padding_idx)
        segments, positions = (
            (None, None) if packing is None else (packing.source_segments, packing.source_positions)
        )
        seeds = DropoutSeeds()  # one seed drawn for the encoder's dropouts
        x = self.encoder_embedding(
            src_tokens, src_padding_mask, segments=segments, positions=positions, seeds=seeds
        ).transpose(0, 1)  # (S, B, d_model)
        # the masks as the additive ones the attention adds, built once for all blocks: the
        # padding (B, S), or each pair of a packed row within itself (B, S, S)
        dtype = self._attention_dtype()
        bias = padding_bias(src_padding_mask, dtype) if packing is None else None
        within = None if packing is None else segment_mask(packing.source_segments, dtype)
        for block in self.encoder_blocks:
            x = block(x, bias, attn_bias=within, seeds=seeds)
        return x

    def _attention_dtype(self) -> torch.dtype:
        return attention_dtype(self.decoder_blocks[0].self_attn.qkv_proj.weight)

    def decode(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Tensor,
        src_padding_mask: Tensor | None,
        packing: PackedRows | None = None,
    ) -> Tensor:
        """Logits of the next target tokens given the encoder output (teacher forcing); with
        ``packing``, each pair of a row attends within itself and to its own source.

        Shape:
            prev_output_tokens (B, T); encoder_out (S, B, d_model); src_padding_mask (B, S) bool
            or None -> (B, T, V_tgt)
        """
        tgt_padding_mask = prev_output_tokens.eq(self.padding_idx)
        segments, positions = (
            (None, None) if packing is None else (packing.target_segments, packing.target_positions)
        )
        seeds = DropoutSeeds()  # one seed drawn for the decoder's dropouts
        x = self.decoder_embedding(
            prev_output_tokens, tgt_padding_mask, segments=segments, positions=positions,
            seeds=seeds,
        ).transpose(0, 1)  # fmt: skip
        # Masks built once for all blocks, in the attention's dtype. As the official decoder, only
        # the causal mask and the source padding: with right padding a real position never sees a
        # pad, and pad positions are outside the loss (fairseq's own decoder masks them too).
        # Packed rows: each pair within itself, causally (B, T, T), and to its own source (B, T, S).
        dtype = self._attention_dtype()
        if packing is None:
            causal = causal_attention_mask(x.shape[0], device=x.device, dtype=dtype)  # (T, T)
            bias = None if src_padding_mask is None else padding_bias(src_padding_mask, dtype)
            across = None
        else:
            causal = segment_mask(segments, dtype, causal=True)
            across = cross_segment_mask(segments, packing.source_segments, dtype)
            bias = None
        encoder = self._encoder_keys_values(encoder_out)
        for block, keys_values in zip(self.decoder_blocks, encoder, strict=True):
            x, _ = block(
                x, keys_values, bias, self_attn_mask=causal, encoder_attn_mask=across, seeds=seeds
            )  # (T, B, d_model)
        return self._output(x)

    def _encoder_keys_values(self, encoder_out: Tensor) -> list[KeyValueCache]:
        """Every decoder block's encoder-attention keys and values, from one product.

        Shape:
            (S, B, d_model) -> one cache of key, value (S, B, d_o) per block
        """
        return encoder_keys_values([b.encoder_attn for b in self.decoder_blocks], encoder_out)

    def decode_step(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Tensor,
        src_padding_mask: Tensor | None,
        state: DecoderState | None,
    ) -> tuple[Tensor, DecoderState]:
        """Logits of the next target tokens for new decoder inputs, given the earlier ones' state.

        ``prev_output_tokens`` continues the unpadded prefix ``state`` has seen (None before the
        first step), so the logits equal :meth:`decode`'s on the whole prefix at these positions.
        Only the first step reads the encoder output; later ones use its cached keys/values.

        Shape:
            prev_output_tokens (B, T) int64, the new positions (usually T = 1), no pads;
            encoder_out (S, B, d_model); src_padding_mask (B, S) bool or None -> logits
            (B, T, V_tgt) and the state after ``state.length + T`` positions
        """
        if bool(prev_output_tokens.eq(self.padding_idx).any()):
            raise ValueError(
                f"incremental decoding takes unpadded prefixes, got padding_idx={self.padding_idx} "
                "among prev_output_tokens"
            )
        past = 0 if state is None else state.length
        no_pad = torch.zeros(
            prev_output_tokens.shape, dtype=torch.bool, device=prev_output_tokens.device
        )
        x = self.decoder_embedding(prev_output_tokens, no_pad, offset=past).transpose(0, 1)
        # the first step projects the encoder output for every block at once
        encoder = self._encoder_keys_values(encoder_out) if state is None else None
        caches = []
        for b, block in enumerate(self.decoder_blocks):
            x, cache = block.forward_step(  # (T, B, d_model)
                x,
                encoder_out if encoder is None else encoder[b],
                src_padding_mask,
                None if state is None else state.blocks[b],
            )
            caches.append(cache)
        sources = source_ids(encoder_out, src_padding_mask) if state is None else state.sources
        state = DecoderState(past + prev_output_tokens.shape[1], tuple(caches), sources)
        return self._output(x), state

    def _output(self, x: Tensor) -> Tensor:
        """The decoder's last hidden states scored against the target vocabulary.

        Shape:
            (T, B, d_model) -> (B, T, V_tgt)
        """
        x = x.transpose(0, 1)  # (B, T, d_model)
        if self.project_out is not None:
            x = self.project_out(x)  # (B, T, 128)
        if self.output is not None:
            return self.output(x)
        return F.linear(x, self.decoder_embedding.lookup.weight)  # (B, T, V_tgt)

    def forward(
        self,
        src_tokens: Tensor,
        src_padding_mask: Tensor | None,
        prev_output_tokens: Tensor,
        packing: PackedRows | None = None,
    ) -> Tensor:
        if src_padding_mask is None:
            src_padding_mask = src_tokens.eq(self.padding_idx)
        encoder_out = self.encode(src_tokens, src_padding_mask, packing)
        return self.decode(prev_output_tokens, encoder_out, src_padding_mask, packing)

    def paper_macs(self, src_len: int = 20, tgt_len: int = 20) -> int:
        """Multiply-adds as the official profiler counts them (``--print-stats``; thesis Table
        5.2 counts 20 source and 20 target tokens: 5.6 B at d_model 512 and 8.1 B at 640 on En-Fr).

        - A linear map or GLT costs its weights plus biases per token it maps; LayerNorms,
          activations and lookups are free.
        - Attention costs ``2 T S d_o`` (scores and weighted sum).
        - The encoder runs once on ``src_len`` tokens. The decoder is run anew for every prefix
          t = 1 .. ``tgt_len`` (no incremental state). Each run maps t tokens and projects the
          ``src_len`` encoder states to keys and values again in every block.
        - The output layer scores 128 x V per target token.

        Counted from the built modules, so it follows every configuration option. It differs from
        ``FlopCounterMode`` (one teacher-forced pass, attention not counted on the CPU).
        """
        d_o = self.d_model // 2
        blocks = len(self.decoder_blocks)
        encoder = _linear_params(self.encoder_embedding) + sum(
            _linear_params(b) for b in self.encoder_blocks
        )
        cross = sum(_linear_params(b.encoder_attn.kv_proj) for b in self.decoder_blocks)
        decoder = _linear_params(self.decoder_embedding) + sum(
            _linear_params(b) for b in self.decoder_blocks
        )
        decoder += _linear_params(self.project_out) - cross
        embedding_dim, vocab = (
            self.decoder_embedding.lookup.weight.shape[1],
            self.decoder_embedding.lookup.weight.shape[0],
        )
        decoder += embedding_dim * vocab if self.output is None else _linear_params(self.output)
        macs = src_len * encoder + len(self.encoder_blocks) * 2 * src_len * src_len * d_o
        for t in range(1, tgt_len + 1):
            macs += (
                t * decoder + src_len * cross + blocks * (2 * t * t * d_o + 2 * t * src_len * d_o)
            )
        return macs

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_min={self.n_min}, n_max={self.n_max}, "
            f"width_multiplier={self.width_multiplier}, max_groups={self.max_groups}, "
            f"num_blocks={len(self.scaling)}, share_all_embeddings={self.share_all_embeddings}, "
            f"share_decoder_input_output_embed={self.share_decoder_input_output_embed}"
        )
