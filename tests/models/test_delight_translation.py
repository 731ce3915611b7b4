"""The DeLighT translation network: official parameter counts, shapes, masks, ties, gradients.

The parameter counts come from instantiating the official models (``params.json`` in the DeLighT
reference folder, README "Parameter counts"); without that folder those tests skip. The others
run on a tiny model.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from src.models.delight_mt import DeLighTEmbedding, DeLighTEncoderDecoder, recurrent_dropout
from src.models.fairseq_init import PADDING_IDX
from tests.parity.reference import reference_dir

TINY = {"d_model": 64, "n_min": 2, "n_max": 3, "width_multiplier": 2.0}
VOCAB = 50
B, S, T = 3, 7, 6


def _reference(key: str) -> list:
    """pytest params, one per entry of ``params.json[key]``, or one skipped param."""
    path = reference_dir() / "delight" / "params.json"
    if not path.is_file():
        reason = (
            f"no DeLighT parameter counts at {path}; set REFERENCE_DIR to the folder holding "
            "the official-implementation fixtures"
        )
        return [pytest.param(None, id=f"{key}-absent", marks=pytest.mark.skip(reason=reason))]
    entries = json.loads(path.read_text())[key]
    if isinstance(entries, dict):  # mt_readme_dims_non_lookup: d_m -> counts
        entries = [{"d_m": int(d_m), **counts} for d_m, counts in entries.items()]
    return [
        pytest.param(entry, id=f"{entry.get('label', 'd_m')}-{entry['d_m']}") for entry in entries
    ]


def _official_wmt14_en_de() -> dict[str, Any]:
    path = reference_dir() / "delight" / "params.json"
    rows = json.loads(path.read_text())["mt"]
    return next(row for row in rows if row["label"] == "WMT14 En-De")


def _count(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _build(row: dict[str, Any], d_model: int | None = None) -> DeLighTEncoderDecoder:
    return DeLighTEncoderDecoder(
        row["vocab_src"],
        row["vocab_tgt"],
        d_model=row["d_m"] if d_model is None else d_model,
        n_min=row["N_min"],
        n_max=row["N_max"],
        width_multiplier=row["w_m"],
        share_all_embeddings=row["share_all_embeddings"],
        share_decoder_input_output_embed=row["share_decoder_input_output_embed"],
        num_blocks=row["blocks_B"],
    )


def _lookup_params(model: DeLighTEncoderDecoder) -> int:
    tables = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(w.numel() for w in tables.values())


def _final_norm_params(model: nn.Module, side: str) -> int:
    return sum(
        _count(child)
        for name, child in model.named_children()
        if name.startswith(side) and isinstance(child, nn.LayerNorm)
    )


# breakdown key -> the part of the model it counts
BREAKDOWN = {
    "encoder_embedding_dextra": lambda m: _count(m.encoder_embedding.dextra),
    "decoder_embedding_dextra": lambda m: _count(m.decoder_embedding.dextra),
    "encoder_blocks": lambda m: _count(m.encoder_blocks),
    "decoder_blocks": lambda m: _count(m.decoder_blocks),
    # post-norm MT: no LayerNorm after either stack (the completeness check below holds it to 0)
    "encoder_final_ln": lambda m: _final_norm_params(m, "encoder"),
    "decoder_final_ln": lambda m: _final_norm_params(m, "decoder"),
    "decoder_project_out_dim(d_m->128, no bias)": lambda m: _count(m.project_out),
}


def _dextra_structure(dextra: nn.Module) -> dict[str, list[int]]:
    plan = dextra.plan
    return {
        "groups": list(plan.groups),
        "glt_in": list(plan.in_widths),
        "glt_out": list(plan.out_widths),
    }


@pytest.mark.parametrize("row", _reference("mt"))
def test_mt_params_match_official(row: dict[str, Any]) -> None:
    model = _build(row)
    # unique parameters: a tied table once, as the official count
    assert sum(p.numel() for p in model.parameters()) == row["total_params"]
    assert model.max_groups == row["max_glt_groups"]
    assert _lookup_params(model) == row["lookup_table_params"]
    assert (
        sum(p.numel() for p in model.parameters()) - _lookup_params(model)
        == row["non_lookup_params"]
    )
    assert set(row["breakdown"]) <= set(BREAKDOWN), sorted(set(row["breakdown"]) - set(BREAKDOWN))
    for key, expected in row["breakdown"].items():
        assert BREAKDOWN[key](model) == expected, key
    # nothing outside the mapped parts, the tables and an untied output layer
    mapped = sum(count(model) for count in BREAKDOWN.values())
    assert mapped + _lookup_params(model) + _count(model.output) == row["total_params"]


@pytest.mark.parametrize("row", _reference("mt"))
def test_mt_blocks_match_official(row: dict[str, Any]) -> None:
    """Per block: depth, width multiplier, DExTra plan and parameters; the embedding DExTras."""
    model = _build(row)
    emb = row["embedding_dextra"]
    for embedding in (model.encoder_embedding, model.decoder_embedding):
        dextra = embedding.dextra
        assert (dextra.in_features, dextra.in_proj_features, dextra.out_features) == (
            emb["in_features"],
            emb["in_proj_features"],
            emb["out_features"],
        )
        assert _dextra_structure(dextra) == {k: emb[k] for k in ("groups", "glt_in", "glt_out")}
        assert _count(dextra) == emb["params"]
    for side in ("encoder_blocks", "decoder_blocks"):
        blocks = getattr(model, side)
        assert len(blocks) == len(row[side]) == row["blocks_B"]
        for (depth, width), block, expected in zip(model.scaling, blocks, row[side], strict=True):
            assert (depth, width) == (expected["N"], expected["width_multiplier"])
            assert _dextra_structure(block.dextra) == {
                k: expected[k] for k in ("groups", "glt_in", "glt_out")
            }
            assert _count(block.dextra) == expected["params"]
            assert _count(block) == expected["block_params"]


@pytest.mark.parametrize("dims", _reference("mt_readme_dims_non_lookup"))
def test_wmt14_en_de_widths_match_official(dims: dict[str, Any]) -> None:
    """The official README's WMT14 En-De widths: non-lookup and total parameters (V = 43736)."""
    model = _build(_official_wmt14_en_de(), d_model=dims["d_m"])
    total = sum(p.numel() for p in model.parameters())
    assert total - _lookup_params(model) == dims["non_lookup_params"]
    assert total == dims["total_en_de_V43736"]
    assert (model.project_out is None) == (dims["d_m"] == 128)


