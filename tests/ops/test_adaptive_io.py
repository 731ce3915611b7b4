"""The tied adaptive input / adaptive softmax: loss against full log-probabilities, normalisation,
torch's AdaptiveLogSoftmaxWithLoss with the same weights, tied gradients, autocast."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from src.ops.adaptive_io import AdaptiveInputSoftmax
from tests.amp import OP_TOLERANCE, autocast_errors

V, CUTOFFS, DIM, PAD = 50, (10, 30), 16, 1


def make(dropout: float = 0.0) -> AdaptiveInputSoftmax:
    torch.manual_seed(0)
    return AdaptiveInputSoftmax(
        V, CUTOFFS, initial_dim=DIM, output_dim=DIM, factor=2, padding_idx=PAD, dropout=dropout
    )


def targets_all_bands(n: int = 40) -> torch.Tensor:
    """(n,) ids covering every band, with two pads."""
    generator = torch.Generator().manual_seed(1)
    t = torch.randint(0, V, (n,), generator=generator)
    t[:3] = torch.tensor([2, 15, 45])
    t[5] = t[7] = PAD
    return t


def test_parameter_layout() -> None:
    m = make()
    # bands [0,10) x 16, [10,30) x 8, [30,50) x 4; projections d_i x 16; cluster logits 2 x 16
    assert m.dims == (16, 8, 4)
    assert [tuple(e.weight.shape) for e in m.embeddings] == [(10, 16), (20, 8), (20, 4)]
    assert [tuple(p.weight.shape) for p in m.projections] == [(16, 16), (16, 8), (16, 4)]
    assert sum(p.numel() for p in m.parameters()) == 160 + 160 + 80 + 256 + 128 + 64 + 32
    assert torch.count_nonzero(m.embeddings[0].weight[PAD]) == 0


def test_loss_is_the_nll_of_log_prob_and_rows_normalise() -> None:
    m = make().eval()
    hidden = torch.randn(2, 20, DIM)
    targets = targets_all_bands().view(2, 20)
    log_probs = m.log_prob(hidden)  # (2, 20, V)
    assert log_probs.shape == (2, 20, V)
    assert torch.allclose(log_probs.logsumexp(-1), torch.zeros(2, 20), atol=1e-5)
    scored = targets != PAD
    expected = -log_probs.gather(-1, targets[..., None]).squeeze(-1)[scored]
    assert torch.allclose(m.loss(hidden, targets, reduction="sum"), expected.sum(), rtol=1e-5)
    assert torch.allclose(m.loss(hidden, targets, reduction="mean"), expected.mean(), rtol=1e-5)
    per_token = m.loss(hidden, targets, reduction="none")
    assert torch.allclose(per_token[scored], expected, rtol=1e-5)
    assert per_token[~scored].abs().sum() == 0 and int(scored.sum()) == 38


def test_equals_torch_adaptive_log_softmax_with_the_same_weights() -> None:
    m = make().eval()
    reference = nn.AdaptiveLogSoftmaxWithLoss(DIM, V, list(CUTOFFS), div_value=2.0, head_bias=False)
    with torch.no_grad():
        # head: [E_0; class_proj]; tail i: (P_i^T, E_i)
        reference.head.weight.copy_(torch.cat([m.embeddings[0].weight, m.class_proj.weight]))
        for i, tail in enumerate(reference.tail):
            tail[0].weight.copy_(m.projections[i + 1].weight.t())
            tail[1].weight.copy_(m.embeddings[i + 1].weight)
    hidden = torch.randn(40, DIM)
    targets = targets_all_bands()
    targets[5] = targets[7] = 4  # torch has no ignore index
    assert torch.allclose(m.log_prob(hidden), reference.log_prob(hidden), atol=1e-5)
    assert torch.allclose(
        m.loss(hidden, targets, reduction="mean"), reference(hidden, targets).loss, atol=1e-6
    )


def test_embedding_scales_each_band_and_projects() -> None:
    m = make()
    tokens = torch.tensor([[3, 12, 40, PAD]])
    out = m(tokens)  # (1, 4, 16)
    assert out.shape == (1, 4, DIM)
    expected_band1 = m.projections[1](m.embeddings[1].weight[2] * 8**0.5)
    expected_band2 = m.projections[2](m.embeddings[2].weight[10] * 2.0)
    assert torch.allclose(out[0, 1], expected_band1, atol=1e-6)
    assert torch.allclose(out[0, 2], expected_band2, atol=1e-6)
    assert torch.count_nonzero(out[0, 3]) == 0  # the pad row is zero


def test_gradients_reach_the_tied_tables_from_both_sides() -> None:
    m = make()
    tokens = torch.tensor([[3, 12, 40]])
    # input side only: every band's table and projection gets a gradient
    m(tokens).sum().backward()
    assert all(e.weight.grad is not None and e.weight.grad.abs().sum() > 0 for e in m.embeddings)
    input_grads = [p.weight.grad.clone() for p in m.projections]
    m.zero_grad(set_to_none=True)
    # output side only: targets in every band reach tables, tail projections and class_proj
    m.loss(torch.randn(3, DIM), torch.tensor([3, 12, 40])).backward()
    assert all(e.weight.grad.abs().sum() > 0 for e in m.embeddings)
    assert all(p.weight.grad.abs().sum() > 0 for p in m.projections[1:])
    assert m.projections[0].weight.grad is None  # P_0 is input-only (head uses E_0 directly)
    assert m.class_proj.weight.grad.abs().sum() > 0
    assert all(g.abs().sum() > 0 for g in input_grads)


def test_loss_does_not_depend_on_absent_bands() -> None:
    m = make().eval()
    hidden = torch.randn(4, DIM)
    head_only = torch.tensor([0, 2, 5, 9])
    expected = -m.log_prob(hidden).gather(1, head_only[:, None]).sum()
    assert torch.allclose(m.loss(hidden, head_only), expected, rtol=1e-5)


class _LossOfBoth(nn.Module):
    def __init__(self, io: AdaptiveInputSoftmax) -> None:
        super().__init__()
        self.io = io

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.io(tokens[:, :-1])  # (B, T, d)
        return self.io.loss(hidden, tokens[:, 1:], reduction="none")


def test_bf16_autocast_forward_and_backward() -> None:
    tokens = targets_all_bands(42).view(2, 21)
    errors = autocast_errors(lambda: _LossOfBoth(make()), lambda: [tokens], torch.bfloat16, "cpu")
    assert max(errors.values()) < OP_TOLERANCE, errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"cutoffs": (30, 10)}, "increase"), ({"cutoffs": (10, 50)}, "increase"),
     ({"padding_idx": 12}, "band 0"), ({"output_dim": 8}, "output_dim must equal")],
)  # fmt: skip
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    args = {"vocab_size": V, "cutoffs": CUTOFFS, "initial_dim": DIM, "output_dim": DIM, **kwargs}
    with pytest.raises(ValueError, match=match):
        AdaptiveInputSoftmax(**args)


def test_traced_fixed_shapes_equal_the_eager_bands() -> None:
    """Traced, every position embeds and scores in every band (no data-dependent row counts, no
    graph break with ``fullgraph``); the per-position losses and all gradients are the eager
    ones, which gather each band's rows."""
    m = make()
    tokens = targets_all_bands(42).view(2, 21)
    traced = torch.compile(_LossOfBoth(m), backend="aot_eager", fullgraph=True, dynamic=False)
    results = []
    for run in (_LossOfBoth(m), traced):
        m.zero_grad()
        loss = run(tokens)
        loss.sum().backward()
        results.append([loss, *(p.grad for p in m.parameters())])
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
