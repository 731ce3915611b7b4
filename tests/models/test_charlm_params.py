"""Parameter counts of Transformer-XL and Group-Transformer equal the official models'
(params.json).

``params.json`` (reference data) lists, for every row of the paper's Tables 2 and 3, the count of
the official models in several settings. Models are built on the meta device (no memory, no init).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from src.models.group_transformer import GroupTransformer
from src.models.transformer_xl import TransformerXL
from src.ops.group_attention import GroupAttention
from src.ops.group_feedforward import GroupFeedForward
from tests.parity.reference import reference_dir

N_TOKEN = 204  # enwik8
PARAMS = reference_dir() / "group_transformer" / "params.json"
needs_reference = pytest.mark.skipif(not PARAMS.is_file(), reason=f"no {PARAMS}; set REFERENCE_DIR")


def reference() -> dict:
    return json.loads(PARAMS.read_text())


def n_params(module: nn.Module) -> int:
    """Distinct parameters (tied tensors once); works on the meta device."""
    return sum(p.numel() for p in module.parameters())


def build(cls: type, **kwargs: object) -> nn.Module:
    with torch.device("meta"):
        return cls(N_TOKEN, **kwargs)


def shape(row: dict) -> dict:
    assert row["d_head"] * row["n_head"] == row["d_model"]
    return {k: row[k] for k in ("d_model", "n_head", "d_inner")} | {"n_layer": row["L"]}


def table2_rows(model: str) -> list:
    if not PARAMS.is_file():
        return [pytest.param({}, marks=needs_reference)]
    rows = [r for r in reference()["table2"] if r["model"].startswith(model)]
    return [
        pytest.param(r, id=f"L{r['L']}-D{r['d_model']}-H{r['n_head']}-G{r.get('n_group', 0)}")
        for r in rows
    ]


@needs_reference
@pytest.mark.parametrize("row", table2_rows("Transformer-XL"))
def test_transformer_xl_rows(row: dict) -> None:
    counts = row["params"]
    for tied in (True, False):
        name = "tied" if tied else "untied"
        assert (
            n_params(build(TransformerXL, **shape(row), tie_weight=tied))
            == counts[f"kimiyoung_official_{name}"]
        )
        # clovaai's model_type="xl": Transformer-XL layers plus out_norm and out_trans_layer
        xl = build(
            GroupTransformer,
            **shape(row),
            tie_weight=tied,
            learnable_pos=False,
            group_attention=False,
            group_ffn=False,
            pre_norm=False,
        )
        assert n_params(xl) == counts[f"clovaai_model_type_xl_{name}"]


@needs_reference
@pytest.mark.parametrize("row", table2_rows("Group-Transformer"))
def test_group_transformer_rows(row: dict) -> None:
    counts = row["params"]
    settings = {
        "pos1024": {"learnable_pos": True, "tgt_len": 512, "mem_len": 512},
        "pos768": {"learnable_pos": True, "tgt_len": 384, "mem_len": 384},
        "excluding_pos_enc": {"learnable_pos": False},
    }
    checked = 0
    for key, expected in counts.items():
        tied = "_tied_" in key
        (position,) = [v for k, v in settings.items() if key.endswith(k)]
        model = build(
            GroupTransformer, **shape(row), n_group=row["n_group"], tie_weight=tied, **position
        )
        assert n_params(model) == expected, key
        checked += 1
    assert checked == 6


def table3_rows() -> list:
    if not PARAMS.is_file():
        return [pytest.param({}, marks=needs_reference)]
    return [
        pytest.param(r, id=f"G{r['n_group']}-{r['variant']}")
        for r in reference()["table3_ablation"]
    ]


@needs_reference
@pytest.mark.parametrize("row", table3_rows())
def test_table3_ablation_rows(row: dict) -> None:
    attention, ffn = row["variant"].split("+")
    flags = {"group_attention": attention == "group_attention", "group_ffn": ffn == "group_ffn"}
    base = {
        "n_layer": 9,
        "d_model": 256,
        "n_head": 8,
        "d_inner": 1024,
        "n_group": row["n_group"],
        **flags,
    }
    script = build(
        GroupTransformer, **base, tie_weight=False, learnable_pos=True, tgt_len=512, mem_len=512
    )
    assert n_params(script) == row["params_in_group_framework_untied_with_pos_enc1024"]
    assert n_params(script.layers) == row["layers_params"]
    paper = build(GroupTransformer, **base, tie_weight=True, learnable_pos=False)
    assert n_params(paper) == row["params_clovaai_xl_tied_baseline_plus_layer_delta"]


@needs_reference
def test_per_module_counts() -> None:
    counts = reference()["per_module_params_d256_8heads"]
    with torch.device("meta"):
        for groups in (2, 4):
            assert (
                n_params(GroupAttention(256, 8, groups))
                == counts[f"GroupAttention_G{groups} (2D^2 + 5D^2/G + 4D)"]
            )
            ffn = GroupFeedForward(256, 1024, groups)
            assert (
                n_params(ffn)
                == counts[f"GroupFeedforward_G{groups} (13D^2/G + 20D with d_inner=4D)"]
            )


def test_inter_group_ablation_removes_inter_maps() -> None:
    full = build(
        GroupTransformer,
        n_layer=1,
        d_model=64,
        n_head=4,
        d_inner=256,
        n_group=2,
        learnable_pos=False,
    )
    intra = build(
        GroupTransformer,
        n_layer=1,
        d_model=64,
        n_head=4,
        d_inner=256,
        n_group=2,
        learnable_pos=False,
        inter_group=False,
    )
    d, g = 64, 2
    # attention: two D -> D/G maps; FFN: the grouped inter map, its bias and norm, half of the
    # first linear's input and of its input norm
    removed = 2 * d * d // g + (d * d // g + d + 2 * d) + (d * 256 // g) + 2 * d
    assert n_params(full) - n_params(intra) == removed