def _tiny(**overrides: Any) -> DeLighTEncoderDecoder:
    torch.manual_seed(0)
    kwargs = {"src_vocab": VOCAB, "tgt_vocab": VOCAB, **TINY, **overrides}
    return DeLighTEncoderDecoder(**kwargs).double().eval()


def _tokens(batch: int, length: int, vocab: int = VOCAB) -> torch.Tensor:
    # ids from 4 on: clear of <s>, <pad>, </s>, <unk>
    return torch.randint(4, vocab, (batch, length))


@pytest.mark.parametrize("share_all", [True, False])
def test_forward_shapes(share_all: bool) -> None:
    tgt_vocab = VOCAB if share_all else 40
    model = _tiny(tgt_vocab=tgt_vocab, share_all_embeddings=share_all)
    src, prev = _tokens(B, S), _tokens(B, T, tgt_vocab)
    logits = model(src, None, prev)
    assert logits.shape == (B, T, tgt_vocab) and logits.dtype == torch.float64
    assert model.encode(src).shape == (S, B, TINY["d_model"])
    assert model.encoder_embedding(src).shape == (B, S, TINY["d_model"])


def test_decoder_is_causal() -> None:
    model = _tiny()
    src, prev = _tokens(B, S), _tokens(B, T)
    changed = prev.clone()
    changed[:, -1] = (prev[:, -1] - 4 + 1) % (VOCAB - 4) + 4
    with torch.no_grad():
        before, after = model(src, None, prev), model(src, None, changed)
    assert torch.equal(before[:, :-1], after[:, :-1])
    assert not torch.equal(before[:, -1], after[:, -1])


@pytest.mark.parametrize("left_pad", [False, True])
def test_padded_source_tokens_do_not_matter(left_pad: bool) -> None:
    model = _tiny()
    src, prev = _tokens(B, S), _tokens(B, T)
    lengths = torch.tensor([S, S - 2, 3])
    pad = torch.arange(S) >= lengths[:, None]  # (B, S), right padding
    if left_pad:
        pad = pad.flip(1)
    src = src.masked_fill(pad, PADDING_IDX)
    noise = src.masked_scatter(pad, _tokens(B, S)[pad])
    with torch.no_grad():
        logits = model(src, None, prev)
        # the mask from padding_idx equals an explicit one, and with it the pads' ids are ignored
        assert torch.equal(model(src, pad, prev), logits)
        assert torch.equal(model(noise, pad, prev), logits)


