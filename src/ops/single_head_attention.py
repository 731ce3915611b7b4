"""DeLighT's single-head attention (thesis Sec. 5.3.2, Eq. 5.3; Mehta et al., 2021, Sec. 3.2).

After the DeLighT transformation has reduced the residual width d_model to d_o = d_model / 2, one
head of width d_o attends: ``softmax(Q K^T / sqrt(d_o)) V``, and ``out_proj`` maps d_o back to
d_model. The attention cost is O(d_o n^2), half that of a d_model-wide multi-head layer.

Official semantics (sacmehta/delight, ``single_head_attention.py``), all reproduced here:

- Self-attention projects its input with **one** Linear(d_o -> 3 d_o) whose output is split into
  q, k, v **in that order** (the official parameter is named ``linear_kqv``).
- Encoder-decoder attention projects the query from the d_model residual stream (no DExTra) with
  Linear(d_model -> d_o) and keys and values from the encoder output with Linear(d_model -> 2 d_o),
  split (k, v).
- q is scaled by d_o^-0.5 after its bias; an additive float mask is added to the scores and
  padded keys get -inf; the softmax runs in float32 for 16-bit inputs (in the input
  dtype otherwise); dropout acts on the probabilities.

Without ``need_weights`` the attention runs as PyTorch's fused ``scaled_dot_product_attention``
(one kernel each way on CUDA), which keeps those semantics; in 16 bits it differs from the official
code by rounding only, and is the closer of the two to exact (the official code rounds the scores
to 16 bits before its float32 softmax; the fused kernels do not).

For incremental decoding, :meth:`SingleHeadAttention.forward_step` takes a
:class:`KeyValueCache` of the keys and values already projected (the earlier target positions for
self-attention, the encoder output for encoder-decoder attention) and projects only what is new.
Every decoder layer reads the same encoder output, so :func:`encoder_keys_values` projects it for
all of them with one product (the layers' ``kv_proj`` weights stacked); the cross-attentions then
take their :class:`KeyValueCache` in place of the encoder output.

Layout is time-major, (T, B, C), as in the official code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.dispatch import autocast_known, check_impl
from src.kernels.dropout import dropout
from src.kernels.linear import linear, linear_weights

_HALF = (torch.float16, torch.bfloat16)


def causal_attention_mask(
    length: int,
    *,
    past_length: int = 0,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The additive future mask: 0 where a query may attend, -inf on later keys.

    Query i (of ``length`` new positions) sits at position ``past_length + i`` and sees the
    ``past_length`` cached keys and the new keys up to itself.

    Shape:
        (length, past_length + length)
    """
    return torch.full(
        (length, past_length + length), float("-inf"), device=device, dtype=dtype
    ).triu(1 + past_length)


@dataclass(frozen=True)
class KeyValueCache:
    """The projected keys and values one attention has seen so far (incremental decoding).

    Self-attention grows it by the new positions at every step; encoder-decoder attention fills it
    once from the encoder output.

    Shape:
        key, value (S, B, d_o), straight from the projection
    """

    key: Tensor
    value: Tensor

    def reorder(self, order: Tensor) -> KeyValueCache:
        """The cache of the sequences ``order`` picks, e.g. the surviving beams.

        Shape:
            order (B',) int64 indices into B -> key, value (S, B', d_o)
        """
        return KeyValueCache(self.key.index_select(1, order), self.value.index_select(1, order))


