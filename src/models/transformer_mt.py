"""The Transformer encoder-decoder (Vaswani et al., 2017), the baseline of DeLighT's MT tables.

fairseq's ``transformer`` architecture (the baseline the DeLighT thesis retrains, Table 5.1) on
torch's ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``: token embeddings scaled
by sqrt(d_model) plus fairseq's sinusoidal positions
(:func:`src.ops.sinusoidal_positions.sinusoidal_positions`, no parameters), dropout, L encoder and L
decoder layers (ReLU FFN, post-norm by default), logits against the decoder's embedding table
(``share_decoder_input_output_embed``) or a bias-free Linear.
As in fairseq, the stacks end with a LayerNorm only when ``normalize_before`` (pre-norm).

The layers run time-major (``batch_first=False``): ``encode`` returns (S, B, d) as the searches
and :class:`src.models.delight_mt.DeLighTEncoderDecoder` do, and torch's inference fast path (only
taken for batch-first layers) stays off, so eval and training run the same kernels.

Parameter counts (``sum(p.numel() for p in model.parameters())``, a tied table once). A torch
layer's ``in_proj_weight`` (3d, d) and ``in_proj_bias`` (3d) hold exactly fairseq's separate
q/k/v projections with biases, so every layer matches fairseq's count:

- encoder layer 4(d^2 + d) + 2(d f) + f + d + 4d, decoder layer 8(d^2 + d) + 2(d f) + f + d + 6d;
- ``transformer_iwslt_de_en`` (d 512, f 1024, 4 heads, 6 + 6 layers, de 8,848 / en 6,632,
  decoder input/output tied): 39,469,056;
- ``transformer_wmt_en_de`` base (d 512, f 2048, 8 heads, 6 + 6, all embeddings shared):
  En-De V 43,736: 66,531,328; En-Fr V 44,512: 66,928,640; En-Ro V 34,968: 62,042,112;
- ``transformer_vaswani_wmt_en_de_big`` (d 1024, f 4096, 16 heads, shared): En-De 221,143,040,
  En-Fr 221,937,664, En-Ro 212,164,608.

The thesis's "Transformer (our impl.)" rows are these base models: 62 M on WMT'16 En-Ro
(62.04 M) and 67 M on WMT'14 En-De / En-Fr (66.53 M / 66.93 M). Its IWSLT'14 42 M is not the
tied ``transformer_iwslt_de_en`` on fairseq's dictionaries (39.47 M); the same model with an
untied output layer has 42,864,640.

Generation: torch's layers keep no key/value cache, so
:meth:`TransformerEncoderDecoder.decode_step` runs each decoder layer's own parameters on the new
positions only (:func:`_decoder_layer_step`, the math of ``nn.TransformerDecoderLayer.forward``)
and keeps a :class:`KeyValueState`: per layer the self-attention keys/values of every target
position so far and the cross-attention keys/values of the encoder output, projected at the first
step and reused. A step costs O(t) attention and O(1) projection/FFN work at target position t
(O(T^2) over T steps only in the attention, as in fairseq), instead of a decoder pass over the
whole prefix. The logits equal :meth:`TransformerEncoderDecoder.decode`'s on the whole prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.models.checks import check_dropout
from src.models.fairseq_init import PADDING_IDX
from src.models.packing import PackedRows, cross_segment_mask, segment_mask
from src.models.padding import keys_to_mask
from src.ops.sinusoidal_positions import sinusoidal_positions


@dataclass(frozen=True)
class LayerCache:
    """One decoder layer's attention keys and values, heads split, batch first.

    Shape:
        self_keys, self_values (B, H, length, d_model / H): the target positions so far;
        encoder_keys, encoder_values (B, H, S, d_model / H): the encoder output's
    """

    self_keys: Tensor
    self_values: Tensor
    encoder_keys: Tensor
    encoder_values: Tensor

    def reorder(self, order: Tensor) -> LayerCache:
        """The self-attention keys/values of the sequences ``order`` picks; the encoder's as
        they are (see :meth:`KeyValueState.reorder`).

        Shape:
            order (B,) int64 indices into B -> the same shapes
        """
        return LayerCache(
            self.self_keys.index_select(0, order),
            self.self_values.index_select(0, order),
            self.encoder_keys,
            self.encoder_values,
        )


@dataclass(frozen=True)
class KeyValueState:
    """The decoder's incremental state after ``length`` target positions.

    Shape:
        layers: one :class:`LayerCache` per decoder layer
    """

    length: int
    layers: tuple[LayerCache, ...]

    def reorder(self, order: Tensor) -> KeyValueState:
        """The state of the sequences ``order`` picks, e.g. the surviving beams.

        Row r of the encoder keys/values stays row r: they belong to the ``encoder_out`` rows
        that every step passes unchanged (the prefix-recomputing decoder, and
        :func:`src.decoding.beam_search.beam_search`, which moves beams only among the rows of one
        source, all sharing its encoder output). So ``order`` must keep the batch size.

        Shape:
            order (B,) int64 indices into B -> caches over B
        """
        return KeyValueState(self.length, tuple(layer.reorder(order) for layer in self.layers))


def _split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Shape: (T, B, d) -> (B, H, T, d / H)"""
    length, batch, _ = x.shape
    return x.view(length, batch, num_heads, -1).permute(1, 2, 0, 3)  # (B, H, T, d_h)


