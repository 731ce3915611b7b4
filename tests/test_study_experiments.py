"""The study's experiments at widths where DeLighT's ideas act: each compared pair within 1% of
parameters, the DExTra GLTs grouping by g_max = 8 wherever a block's depth reaches it, and the
translation pair's larger test split."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn

from src.models.delight_mt import DeLighTEncoderDecoder
from src.models.text_classifier import DeLighTClassifier
from src.ops.dextra import dextra_max_groups
from tests.conftest import compose_config

MT_DELIGHT, MT_TRANSFORMER = "delight_mt/study", "delight_mt/transformer_mt_study"
# a DExTra of depth N expands in ceil(N / 2) GLTs of 2, 4, 8, ... groups, then mirrors them
GROUPS = {
    3: (2, 4, 2),
    4: (2, 4, 4, 2),
    5: (2, 4, 8, 4, 2),
    6: (2, 4, 8, 8, 4, 2),
    7: (2, 4, 8, 8, 8, 4, 2),
    8: (2, 4, 8, 8, 8, 8, 4, 2),
}


def composed(experiment: str, *overrides: str) -> DictConfig:
    return compose_config("train", [f"experiment={experiment}", *overrides])


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def block_groups(model: nn.Module) -> list[tuple[int, tuple[int, ...]]]:
    """(N, GLT groups) of every block's DExTra, encoder then decoder."""
    if isinstance(model, DeLighTEncoderDecoder):
        blocks = [*model.encoder_blocks, *model.decoder_blocks]
        depths = [n for n, _ in model.scaling] * 2
    else:
        blocks, depths = list(model.blocks), [n for n, _ in model.scaling]
    return [(n, block.dextra.plan.groups) for n, block in zip(depths, blocks, strict=True)]


def test_the_mt_study_pair_has_equal_parameters() -> None:
    delight = instantiate(composed(MT_DELIGHT).model)
    transformer = instantiate(composed(MT_TRANSFORMER).model)
    assert (count(delight), count(transformer)) == (2_540_608, 2_547_392)
    assert abs(count(transformer) / count(delight) - 1) < 0.01


def test_the_mt_study_delight_groups_its_glts_by_eight() -> None:
    cfg = composed(MT_DELIGHT)
    model = instantiate(cfg.model)
    d_m, n_min, n_max = cfg.model.d_model, cfg.model.n_min, cfg.model.n_max
    assert n_min >= 3 and n_max >= 2 * n_min
    # the official g_max, 2^ceil(log2(d_m / 32)), is 4 up to d_m 128: d_m 160 is the first with 8
    assert [dextra_max_groups(d) for d in (96, 128, 160)] == [4, 4, 8]
    assert model.max_groups == 8
    groups = block_groups(model)
    assert [n for n, _ in groups[:6]] == [3, 3, 4, 4, 5, 6]
    assert all(g == GROUPS[n] for n, g in groups)
    assert max(max(g) for _, g in groups) == 8
    assert min(n for n, g in groups if 8 in g) == 5
    assert model.encoder_embedding.dextra.plan.groups == GROUPS[n_min]
    # the IWSLT architecture's dropouts at this d_m
    assert cfg.model.dropout == cfg.model.ffn_dropout == round(0.3 * d_m / 512, 2) == 0.09
    assert cfg.model.attention_dropout == cfg.model.dextra_dropout == round(0.1 * d_m / 512, 2)


def test_the_mt_study_holds_out_a_larger_test_split(tmp_path) -> None:
    """15% of the messages for the test, in a root of its own; the warm-up is 8% of the run."""
    pytest.importorskip("django")
    pytest.importorskip("pycountry")
    configs = [composed(e, f"paths.data_dir={tmp_path}") for e in (MT_DELIGHT, MT_TRANSFORMER)]
    assert configs[0].data == configs[1].data
    default = compose_config("train", ["data=gettext_de_en", f"paths.data_dir={tmp_path}"])
    assert configs[0].data.test_percent == 15 and configs[0].data.root != default.data.root
    data = instantiate(configs[0].data)
    data.prepare_data()
    data.setup("fit")
    sizes = {split: len(pairs) for split, pairs in data.splits.items()}
    # the installed Django and pycountry catalogues (the default 5 / 5 split tests 262 pairs)
    assert sizes == {"train": 3913, "valid": 252, "test": 754}
    updates = len(data.train_dataloader()) * configs[0].trainer.max_epochs
    assert updates == 32 * 30
    for cfg in configs:
        assert cfg.task.scheduler.warmup_steps == round(0.08 * updates) == 77


SENTIMENT = {
    # experiment: (params, block_scaling, glt_shuffle)
    "study_scale_shift": (3_035_397, True, True),
    "study_shift": (2_605_955, False, True),
    "study_plain": (2_605_955, False, False),
}


@pytest.mark.parametrize("experiment", sorted(SENTIMENT))
def test_the_sentiment_study_delights_group_by_eight_where_n_allows(experiment: str) -> None:
    params, scaling, shuffle = SENTIMENT[experiment]
    model = instantiate(composed(f"delight_sentiment/{experiment}").model)
    assert isinstance(model, DeLighTClassifier)
    assert (model.d_model, len(model.blocks), model.max_groups) == (256, 6, 8)
    assert (model.block_scaling, model.glt_shuffle) == (scaling, shuffle)
    assert count(model) == params
    groups = block_groups(model)
    expected_depths = [4, 4, 5, 6, 7, 8] if scaling else [4] * 6
    assert [n for n, _ in groups] == expected_depths
    assert all(g == GROUPS[n] for n, g in groups)
    # 8 groups in every block deep enough for them (N >= 5), and only there
    assert all((8 in g) == (n >= 5) for n, g in groups)
    assert max(max(g) for _, g in groups) == (8 if scaling else 4)


def test_the_sentiment_transformer_matches_the_uniform_delight() -> None:
    cfg = composed("delight_sentiment/study_transformer")
    transformer = instantiate(cfg.model)
    delight = instantiate(composed("delight_sentiment/study_shift").model)
    assert count(transformer) == 2_616_563
    assert abs(count(transformer) / count(delight) - 1) < 0.01
    # wider than DeLighT's light FFN (d_m / 4 = 64)
    assert cfg.model.d_model == 256 and cfg.model.dim_feedforward >= 64
    assert cfg.model.dim_feedforward > delight.blocks[0].d_ffn == 64
