"""The DeLighT recipes and the paired demos read back with the official settings, and the demos
that are compared are fair by construction: N_min >= 3 and parameters within 1% of each other."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from src.models.delight_lm import DeLighTLanguageModel
from src.models.delight_mt import DeLighTEncoderDecoder
from src.models.transformer_lm import TransformerLanguageModel
from src.models.transformer_mt import TransformerEncoderDecoder
from src.optim.schedules import inverse_sqrt, warmup_linear
from tests.conftest import compose_config

GETTEXT_VOCAB = 2000  # the demo's SentencePiece size (data.sentencepiece_vocab_size)
PYDOC_WORDS_VOCAB = 2080  # words of pydoc_words with min_count 3 on Python 3.11


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def composed(*overrides: str):
    return compose_config("train", overrides)


def test_translation_uses_fairseqs_decoupled_weight_decay() -> None:
    """fairseq's Adam applies weight decay as p -= lr * wd * p: torch's AdamW."""
    cfg = composed("data=iwslt14_de_en", "model=transformer_mt")
    assert cfg.task.optimizer._target_ == "torch.optim.AdamW"
    assert list(cfg.task.optimizer.betas) == [0.9, 0.98]
    assert cfg.task.optimizer.weight_decay == 1e-4


@pytest.mark.parametrize(
    ("overrides", "d_model", "lr", "dropout", "attention"),
    [
        (["data=iwslt14_de_en", "model=delight_mt"], 320, 1.2e-3, 0.19, 0.06),
        (["experiment=delight_mt/iwslt_d384"], 384, 1e-3, 0.22, 0.08),
        (["experiment=delight_mt/iwslt_d480"], 480, 8e-4, 0.28, 0.09),
        (["experiment=delight_mt/iwslt_d512"], 512, 7.5e-4, 0.3, 0.1),
    ],
)
def test_iwslt_delight_follows_the_maintainers_command(
    overrides: list[str], d_model: int, lr: float, dropout: float, attention: float
) -> None:
    """sacmehta/delight issue #8: adam (0.9, 0.98), weight decay 1e-4, linear schedule with 4,000
    warm-up updates from 1e-7, lr 1e-3 at d_m 384 (scaled by 384 / d_m), 50,000 updates."""
    cfg = composed(*overrides)
    assert cfg.model.d_model == d_model
    assert (cfg.model.n_min, cfg.model.n_max, cfg.model.width_multiplier) == (3, 9, 1.0)
    assert cfg.task.optimizer._target_ == "torch.optim.AdamW"
    assert cfg.task.optimizer.weight_decay == 1e-4
    assert cfg.task.optimizer.lr == pytest.approx(lr)
    assert cfg.task.optimizer.lr == pytest.approx(round(1e-3 * 384 / d_model, 5), rel=0.03)
    assert cfg.task.scheduler._target_ == "src.optim.schedules.warmup_linear"
    assert (cfg.task.scheduler.warmup_steps, cfg.task.scheduler.warmup_init_lr) == (4000, 1e-7)
    assert cfg.task.scheduler.end_lr == 1e-7
    assert cfg.trainer.max_steps == 50000
    assert cfg.trainer.gradient_clip_val in (None, 0, 0.0)
    # the IWSLT architecture's d_m-scaled dropouts
    assert cfg.model.dropout == cfg.model.ffn_dropout == dropout == round(0.3 * d_model / 512, 2)
    assert cfg.model.attention_dropout == cfg.model.dextra_dropout == attention
    assert attention == pytest.approx(0.1 * d_model / 512, abs=0.005)


@pytest.mark.parametrize(
    ("experiment", "lr", "weight_decay"),
    [
        ("delight_mt/wmt14_en_de_d640", 0.003, 0.0),
        ("delight_mt/wmt16_en_ro_d640", 0.0006, 0.0),
    ],
)
def test_wmt_delight_follows_the_launch_scripts(
    experiment: str, lr: float, weight_decay: float
) -> None:
    cfg = composed(f"experiment={experiment}")
    assert cfg.task.optimizer.lr == pytest.approx(lr)
    assert cfg.task.optimizer.weight_decay == weight_decay  # AdamW at 0 is Adam
    assert cfg.task.scheduler.warmup_steps == 10000


def test_the_delight_mt_demo_follows_the_iwslt_recipe_at_its_size() -> None:
    cfg = composed("experiment=delight_mt/demo")
    model = cfg.model
    assert model.n_min >= 3 and model.n_max > model.n_min
    assert model.dropout == model.ffn_dropout == round(0.3 * model.d_model / 512, 2)
    assert model.attention_dropout == model.dextra_dropout == round(0.1 * model.d_model / 512, 2)
    assert cfg.task.optimizer._target_ == "torch.optim.AdamW"
    assert cfg.task.optimizer.weight_decay == 1e-4
    assert cfg.task.scheduler._target_ == "src.optim.schedules.warmup_linear"
    assert cfg.task.scheduler.end_lr == cfg.task.scheduler.warmup_init_lr == 1e-7


def test_the_transformer_mt_demo_follows_fairseqs_iwslt_recipe() -> None:
    cfg = composed("experiment=delight_mt/transformer_mt_demo")
    assert cfg.task.optimizer._target_ == "torch.optim.AdamW"
    assert cfg.task.optimizer.weight_decay == 1e-4
    assert cfg.task.scheduler._target_ == "src.optim.schedules.inverse_sqrt"
    assert (cfg.model.dropout, cfg.model.attention_dropout) == (0.3, 0.1)


def test_the_mt_demos_have_equal_parameters() -> None:
    delight = composed("experiment=delight_mt/demo").model
    transformer = composed("experiment=delight_mt/transformer_mt_demo").model
    a = count(
        DeLighTEncoderDecoder(
            GETTEXT_VOCAB,
            GETTEXT_VOCAB,
            d_model=delight.d_model,
            n_min=delight.n_min,
            n_max=delight.n_max,
            width_multiplier=delight.width_multiplier,
            share_all_embeddings=True,
            padding_idx=1,
        )
    )
    b = count(
        TransformerEncoderDecoder(
            GETTEXT_VOCAB,
            GETTEXT_VOCAB,
            d_model=transformer.d_model,
            ffn_dim=transformer.ffn_dim,
            num_heads=transformer.num_heads,
            num_layers=transformer.num_layers,
            share_all_embeddings=True,
            padding_idx=1,
        )
    )
    assert (a, b) == (1_173_016, 1_173_472)
    assert abs(b / a - 1) < 0.01


def test_the_delight_lm_demo_follows_the_wt103_script_at_its_size() -> None:
    cfg = composed("experiment=delight_lm/demo")
    model = cfg.model
    assert model.n_min >= 3
    rule = round(0.1 * model.d_model / 1024, 2)
    assert (
        model.dropout
        == model.attention_dropout
        == model.ffn_dropout
        == model.dextra_dropout
        == rule
    )
    assert cfg.task.optimizer.lr == min(round(1024 / model.d_model * 0.002, 3), 0.01)
    assert cfg.task.optimizer.weight_decay == 0.0
    assert cfg.trainer.gradient_clip_val is None
    assert cfg.task.scheduler._target_ == "src.optim.schedules.warmup_cosine"
    # 5% of the run, as 5,000 of 100,000
    assert cfg.task.scheduler.warmup_steps == round(0.05 * cfg.trainer.max_steps)


def test_the_transformer_lm_demo_follows_fairseqs_lm_recipe() -> None:
    cfg = composed("experiment=delight_lm/transformer_lm_demo")
    assert cfg.task.optimizer._target_ == "torch.optim.AdamW"
    assert (cfg.task.optimizer.lr, cfg.task.optimizer.weight_decay) == (5e-4, 0.01)
    assert cfg.task.scheduler._target_ == "src.optim.schedules.inverse_sqrt"
    assert cfg.task.scheduler.warmup_steps == round(0.08 * cfg.trainer.max_steps)
    assert cfg.trainer.gradient_clip_val is None
    assert cfg.trainer.max_steps == composed("experiment=delight_lm/demo").trainer.max_steps


def test_the_lm_demos_have_equal_parameters() -> None:
    delight = composed("experiment=delight_lm/demo").model
    transformer = composed("experiment=delight_lm/transformer_lm_demo").model
    a = count(
        DeLighTLanguageModel(
            PYDOC_WORDS_VOCAB,
            delight.d_model,
            delight.n_min,
            delight.n_max,
            delight.width_multiplier,
            cutoffs=list(delight.cutoffs),
        )
    )
    b = count(
        TransformerLanguageModel(
            PYDOC_WORDS_VOCAB,
            transformer.d_model,
            transformer.num_layers,
            transformer.num_heads,
            transformer.ffn_dim,
            cutoffs=list(transformer.cutoffs),
        )
    )
    assert (a, b) == (862_012, 861_664)
    assert abs(b / a - 1) < 0.01


def test_the_demo_schedules_build() -> None:
    """The schedules the demos name accept their arguments (a typo would only fail at fit)."""
    params = [torch.nn.Parameter(torch.zeros(1))]
    for experiment, factory in (
        ("delight_mt/demo", warmup_linear),
        ("delight_mt/transformer_mt_demo", inverse_sqrt),
    ):
        cfg = composed(f"experiment={experiment}")
        optimizer = instantiate(cfg.task.optimizer)(params)
        scheduler = instantiate(cfg.task.scheduler)(optimizer, total_steps=1000)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-7)
        assert factory.__name__ in cfg.task.scheduler._target_
        del scheduler


def test_the_charlm_demos_have_equal_parameters() -> None:
    from src.models.group_transformer import GroupTransformer
    from src.models.transformer_xl import TransformerXL

    vocab = 103  # pydoc_chars' symbols on Python 3.11
    keys = ("n_layer", "d_model", "n_head", "d_inner", "mem_len", "dropout", "tie_weight")
    txl = composed("experiment=char_lm/demo_txl").model
    b = count(TransformerXL(n_token=vocab, pre_norm=txl.pre_norm, **{k: txl[k] for k in keys}))
    found = {}
    for experiment in ("char_lm/demo", "char_lm/demo_g4"):
        gt = composed(f"experiment={experiment}").model
        found[experiment] = count(
            GroupTransformer(
                n_token=vocab, tgt_len=64, n_group=gt.n_group, **{k: gt[k] for k in keys}
            )
        )
        assert abs(b / found[experiment] - 1) < 0.01
    assert (found["char_lm/demo"], found["char_lm/demo_g4"], b) == (609_767, 608_375, 609_485)