def _attention(
    attn: nn.MultiheadAttention,
    query: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor | None,
    training: bool,
) -> Tensor:
    """``attn``'s output projection of the attention of projected queries over keys/values.

    The queries come in unprojected; ``mask`` is True where a query may read a key.

    Shape:
        query (T, B, d); keys, values (B, H, K, d / H); mask broadcasting to (B, H, T, K) or
        None -> (T, B, d)
    """
    d = query.shape[-1]
    q = _split_heads(
        F.linear(query, attn.in_proj_weight[:d], attn.in_proj_bias[:d]), attn.num_heads
    )  # (B, H, T, d_h)
    x = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, dropout_p=attn.dropout if training else 0.0
    )  # (B, H, T, d_h)
    x = x.permute(2, 0, 1, 3).flatten(2)  # (T, B, d)
    return attn.out_proj(x)


def _keys_values(attn: nn.MultiheadAttention, x: Tensor) -> tuple[Tensor, Tensor]:
    """``attn``'s keys and values of ``x``.

    Shape:
        x (T, B, d) -> keys, values (B, H, T, d / H)
    """
    d = x.shape[-1]
    kv = F.linear(x, attn.in_proj_weight[d:], attn.in_proj_bias[d:])  # (T, B, 2d)
    keys, values = kv.chunk(2, dim=-1)  # (T, B, d) each
    return _split_heads(keys, attn.num_heads), _split_heads(values, attn.num_heads)


def _check_decoder_layer(layer: nn.TransformerDecoderLayer) -> None:
    """Raise unless :func:`_decoder_layer_step` computes ``layer``'s forward exactly."""
    if not isinstance(layer, nn.TransformerDecoderLayer):
        raise TypeError(f"incremental decoding needs nn.TransformerDecoderLayer, got {type(layer)}")
    if layer.self_attn.batch_first or layer.multihead_attn.batch_first:
        raise ValueError("incremental decoding supports time-major layers, got batch_first=True")
    for name in ("self_attn", "multihead_attn"):
        attn = getattr(layer, name)
        if (
            attn.in_proj_weight is None
            or attn.in_proj_bias is None
            or attn.bias_k is not None
            or attn.add_zero_attn
        ):
            raise ValueError(
                f"incremental decoding supports packed q/k/v projections with biases and no "
                f"added key/value or zero attention, got {name}={attn}"
            )