class SingleHeadAttention(nn.Module):
    """One attention head of width d_o between a query stream and a key/value stream.

    Self-attention attends over its input, the DExTra output of width d_o; encoder-decoder
    attention takes its query from the residual stream and its keys and values from the encoder
    output, both of width d_model. ``out_proj`` maps the head back to d_model.

    Args:
        d_model: the model width.
        d_o: the head width (d_model / 2 in DeLighT).
        cross_attention: encoder-decoder attention (queries and keys/values from different
            streams, separate projections) instead of self-attention.
        dropout: on the attention probabilities.
        impl: the projections' path (:func:`src.kernels.linear.linear`): "auto" (the GLT kernel on
            CUDA where it times faster than ``nn.Linear``), "triton" or "reference".

    Parameters: self-attention ``qkv_proj`` Linear(d_o -> 3 d_o); cross-attention ``q_proj``
    Linear(d_model -> d_o) and ``kv_proj`` Linear(d_model -> 2 d_o); ``out_proj``
    Linear(d_o -> d_model). All with bias.

    Shape:
        query (T, B, d_o) for self-attention, (T, B, d_model) for cross-attention; key_value
        (S, B, d_model) for cross-attention (or its keys and values already projected, a
        :class:`KeyValueCache` of (S, B, d_o)), None for self-attention (S = T); key_padding_mask
        (B, S) bool, True = padded key, or the same as an additive float mask
        (:func:`padding_bias`, built once for all layers); attn_mask (T, S) or (B, T, S) float,
        added to the scores (e.g. the pairs of packed rows: :mod:`src.models.packing`) -> output
        (T, B, d_model) and, with ``need_weights``, the attention probabilities (T, B, S) (before
        dropout), else None.
    """

    def __init__(
        self,
        d_model: int,
        d_o: int,
        *,
        cross_attention: bool = False,
        dropout: float = 0.0,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if min(d_model, d_o) < 1:
            raise ValueError(f"widths must be positive, got d_model={d_model}, d_o={d_o}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.d_o = d_o
        self.cross_attention = cross_attention
        self.dropout = dropout
        self.impl = check_impl(impl)
        self.scaling = d_o**-0.5
        if cross_attention:
            self.q_proj = nn.Linear(d_model, d_o)
            self.kv_proj = nn.Linear(d_model, 2 * d_o)
        else:
            self.qkv_proj = nn.Linear(d_o, 3 * d_o)
        self.out_proj = nn.Linear(d_o, d_model)

    def reset_parameters(self) -> None:
        for module in self.children():
            module.reset_parameters()

    def _project(self, x: Tensor, layer: nn.Linear) -> Tensor:
        # on CUDA the GLT kernel as one group where it times faster: no autocast casts of the
        # weight and bias (src/kernels/linear.py)
        return linear((x,), layer, impl=self.impl)

    def _keys_values(self, key_value: Tensor | KeyValueCache) -> KeyValueCache:
        """Cross-attention's keys and values: the encoder output projected, or as given.

        Shape:
            (S, B, d_model) or a cache of (S, B, d_o) -> key, value (S, B, d_o)
        """
        if isinstance(key_value, KeyValueCache):
            if key_value.key.shape[-1] != self.d_o or key_value.value.shape[-1] != self.d_o:
                raise ValueError(
                    f"projected keys and values must be (S, B, d_o={self.d_o}), got "
                    f"{tuple(key_value.key.shape)} and {tuple(key_value.value.shape)}"
                )
            return key_value
        return KeyValueCache(*self._project(key_value, self.kv_proj).chunk(2, dim=-1))

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | KeyValueCache | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        if self.cross_attention:
            if key_value is None:
                raise ValueError("cross-attention needs key_value (the encoder output)")
            q = self._project(query, self.q_proj)  # (T, B, d_o)
            projected = self._keys_values(key_value)
            k, v = projected.key, projected.value  # (S, B, d_o) each
        else:
            if key_value is not None:
                raise ValueError("self-attention takes no key_value; it attends over its query")
            q, k, v = self._project(query, self.qkv_proj).chunk(3, dim=-1)  # (T, B, d_o) each
        return self._attend(q, k, v, key_padding_mask, attn_mask, need_weights)

    def forward_step(
        self,
        query: Tensor,
        cache: KeyValueCache | None,
        key_value: Tensor | KeyValueCache | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
    ) -> tuple[Tensor, KeyValueCache]:
        """Attention for new query positions, reusing the cached keys and values.

        Self-attention appends the new positions' keys and values to ``cache`` (None before the
        first step); the caller masks the future with ``attn_mask`` when T > 1. Cross-attention
        projects ``key_value`` when ``cache`` is None and reuses the cache afterwards. Equals
        :meth:`forward` over the whole sequence at the new positions.

        Shape:
            query (T, B, d_o) for self-attention, (T, B, d_model) for cross-attention; cache
            key/value (S', B, d_o); key_value (S, B, d_model), only for cross-attention's first
            step; key_padding_mask (B, S); attn_mask (T, S), S counting the cached keys -> output
            (T, B, d_model) and the cache of all S keys
        """
        if self.cross_attention:
            if (cache is None) == (key_value is None):
                raise ValueError(
                    "cross-attention needs key_value (the encoder output) on its first step and "
                    "the cache, without key_value, afterwards"
                )
            q = self._project(query, self.q_proj)  # (T, B, d_o)
            if cache is None:
                cache = self._keys_values(key_value)
        else:
            if key_value is not None:
                raise ValueError("self-attention takes no key_value; it attends over its query")
            q, k, v = self._project(query, self.qkv_proj).chunk(3, dim=-1)  # (T, B, d_o) each
            if cache is not None:
                k = torch.cat((cache.key, k), dim=0)  # (S' + T, B, d_o)
                v = torch.cat((cache.value, v), dim=0)
            cache = KeyValueCache(k, v)
        out, _ = self._attend(q, cache.key, cache.value, key_padding_mask, attn_mask, False)
        return out, cache

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Scaled attention of projected queries over projected keys, then ``out_proj``.

        Shape:
            q (T, B, d_o), k and v (S, B, d_o) -> output (T, B, d_model), probabilities
            (T, B, S) or None
        """
        # (T, B, d_o) -> (B, T, d_o)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        if key_padding_mask is not None and key_padding_mask.shape != (k.shape[0], k.shape[1]):
            raise ValueError(
                f"key_padding_mask must be (B, S) = {(k.shape[0], k.shape[1])}, "
                f"got {tuple(key_padding_mask.shape)}"
            )
        if (
            attn_mask is not None
            and attn_mask.shape[-2:] != (q.shape[1], k.shape[1])
            or (attn_mask is not None and attn_mask.dim() == 3 and attn_mask.shape[0] != q.shape[0])
        ):
            raise ValueError(
                f"attn_mask must be (T, S) = {(q.shape[1], k.shape[1])} or (B, T, S) = "
                f"{(q.shape[0], q.shape[1], k.shape[1])}, got {tuple(attn_mask.shape)}"
            )
        p = self.dropout if self.training else 0.0
        # the masks as one additive float mask, -inf on padded keys (B or 1, T or 1, S)
        mask = _additive_mask(attn_mask, key_padding_mask, q.dtype)
        if need_weights:
            out, probs = _explicit_attention(q * self.scaling, k, v, mask, p)
        else:
            # PyTorch's fused attention: one kernel each way on CUDA where the explicit form runs
            # about ten. It agrees with the explicit form to rounding in float32/float64, and for
            # 16-bit inputs it also takes the softmax in float32 (CUDA's flash and memory-efficient
            # kernels accumulate the scores in float32; the CPU's math path upcasts), keeping the
            # scores unrounded where the explicit form rounds them to 16 bits first. It cannot
            # return probabilities. It scales q (the official code scales it after its bias) by
            # itself, which saves a launch each way and differs by rounding.
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, scale=self.scaling
            )
            probs = None
        # out_proj on the (B, T, d_o) layout the attention wrote, then seen as (T, B, d_model): on a
        # transposed input the projection would copy it first and add its bias separately
        out = self._project(out, self.out_proj).transpose(0, 1)
        return out, None if probs is None else probs.transpose(0, 1)  # (T, B, S)

    def extra_repr(self) -> str:
        kind = "cross" if self.cross_attention else "self"
        return f"{kind}, d_model={self.d_model}, d_o={self.d_o}, dropout={self.dropout}"


def _explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float
) -> tuple[Tensor, Tensor]:
    """The official computation, which also gives the probabilities: scores of the scaled q,
    plus ``mask`` (:func:`_additive_mask`), a softmax in float32 for 16-bit scores as officially
    (16-bit scores overflow and lose the small probabilities), dropout, the weighted sum.

    Shape:
        q (B, T, d), k and v (B, S, d), mask (B or 1, T or 1, S) or None -> output (B, T, d),
        probabilities (B, T, S)
    """
    scores = torch.bmm(q, k.transpose(1, 2))  # (B, T, S)
    if mask is not None:
        scores = scores + mask.to(scores.dtype)
    softmax_dtype = torch.float32 if scores.dtype in _HALF else scores.dtype
    probs = F.softmax(scores.to(softmax_dtype), dim=-1)
    dropped = dropout(probs, p, training=True) if p > 0 else probs
    return torch.bmm(dropped.to(v.dtype), v), probs


def _additive_mask(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None, dtype: torch.dtype
) -> Tensor | None:
    """attn_mask (T, S) or (B, T, S) and key_padding_mask (B, S) as one float mask
    (B or 1, T or 1, S)."""
    mask = None if attn_mask is None else attn_mask.to(dtype)
    if mask is not None and mask.dim() == 2:
        mask = mask.unsqueeze(0)  # (1, T, S)
    if key_padding_mask is not None:
        pad = padding_bias(key_padding_mask, dtype).unsqueeze(1)  # (B, 1, S)
        mask = pad if mask is None else mask + pad
    return mask


def padding_bias(key_padding_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A key padding mask as the additive mask the attention adds: 0 on real keys, -inf on pads.

    A model builds it once in the attention's dtype (:func:`attention_dtype`) and gives it to
    every layer, which then spend no launch on it; a float mask passes through (cast if need be).

    Shape:
        key_padding_mask (B, S) bool, True = pad, or float -> (B, S) float
    """
    if key_padding_mask.is_floating_point():
        return key_padding_mask.to(dtype)
    pad = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
    return pad.masked_fill(key_padding_mask, float("-inf"))


def attention_dtype(weight: Tensor) -> torch.dtype:
    """The dtype the attention's scores take for projections with ``weight``: autocast's where it
    is on for the weight's device, else the weight's."""
    device = weight.device.type
    if autocast_known(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


def encoder_keys_values(
    attentions: Sequence[SingleHeadAttention], encoder_out: Tensor
) -> list[KeyValueCache]:
    """Each cross-attention's keys and values of one encoder output, from one product.

    Every decoder layer projects the same encoder output with its own ``kv_proj``. With the
    layers' weights stacked, that is one product forward and one each for the input and weight
    gradients back, where L layers take L and 2L, and the L gradients of ``encoder_out`` come out
    of the product already summed (autograd adds them one launch at a time otherwise); one split
    of the gradient where there were L. The weights are concatenated at each call (one launch,
    and their gradients come back as views); each key and value equals its layer's own
    projection up to float rounding.

    Shape:
        encoder_out (S, B, d_model) -> L caches of key, value (S, B, d_o)
    """
    first = attentions[0]
    if any(not a.cross_attention for a in attentions):
        raise ValueError("encoder keys and values are for cross-attention layers")
    weight = torch.cat([a.kv_proj.weight for a in attentions])  # (L * 2 d_o, d_model)
    bias = torch.cat([a.kv_proj.bias for a in attentions])  # (L * 2 d_o,)
    kv = linear_weights((encoder_out,), weight, bias, impl=first.impl)  # (S, B, L * 2 d_o)
    # one split (one concatenation of gradients back): key then value of each layer in turn
    pieces = kv.split([a.d_o for a in attentions for _ in ("key", "value")], dim=-1)
    return [KeyValueCache(k, v) for k, v in zip(pieces[0::2], pieces[1::2], strict=True)]