def test_left_and_right_padding_agree() -> None:
    """Positions skip pads (fairseq): a left-padded sentence is translated as a right-padded one."""
    model = _tiny()
    src, prev = _tokens(1, S), _tokens(1, T)
    right = torch.cat((src[:, :5], torch.full((1, 2), PADDING_IDX)), dim=1)
    left = torch.cat((torch.full((1, 2), PADDING_IDX), src[:, :5]), dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(right, None, prev), model(left, None, prev))


def test_loss_backward_is_finite() -> None:
    model = _tiny(dropout=0.1, attention_dropout=0.1, dextra_dropout=0.1).float().train()
    src, prev = _tokens(B, S), _tokens(B, T)
    prev[0, -2:] = PADDING_IDX
    target = torch.roll(prev, -1, dims=1)
    logits = model(src, None, prev)
    loss = F.cross_entropy(
        logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=PADDING_IDX, label_smoothing=0.1
    )
    loss.backward()
    assert torch.isfinite(loss)
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    # the pad row gets no gradient from a lookup (the source table is not tied to the output)
    assert torch.count_nonzero(model.encoder_embedding.lookup.weight.grad[PADDING_IDX]) == 0


def test_shared_embeddings_are_one_parameter() -> None:
    wmt = _tiny(share_all_embeddings=True)
    table = wmt.encoder_embedding.lookup.weight
    assert wmt.decoder_embedding.lookup.weight is table and wmt.output is None
    assert sum(p is table for p in wmt.parameters()) == 1
    # each side keeps its own embedding DExTra
    assert wmt.encoder_embedding.dextra is not wmt.decoder_embedding.dextra
    iwslt = _tiny(tgt_vocab=40)
    assert iwslt.decoder_embedding.lookup.weight is not iwslt.encoder_embedding.lookup.weight
    assert iwslt.output is None  # share_decoder_input_output_embed: scores with the table
    untied = _tiny(share_decoder_input_output_embed=False)
    assert isinstance(untied.output, nn.Linear) and untied.output.bias is None
    assert untied(_tokens(B, S), None, _tokens(B, T)).shape == (B, T, VOCAB)


def test_share_all_needs_a_joined_dictionary() -> None:
    with pytest.raises(ValueError, match="joined dictionary"):
        DeLighTEncoderDecoder(VOCAB, VOCAB + 8, **TINY, share_all_embeddings=True)


def test_init_follows_official() -> None:
    model = _tiny().float()
    table = model.encoder_embedding.lookup.weight
    assert torch.count_nonzero(table[PADDING_IDX]) == 0
    assert abs(table.std().item() - 128**-0.5) < 0.01
    glt = model.encoder_blocks[0].dextra.glts[1]  # (g, d_in/g, d_out/g)
    g, d_in, d_out = glt.weight.shape
    bound = math.sqrt(6.0 / (d_in * d_out + g * d_out))  # xavier on the 3-d tensor
    assert glt.weight.abs().max() <= bound and torch.count_nonzero(glt.bias) == 0
    assert model.project_out.weight.abs().max() <= math.sqrt(6.0 / (TINY["d_model"] + 128))


def test_no_projection_at_embedding_width() -> None:
    model = DeLighTEncoderDecoder(VOCAB, VOCAB, d_model=128, n_min=2, n_max=3)
    assert model.project_out is None
    assert model(_tokens(B, S), None, _tokens(B, T)).shape == (B, T, VOCAB)


def test_embedding_dropout_is_per_sequence() -> None:
    x = torch.ones(4, 9, 32)
    y = recurrent_dropout(x, 0.5, training=True)
    assert torch.equal(y, y[:, :1].expand_as(y))  # one mask over all time steps
    assert torch.equal(recurrent_dropout(x, 0.5, training=False), x)


def test_embedding_scales_the_lookup() -> None:
    torch.manual_seed(0)
    embedding = DeLighTEmbedding(VOCAB, 64, width_multiplier=2.0, depth=2, max_groups=2)
    unscaled = DeLighTEmbedding(
        VOCAB, 64, width_multiplier=2.0, depth=2, max_groups=2, scale_embedding=False
    )
    assert embedding.embed_scale == math.sqrt(128) and unscaled.embed_scale == 1.0
    unscaled.load_state_dict(embedding.state_dict())
    embedding.eval()
    unscaled.eval()
    tokens = _tokens(2, 5)
    unscaled.lookup.weight.data.mul_(math.sqrt(128))
    with torch.no_grad():
        torch.testing.assert_close(embedding(tokens), unscaled(tokens))