def _decoder_layer_step(
    layer: nn.TransformerDecoderLayer,
    x: Tensor,
    cache: LayerCache | None,
    encoder_out: Tensor,
    encoder_mask: Tensor | None,
    causal: Tensor | None,
) -> tuple[Tensor, LayerCache]:
    """``layer``'s forward on new target positions, reading the cached earlier ones.

    The branches of ``nn.TransformerDecoderLayer.forward`` (pre- or post-norm): causal
    self-attention over the cached and new positions, attention over the encoder output (its
    keys/values projected when ``cache`` is None, then reused), the FFN.

    Shape:
        x (T, B, d), the new positions; encoder_out (S, B, d); encoder_mask (B, 1, 1, S) bool,
        True = read, or None; causal (T, length + T) bool, True = read, or None (T = 1) ->
        (T, B, d) and the cache after ``length + T`` positions
    """
    training = layer.training

    def self_attention(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        keys, values = _keys_values(layer.self_attn, h)  # (B, H, T, d_h)
        if cache is not None:
            keys = torch.cat((cache.self_keys, keys), dim=2)  # (B, H, length + T, d_h)
            values = torch.cat((cache.self_values, values), dim=2)
        out = _attention(layer.self_attn, h, keys, values, causal, training)
        return layer.dropout1(out), keys, values

    def encoder_attention(h: Tensor) -> Tensor:
        out = _attention(
            layer.multihead_attn, h, encoder_keys, encoder_values, encoder_mask, training
        )
        return layer.dropout2(out)

    def feed_forward(h: Tensor) -> Tensor:
        return layer.dropout3(layer.linear2(layer.dropout(layer.activation(layer.linear1(h)))))

    if cache is None:
        encoder_keys, encoder_values = _keys_values(layer.multihead_attn, encoder_out)
    else:
        encoder_keys, encoder_values = cache.encoder_keys, cache.encoder_values
    if layer.norm_first:
        branch, keys, values = self_attention(layer.norm1(x))
        x = x + branch
        x = x + encoder_attention(layer.norm2(x))
        x = x + feed_forward(layer.norm3(x))
    else:
        branch, keys, values = self_attention(x)
        x = layer.norm1(x + branch)
        x = layer.norm2(x + encoder_attention(x))
        x = layer.norm3(x + feed_forward(x))
    return x, LayerCache(keys, values, encoder_keys, encoder_values)


def _set_dropouts(
    layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer,
    attention_dropout: float,
    activation_dropout: float,
) -> None:
    """Give a torch layer fairseq's three dropouts.

    torch uses its one ``dropout`` on the attention probabilities, after the FFN's ReLU and on
    each residual branch; fairseq's ``attention_dropout`` and ``activation_dropout`` replace the
    first two, ``dropout`` stays on the branches.
    """
    layer.self_attn.dropout = attention_dropout
    if isinstance(layer, nn.TransformerDecoderLayer):
        layer.multihead_attn.dropout = attention_dropout
    layer.dropout = nn.Dropout(activation_dropout)


class TransformerEncoderDecoder(nn.Module):
    """The Transformer translation network with fairseq's ``transformer`` semantics.

    Encoder: ``embed_scale * encoder_embedding(src) + positions`` -> dropout -> L
    ``nn.TransformerEncoderLayer`` (-> ``encoder_norm`` when ``normalize_before``). Decoder: the
    same on the target with L ``nn.TransformerDecoderLayer`` (causal self-attention, then
    attention over the encoder output) (-> ``decoder_norm``) -> logits against the decoder's
    table or ``output``.

    Args:
        src_vocab: V_src.
        tgt_vocab: V_tgt.
        d_model: d, the embedding and layer width.
        ffn_dim: f, the FFN's hidden width.
        num_heads: attention heads (``d_model`` must divide by it).
        num_layers: L, on each side.
        share_all_embeddings: one table for the source, the target and the output (WMT; needs
            ``src_vocab == tgt_vocab`` and ``share_decoder_input_output_embed``).
        share_decoder_input_output_embed: score with the decoder's table (every fairseq MT arch).
        padding_idx: the pad token of both dictionaries.
        dropout: after the embeddings and on every residual branch.
        attention_dropout: on the attention probabilities.
        activation_dropout: after the FFN's ReLU.
        normalize_before: pre-norm layers and a final LayerNorm on each side (fairseq's
            ``--encoder-normalize-before --decoder-normalize-before``); post-norm when False.

    Submodules: ``encoder_embedding``, ``encoder_layers``, ``encoder_norm`` (or None),
    ``decoder_embedding``, ``decoder_layers``, ``decoder_norm`` (or None), ``output`` (or None
    when tied).

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
        ffn_dim: int = 2048,
        num_heads: int = 8,
        num_layers: int = 6,
        *,
        share_all_embeddings: bool = False,
        share_decoder_input_output_embed: bool = True,
        padding_idx: int = PADDING_IDX,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        normalize_before: bool = False,
    ) -> None:
        super().__init__()
        if share_all_embeddings and src_vocab != tgt_vocab:
            raise ValueError(
                "share_all_embeddings needs a joined dictionary, got src_vocab="
                f"{src_vocab} and tgt_vocab={tgt_vocab}"
            )
        if share_all_embeddings and not share_decoder_input_output_embed:
            raise ValueError(
                "share_all_embeddings also ties the output layer; it needs "
                "share_decoder_input_output_embed=True"
            )
        if d_model % num_heads:
            raise ValueError(f"d_model must divide by num_heads, got {d_model} and {num_heads}")
        if d_model < 4 or num_layers < 1:
            raise ValueError(f"need d_model >= 4 and num_layers >= 1, got {d_model}, {num_layers}")
        if not (0 <= padding_idx < src_vocab and padding_idx < tgt_vocab):
            raise ValueError(
                f"padding_idx must index both vocabularies, got {padding_idx} for "
                f"{src_vocab} and {tgt_vocab}"
            )
        check_dropout(
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation_dropout=activation_dropout,
        )
        self.d_model = d_model
        self.ffn_dim = ffn_dim
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.padding_idx = padding_idx
        self.share_all_embeddings = share_all_embeddings
        self.share_decoder_input_output_embed = share_decoder_input_output_embed
        self.normalize_before = normalize_before
        self.embed_scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)
        self.encoder_embedding = nn.Embedding(src_vocab, d_model, padding_idx=padding_idx)
        self.decoder_embedding = (
            self.encoder_embedding
            if share_all_embeddings
            else nn.Embedding(tgt_vocab, d_model, padding_idx=padding_idx)
        )
        layer = {
            "d_model": d_model,
            "nhead": num_heads,
            "dim_feedforward": ffn_dim,
            "dropout": dropout,
            "activation": "relu",
            "batch_first": False,
            "norm_first": normalize_before,
        }
        self.encoder_layers = nn.ModuleList(
            nn.TransformerEncoderLayer(**layer) for _ in range(num_layers)
        )
        self.decoder_layers = nn.ModuleList(
            nn.TransformerDecoderLayer(**layer) for _ in range(num_layers)
        )
        for each in (*self.encoder_layers, *self.decoder_layers):
            _set_dropouts(each, attention_dropout, activation_dropout)
        # fairseq has a final LayerNorm only after pre-norm stacks
        self.encoder_norm = nn.LayerNorm(d_model) if normalize_before else None
        self.decoder_norm = nn.LayerNorm(d_model) if normalize_before else None
        self.output = (
            None if share_decoder_input_output_embed else nn.Linear(d_model, tgt_vocab, bias=False)
        )
        self.init_weights()

    def init_weights(self) -> None:
        """fairseq's initialisation (``transformer.py``, ``multihead_attention.py``).

        Embeddings N(0, d^-0.5) with a zero pad row; an untied output layer N(0, d^-0.5);
        FFN Linears xavier-uniform with zero bias; attention: q, k and v weights each
        xavier-uniform with gain 1/sqrt(2), their biases U(-d^-0.5, d^-0.5) (fairseq leaves
        nn.Linear's default there), the output projection xavier-uniform with zero bias;
        LayerNorms at weight 1, bias 0.
        """
        d = self.d_model
        for module in self.modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=d**-0.5)
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.MultiheadAttention):
                for projection in module.in_proj_weight.chunk(3):  # q, k, v: (d, d) each
                    nn.init.xavier_uniform_(projection, gain=2**-0.5)
                nn.init.uniform_(module.in_proj_bias, -(d**-0.5), d**-0.5)
                nn.init.xavier_uniform_(module.out_proj.weight)
                nn.init.zeros_(module.out_proj.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for each in (*self.encoder_layers, *self.decoder_layers):
            for linear in (each.linear1, each.linear2):
                nn.init.xavier_uniform_(linear.weight)
                nn.init.zeros_(linear.bias)
        if self.output is not None:
            nn.init.normal_(self.output.weight, std=d**-0.5)

    def _embed(
        self,
        table: nn.Embedding,
        tokens: Tensor,
        padding_mask: Tensor,
        *,
        offset: int = 0,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Scaled token embeddings plus sinusoidal positions, dropout, time-major; ``offset``
        unpadded tokens precede ``tokens`` (incremental decoding); ``positions`` numbers them
        instead (packed rows).

        Shape:
            tokens (B, T); padding_mask (B, T) bool; positions (B, T) int64 or None
            -> (T, B, d_model)
        """
        x = table(tokens) * self.embed_scale  # (B, T, d)
        vectors = sinusoidal_positions(
            padding_mask, self.d_model, self.padding_idx, offset=offset, positions=positions
        )
        x = self.dropout(x + vectors.to(x.dtype))
        return x.transpose(0, 1)  # (T, B, d)

    def _per_head(self, mask: Tensor) -> Tensor:
        """A per-row additive mask as ``nn.MultiheadAttention`` takes it, one copy per head.

        Shape:
            (B, T, S) -> (B * H, T, S), row b * H + h for head h of row b
        """
        return mask.repeat_interleave(self.num_heads, dim=0)

    def encode(
        self,
        src_tokens: Tensor,
        src_padding_mask: Tensor | None = None,
        packing: PackedRows | None = None,
    ) -> Tensor:
        """The encoder output, time-major; with ``packing``, each pair of a row attends within
        itself (:mod:`src.models.packing`).

        Shape:
            src_tokens (B, S); src_padding_mask (B, S) bool or None -> (S, B, d_model)
        """
        if src_padding_mask is None:
            src_padding_mask = src_tokens.eq(self.padding_idx)
        positions = None if packing is None else packing.source_positions
        x = self._embed(
            self.encoder_embedding, src_tokens, src_padding_mask, positions=positions
        )  # (S, B, d)
        # the padding, or each pair of a packed row within itself (B * H, S, S)
        pad, within = src_padding_mask, None
        if packing is not None:
            pad, within = None, self._per_head(segment_mask(packing.source_segments, x.dtype))
        for layer in self.encoder_layers:
            x = layer(x, src_mask=within, src_key_padding_mask=pad)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x

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
            or None (no padding) -> (B, T, V_tgt)
        """
        tgt_padding_mask = prev_output_tokens.eq(self.padding_idx)
        positions = None if packing is None else packing.target_positions
        x = self._embed(
            self.decoder_embedding, prev_output_tokens, tgt_padding_mask, positions=positions
        )  # (T, B, d)
        if packing is None:
            length = prev_output_tokens.shape[1]
            causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            self_padding_mask = keys_to_mask(tgt_padding_mask)  # fairseq's rule (models/padding)
            memory_padding_mask, across = src_padding_mask, None
        else:
            # each pair of a packed row within itself, causally, and to its own source
            segments = packing.target_segments
            causal = self._per_head(segment_mask(segments, x.dtype, causal=True))
            across = self._per_head(cross_segment_mask(segments, packing.source_segments, x.dtype))
            self_padding_mask = memory_padding_mask = None
        for layer in self.decoder_layers:
            x = layer(
                x,
                encoder_out,
                tgt_mask=causal,
                memory_mask=across,
                tgt_key_padding_mask=self_padding_mask,
                memory_key_padding_mask=memory_padding_mask,
            )
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self._output(x)

    def decode_step(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Tensor,
        src_padding_mask: Tensor | None,
        state: KeyValueState | None,
    ) -> tuple[Tensor, KeyValueState]:
        """Logits of the next target tokens for new decoder inputs, given the earlier ones' state.

        ``prev_output_tokens`` continues the unpadded prefix ``state`` has seen (None before the
        first step), so the logits equal :meth:`decode`'s on the whole prefix at these positions.
        Each layer runs on the new positions only; the first step projects the encoder output's
        keys/values, later ones reuse them, so pass the same ``encoder_out`` every step.

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
        if state is None:
            for layer in self.decoder_layers:
                _check_decoder_layer(layer)
        else:
            cached = state.layers[0].encoder_keys  # (B, H, S, d_h)
            if (cached.shape[0], cached.shape[2]) != (encoder_out.shape[1], encoder_out.shape[0]):
                raise ValueError(
                    f"the state's encoder keys/values are over (B, S) = ({cached.shape[0]}, "
                    f"{cached.shape[2]}), got encoder_out of (S, B) = "
                    f"{tuple(encoder_out.shape[:2])}"
                )
        past = 0 if state is None else state.length
        new = prev_output_tokens.shape[1]
        no_pad = torch.zeros_like(prev_output_tokens, dtype=torch.bool)  # (B, T)
        # (T, B, d)
        x = self._embed(self.decoder_embedding, prev_output_tokens, no_pad, offset=past)
        # new position i reads the cached ones and the new ones up to itself
        causal = (
            None
            if new == 1
            else torch.ones(new, past + new, dtype=torch.bool, device=x.device).tril(past)
        )  # (T, length + T)
        encoder_mask = (
            None if src_padding_mask is None else ~src_padding_mask[:, None, None, :]
        )  # (B, 1, 1, S)
        caches = []
        for i, layer in enumerate(self.decoder_layers):
            x, cache = _decoder_layer_step(
                layer,
                x,
                None if state is None else state.layers[i],
                encoder_out,
                encoder_mask,
                causal,
            )
            caches.append(cache)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self._output(x), KeyValueState(past + new, tuple(caches))

    def _output(self, x: Tensor) -> Tensor:
        """The decoder's last hidden states scored against the target vocabulary.

        Shape:
            (T, B, d_model) -> (B, T, V_tgt)
        """
        x = x.transpose(0, 1)  # (B, T, d)
        if self.output is not None:
            return self.output(x)
        return F.linear(x, self.decoder_embedding.weight)  # (B, T, V_tgt)

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

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, ffn_dim={self.ffn_dim}, num_heads={self.num_heads}, "
            f"num_layers={self.num_layers}, normalize_before={self.normalize_before}, "
            f"share_all_embeddings={self.share_all_embeddings}, "
            f"share_decoder_input_output_embed={self.share_decoder_input_output_embed}"
        )
