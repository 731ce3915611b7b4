"""Transformer-XL relative multi-head attention against the formula written out (Dai et al.,
2019, Sec. 3.3), with and without memory, in both norm placements; its parameter count."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from src.ops.relative_multihead_attention import RelativeMultiHeadAttention

D, H = 16, 4
D_HEAD = D // H


def written_out(
    layer: RelativeMultiHeadAttention,
    h: Tensor,
    r: Tensor,
    u: Tensor,
    v: Tensor,
    memory: Tensor | None,
) -> Tensor:
    """``(q + u) k^T + (q + v) rk[distance]^T`` over the keys a query may see, scaled, softmax."""
    batch, qlen, _ = h.shape
    context = h if memory is None else torch.cat([memory, h], dim=1)  # (B, K, D)
    klen = context.shape[1]
    mlen = klen - qlen
    if layer.pre_norm:
        context = layer.norm(context)
    w_q, w_k, w_v = layer.qkv_net.weight.split(D)
    q = (context[:, mlen:] @ w_q.T).view(batch, qlen, H, D_HEAD)
    k = (context @ w_k.T).view(batch, klen, H, D_HEAD)
    values = (context @ w_v.T).view(batch, klen, H, D_HEAD)
    rk = (r @ layer.r_net.weight.T).view(klen, H, D_HEAD)  # row n: distance klen - 1 - n
    i = torch.arange(qlen)[:, None]
    j = torch.arange(klen)[None, :]
    visible = j <= mlen + i  # (T, K)
    row = (klen - 1 - (mlen + i - j)).clamp(0, klen - 1)  # (T, K): the row of distance i - j
    content = torch.einsum("bihd,bjhd->bhij", q + u, k)
    position = torch.einsum("bihd,bhijd->bhij", q + v, rk[row].permute(2, 0, 1, 3)[None])
    scores = ((content + position) / math.sqrt(D_HEAD)).masked_fill(~visible, float("-inf"))
    attended = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), values).reshape(batch, qlen, D)
    out = h + layer.o_net(attended)
    return out if layer.pre_norm else layer.norm(out)


@pytest.mark.parametrize("pre_norm", [False, True])
@pytest.mark.parametrize("mlen", [0, 3])
def test_equals_the_formula(pre_norm: bool, mlen: int) -> None:
    torch.manual_seed(0)
    layer = RelativeMultiHeadAttention(D, H, dropout=0.2, dropatt=0.2, pre_norm=pre_norm)
    layer = layer.double().eval()
    layer.attention, layer.impl = "eager", "reference"
    h = torch.randn(2, 5, D, dtype=torch.float64)
    memory = torch.randn(2, mlen, D, dtype=torch.float64) if mlen else None
    r = torch.randn(mlen + 5, D, dtype=torch.float64)
    u, v = torch.randn(H, D_HEAD, dtype=torch.float64), torch.randn(H, D_HEAD, dtype=torch.float64)
    expected = written_out(layer, h, r, u, v, memory)
    torch.testing.assert_close(layer(h, r, u, v, memory), expected, rtol=0, atol=1e-12)


def test_parameters_and_checks() -> None:
    layer = RelativeMultiHeadAttention(D, H)
    assert sum(p.numel() for p in layer.parameters()) == 5 * D * D + 2 * D
    with pytest.raises(ValueError, match="divisible"):
        RelativeMultiHeadAttention(D, 3)
    with pytest.raises(ValueError, match="r must be"):
        layer(
            torch.randn(1, 4, D), torch.randn(3, D), torch.randn(H, D_HEAD), torch.randn(H, D_HEAD)
        )
