"""The DeLighT language model: official parameter counts, causality, ties, losses, autocast.

The parameter counts come from instantiating the official models (``params.json`` in the DeLighT
reference folder, key ``lm``: thesis Table 5.7 rows and Table 5.4b); the models are built on the
``meta`` device, so the 267,744-word vocabulary costs no memory. Without that folder those tests
skip. The others run on a tiny model.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from src.models.delight_lm import DeLighTLanguageModel, wikitext103_dropout
from src.ops.adaptive_io import AdaptiveInputSoftmax
from tests.amp import NETWORK_TOLERANCE, autocast_errors
from tests.parity.reference import reference_dir

WT103_VOCAB = 267_744
TINY = {
    "vocab_size": 60,
    "d_model": 64,
    "n_min": 2,
    "n_max": 3,
    "width_multiplier": 2.0,
    "cutoffs": (10, 30),
}
NO_DROPOUT = {
    name: 0.0
    for name in ("dropout", "attention_dropout", "ffn_dropout", "dextra_dropout",
                 "embedding_dropout", "position_dropout", "adaptive_softmax_dropout")
}  # fmt: skip


def _rows() -> list:
    path = reference_dir() / "delight" / "params.json"
    if not path.is_file():
        reason = f"no DeLighT parameter counts at {path}; set REFERENCE_DIR to the reference folder"
        return [pytest.param(None, id="lm-absent", marks=pytest.mark.skip(reason=reason))]
    return [
        pytest.param(row, id=row["row"].split(" (")[0])
        for row in json.loads(path.read_text())["lm"]
    ]


def _count(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("row", _rows())
def test_parameters_equal_the_official_counts(row: dict) -> None:
    with torch.device("meta"):
        model = DeLighTLanguageModel(
            WT103_VOCAB, row["d_m"], row["N_min"], row["N_max"], row["w_m"]
        )
    assert len(model.blocks) == row["blocks_B"] and model.max_groups == row["max_glt_groups"]
    assert _count(model) == row["total_params"]
    adaptive = model.lookup
    assert isinstance(adaptive, AdaptiveInputSoftmax)
    breakdown = row["breakdown"]
    assert _count(adaptive.embeddings) == row["adaptive_input_embedding_tables"]
    assert _count(adaptive.projections) == breakdown["adaptive_input_projections"]
    assert _count(adaptive.class_proj) == breakdown["adaptive_softmax_untied(class_proj)"]
    assert _count(model.embedding.dextra) == breakdown["embedding_dextra"]
    assert _count(model.blocks) == breakdown["blocks"]
    assert _count(model.project_out) == breakdown["project_out_dim"]
    for block, official in zip(model.blocks, row["blocks"], strict=True):
        assert _count(block) == official["block_params"]


def test_table_5_4b_is_99_million() -> None:
    with torch.device("meta"):
        sizes = {d_m: _count(DeLighTLanguageModel(WT103_VOCAB, d_m)) for d_m in (512, 768, 1024)}
    assert sizes == {512: 35_101_170, 768: 61_184_332, 1024: 99_247_668}


def test_plain_table_variant_ties_input_and_output() -> None:
    model = DeLighTLanguageModel(**{**TINY, "adaptive_input": False})
    # 60 x 128 table, no adaptive parts: one table, scored at the output too
    assert model.lookup.weight.shape == (60, 128)
    assert _count(model) == _count(model.embedding) + _count(model.blocks) + _count(
        model.project_out
    )
    assert model.embedding.embed_scale == pytest.approx(128**0.5)


@pytest.mark.parametrize("adaptive_input", [True, False])
def test_causal_a_later_token_does_not_change_earlier_outputs(adaptive_input: bool) -> None:
    torch.manual_seed(0)
    model = DeLighTLanguageModel(**TINY, adaptive_input=adaptive_input, **NO_DROPOUT).eval()
    tokens = torch.randint(2, 60, (2, 12))
    changed = tokens.clone()
    changed[:, 8] = (changed[:, 8] + 7) % 58 + 2
    a, b = model(tokens), model(changed)  # (2, 12, 128)
    assert a.shape == (2, 12, 128)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6)
    assert (a[:, 8:] - b[:, 8:]).abs().amax() > 1e-3


def test_loss_matches_log_prob_and_ignores_pads() -> None:
    torch.manual_seed(0)
    model = DeLighTLanguageModel(**TINY, **NO_DROPOUT).eval()
    tokens = torch.randint(2, 60, (2, 10))
    targets = torch.randint(2, 60, (2, 10))
    targets[0, :4] = model.padding_idx
    log_probs = model.log_prob(tokens)  # (2, 10, 60)
    assert torch.allclose(log_probs.logsumexp(-1), torch.zeros(2, 10), atol=1e-5)
    scored = targets != model.padding_idx
    expected = -log_probs.gather(-1, targets[..., None]).squeeze(-1)[scored].sum()
    assert torch.allclose(model.loss(tokens, targets), expected, rtol=1e-5)
    assert torch.allclose(model.loss(tokens, targets, reduction="mean"), expected / 16, rtol=1e-5)


def test_right_padding_leaves_the_real_positions_alone() -> None:
    torch.manual_seed(0)
    model = DeLighTLanguageModel(**TINY, **NO_DROPOUT).eval()
    tokens = torch.randint(2, 60, (1, 8))
    padded = torch.cat([tokens, torch.full((1, 3), model.padding_idx)], dim=1)
    assert torch.allclose(model(padded)[:, :8], model(tokens), atol=1e-5)


def test_training_reaches_every_parameter() -> None:
    torch.manual_seed(0)
    model = DeLighTLanguageModel(**TINY)
    tokens = torch.randint(2, 60, (2, 16))
    targets = torch.cat([tokens[:, 1:], torch.tensor([[12], [45]])], dim=1)  # every band a target
    targets[0, 0] = 3
    model.loss(tokens, targets).backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    # band 0's input projection is input-only; it has a gradient through the embedding side
    assert missing == []


def test_bf16_autocast_forward_and_backward() -> None:
    tokens = torch.randint(2, 60, (2, 12), generator=torch.Generator().manual_seed(0))

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = DeLighTLanguageModel(**TINY, **NO_DROPOUT)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.net.loss(t[:, :-1], t[:, 1:], reduction="none")

    errors = autocast_errors(Loss, lambda: [tokens], torch.bfloat16, "cpu")
    assert errors["output"] < 3e-2 and errors["parameters.grad"] < 3e-2, errors
    assert max(errors.values()) < NETWORK_TOLERANCE, errors


def test_wikitext103_dropout_rule() -> None:
    assert [wikitext103_dropout(d) for d in (256, 384, 512, 1024)] == [0.03, 0.04, 0.05, 0.1]


def test_dropout_follows_the_wikitext103_rule_unless_given() -> None:
    with torch.device("meta"):
        ruled = DeLighTLanguageModel(WT103_VOCAB, 512, 4, 12, 2.0)
        given = DeLighTLanguageModel(WT103_VOCAB, 512, 4, 12, 2.0, dropout=0.2)
    block = ruled.blocks[0]
    assert (ruled.dropout, block.ffn_dropout, block.self_attn.dropout, block.dextra.dropout) == (
        0.05,
    ) * 4
    assert given.dropout == 0.2 and given.blocks[0].ffn_dropout == 0.05
