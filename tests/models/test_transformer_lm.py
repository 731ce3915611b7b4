"""The Transformer LM baseline: its parameter count by formula, causality, and the same input and
output side as the DeLighT LM."""

from __future__ import annotations

import pytest
import torch

from src.models.delight_lm import DeLighTLanguageModel
from src.models.transformer_lm import TransformerLanguageModel
from src.ops.adaptive_io import AdaptiveInputSoftmax

V, CUTOFFS = 300, [100, 200]


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("d", "layers", "ffn", "embedding"), [(128, 2, 256, 128), (64, 3, 96, 128)]
)
def test_parameters_follow_the_formula(d: int, layers: int, ffn: int, embedding: int) -> None:
    model = TransformerLanguageModel(V, d, layers, 4, ffn, cutoffs=CUTOFFS, embedding_dim=embedding)
    lookup = count(model.lookup)
    projections = 0 if d == embedding else 2 * d * embedding
    per_layer = 4 * (d * d + d) + 2 * d * ffn + ffn + d + 4 * d
    assert count(model) == lookup + projections + layers * per_layer
    # the lookup is the DeLighT LM's: same bands, same tying
    delight = DeLighTLanguageModel(V, 128, 3, 4, 2.0, cutoffs=CUTOFFS, embedding_dim=embedding)
    assert isinstance(delight.lookup, AdaptiveInputSoftmax)
    assert lookup == count(delight.lookup)


def test_a_token_sees_only_its_past() -> None:
    torch.manual_seed(0)
    model = TransformerLanguageModel(V, 64, 2, 4, 128, cutoffs=CUTOFFS).eval()
    tokens = torch.randint(4, V, (2, 12))
    changed = tokens.clone()
    changed[:, 8:] = torch.randint(4, V, (2, 4))
    with torch.no_grad():
        a, b = model.log_prob(tokens), model.log_prob(changed)
    assert a.shape == (2, 12, V)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])
    # log-probabilities over the vocabulary
    torch.testing.assert_close(a.exp().sum(-1), torch.ones(2, 12))


def test_loss_is_the_nll_of_the_log_probabilities() -> None:
    torch.manual_seed(0)
    model = TransformerLanguageModel(V, 64, 2, 4, 128, cutoffs=CUTOFFS).eval()
    tokens = torch.randint(4, V, (2, 10))
    targets = torch.randint(4, V, (2, 10))
    targets[0, -2:] = model.padding_idx  # not scored
    with torch.no_grad():
        log_prob = model.log_prob(tokens)
        expected = -log_prob.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        scored = targets.ne(model.padding_idx)
        torch.testing.assert_close(
            model.loss(tokens, targets), expected[scored].sum(), rtol=1e-5, atol=1e-4
        )
        torch.testing.assert_close(
            model.loss(tokens, targets, reduction="mean"),
            expected[scored].mean(),
            rtol=1e-5,
            atol=1e-5,
        )


def test_it_learns_a_repeated_sequence() -> None:
    torch.manual_seed(0)
    model = TransformerLanguageModel(
        V, 64, 2, 4, 128, cutoffs=CUTOFFS, dropout=0.0, attention_dropout=0.0
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sequence = torch.randint(4, V, (1, 17)).repeat(4, 1)
    first = None
    for _ in range(60):
        loss = model.loss(sequence[:, :-1], sequence[:, 1:], reduction="mean")
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert first > 5.0 and loss.item() < 0.5


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="multiple of num_heads"):
        TransformerLanguageModel(V, 66, 2, 4, 128, cutoffs=CUTOFFS)
    with pytest.raises(ValueError, match="activation_dropout"):
        TransformerLanguageModel(V, 64, 2, 4, 128, cutoffs=CUTOFFS, activation_dropout=0.2)
