"""Group-Transformer ops against the official implementation's stored outputs (clovaai, eval mode).

The fixtures are time-major ``[len, bsz, C]``; they are turned batch-first here, at the boundary.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor

from src.compat.group_transformer import from_official
from src.kernels.dispatch import triton_available
from src.ops.group_attention import GroupAttention
from src.ops.group_embedding import GroupEmbedding
from src.ops.group_feedforward import GroupFeedForward
from src.ops.relative_position import (
    RelativePositionTable,
    causal_memory_mask,
    rel_shift,
    relative_attention_scores,
)
from src.ops.shuffle import feature_shuffle
from tests.parity.reference import fixtures, load

ATOL = 1e-5


def batch_first(x: Tensor) -> Tensor:
    """``[len, bsz, ...]`` -> ``(bsz, len, ...)``."""
    return x.transpose(0, 1)


def assert_close(actual: Tensor, expected: Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0.0)


@pytest.mark.parametrize("path", fixtures("group_transformer", "group_embedding*.pt"))
def test_group_embedding_matches_official(path: Path) -> None:
    fx = load(path)
    config, out = fx["config"], fx["output"]
    emb = from_official(fx["state_dict"], config).eval()
    assert isinstance(emb, GroupEmbedding)
    with torch.no_grad():
        x = emb(fx["input"]["tokens"].T)  # (B, T, D)
    assert_close(x, batch_first(out["embed"]))
    for groups in config["groups_shown"]:
        grouped = x.unflatten(-1, (groups, config["d_model"] // groups))  # (B, T, G, D/G)
        assert_close(grouped, batch_first(out[f"embed_grouped_G{groups}"]))

    table = RelativePositionTable(config["pos_max_len"], config["d_model"])
    assert_close(table.table.detach(), out["pos_enc_init_table"])
    assert_close(table(config["pos_klen"]).detach(), out["pos_emb_klen10"][:, 0])


def _attention_case(fx: dict, suffix: str) -> None:
    inputs, inter = fx[f"input{suffix}"], fx[f"intermediates{suffix}"]
    attn = from_official(fx["state_dict"], fx["config"]).eval()
    assert isinstance(attn, GroupAttention)
    h = batch_first(inputs["w"])
    memory = batch_first(inputs["mems"]) if "mems" in inputs else None
    r = inputs["r"][:, 0]  # (K, 1, D) -> (K, D)
    qlen, klen = inputs["attn_mask"].shape
    assert torch.equal(causal_memory_mask(qlen, klen - qlen), inputs["attn_mask"])
    with torch.no_grad():
        out = attn(h, r, inputs["r_w_bias"], inputs["r_r_bias"], memory=memory)
        context = h if memory is None else torch.cat([memory, h], 1)
        for impl in ("reference", "triton") if triton_available() else ("reference",):
            # the fused norm kernel (Triton's interpreter without CUDA) against the official too
            attn.q_norm.impl = attn.kv_norm.impl = impl
            assert_close(attn.q_norm(h), batch_first(inter["q_norm_out"]))
            assert_close(attn.kv_norm(context), batch_first(inter["kv_norm_out"]))
        attn.q_norm.impl = attn.kv_norm.impl = "auto"
        assert_close(attn.r_net(r), inter["r_proj"])

    # the score pieces, from the official intermediates: (K, B, H, dh) -> (B, H, K, dh)
    heads = (attn.n_head, attn.d_head)
    k = inter["k_proj"].unflatten(-1, heads).permute(1, 2, 0, 3)
    q = inter["q_heads"].permute(1, 2, 0, 3) if "q_heads" in inter else None
    bd = inter["BD_unshifted"].permute(2, 3, 0, 1)  # (T, K, B, H) -> (B, H, T, K)
    assert_close(rel_shift(bd), inter["BD_shifted"].permute(2, 3, 0, 1))
    if q is not None:
        rk = inter["r_proj"].unflatten(-1, heads).transpose(0, 1)  # (H, K, dh)
        scores = relative_attention_scores(q, k, rk, inputs["r_w_bias"], inputs["r_r_bias"])
        scores = (scores * fx["config"]["scale"]).masked_fill(inputs["attn_mask"], float("-inf"))
        assert_close(scores.softmax(-1), inter["attn_prob"].permute(2, 3, 0, 1))

    assert_close(out, batch_first(fx[f"output{suffix}"]["out"]))


@pytest.mark.parametrize("path", fixtures("group_transformer", "group_attention_*.pt"))
def test_group_attention_matches_official(path: Path) -> None:
    fx = load(path)
    _attention_case(fx, "")


@pytest.mark.parametrize("path", fixtures("group_transformer", "group_attention_*.pt"))
def test_group_attention_without_memory_matches_official(path: Path) -> None:
    fx = load(path)
    if "input_nomem" not in fx:
        pytest.skip(f"{path.name} has no memory-free case")
    _attention_case(fx, "_nomem")


@pytest.mark.parametrize("path", fixtures("group_transformer", "group_ffn_*.pt"))
def test_group_feedforward_matches_official(path: Path) -> None:
    fx = load(path)
    config, inter = fx["config"], fx["intermediates"]
    ffn = from_official(fx["state_dict"], config).eval()
    assert isinstance(ffn, GroupFeedForward)
    x = batch_first(fx["input"]["x"])
    perm = feature_shuffle(torch.arange(config["d_model"]), config["n_group"])
    assert torch.equal(perm, fx["shuffle_perm"])
    with torch.no_grad():
        out = ffn(x)
        assert_close(ffn.inter_norm(x), batch_first(inter["lnorm1_out"]))
        assert_close(ffn.inter_linear(ffn.inter_norm(x)), batch_first(inter["inter_shuffled"]))
    assert_close(out, batch_first(fx["output"]["out"]))
