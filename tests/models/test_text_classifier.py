"""Sentence classifiers: sizes, the Scale and Shift flags, padding, a few training steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from src.models.delight_block import DeLighTEncoderBlock, block_wise_scaling
from src.models.text_classifier import DeLighTClassifier, TransformerClassifier, masked_mean_pool

VOCAB, CLASSES = 2000, 3


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def delight(**flags) -> DeLighTClassifier:
    return DeLighTClassifier(VOCAB, CLASSES, 64, 4, 7, 2.0, **flags)


def tokens() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(4, VOCAB, (4, 12), generator=generator)
    x[1, 9:] = 1  # right padding
    x[3, 5:] = 1
    return x


def test_parameter_counts_of_the_variants() -> None:
    # the sizes docs/delight_sentiment.md reports (report: 268,325 / 224,701 / 222,337)
    assert count(delight(block_scaling=True)) == 254_243
    assert count(delight(block_scaling=False)) == 218_195
    transformer = TransformerClassifier(VOCAB, CLASSES, 64, dim_feedforward=96)
    assert count(transformer) == 216_227
    assert abs(count(transformer) / count(delight(block_scaling=False)) - 1) < 0.02


def test_scale_adds_exactly_the_block_wise_scaling_parameters() -> None:
    scaled, uniform = delight(block_scaling=True), delight(block_scaling=False)
    plan = block_wise_scaling(4, 7, 2.0, num_blocks=3)
    assert scaled.scaling == ((4, 2.0), (5, 2.375), (7, 2.75)) == plan
    assert uniform.scaling == ((4, 2.0),) * 3

    def block(n: int, w: float) -> int:
        return count(DeLighTEncoderBlock(64, width_multiplier=w, depth=n, max_groups=2))

    expected = sum(block(n, w) - block(4, 2.0) for n, w in plan)
    assert expected == 254_243 - 218_195
    assert count(scaled) - count(uniform) == expected
    # everything outside the blocks is the same
    outside = lambda m: count(m) - count(m.blocks)  # noqa: E731
    assert outside(scaled) == outside(uniform) == VOCAB * 64 + 64 * CLASSES + CLASSES


@pytest.mark.parametrize("block_scaling", [True, False])
def test_shift_changes_the_output_not_the_parameters(block_scaling: bool) -> None:
    torch.manual_seed(0)
    shifted = delight(block_scaling=block_scaling, glt_shuffle=True).eval()
    plain = delight(block_scaling=block_scaling, glt_shuffle=False).eval()
    assert count(shifted) == count(plain)
    plain.load_state_dict(shifted.state_dict())  # same names and shapes: same weights
    x = tokens()
    with torch.no_grad():
        difference = (shifted(x) - plain(x)).abs().max().item()
        again = (shifted(x) - shifted(x)).abs().max().item()
    assert again == 0.0
    assert difference > 1e-3


@pytest.mark.parametrize(
    "make",
    [lambda: delight(), lambda: TransformerClassifier(VOCAB, CLASSES, 64, dim_feedforward=96)],
)
def test_padding_does_not_change_the_logits(make) -> None:
    torch.manual_seed(0)
    model = make().eval()
    x = tokens()[:, :9]
    padded = F.pad(x, (0, 5), value=1)
    with torch.no_grad():
        short, long = model(x), model(padded)
    assert short.shape == (4, CLASSES)
    torch.testing.assert_close(short, long, atol=1e-5, rtol=1e-5)


def test_masked_mean_pool_averages_the_kept_positions() -> None:
    x = torch.arange(12, dtype=torch.float).reshape(1, 4, 3)
    mask = torch.tensor([[False, False, True, True]])
    # mean of rows [0, 1, 2] and [3, 4, 5]
    assert masked_mean_pool(x, mask).tolist() == [[1.5, 2.5, 3.5]]
    assert masked_mean_pool(x, torch.ones(1, 4, dtype=torch.bool)).tolist() == [[0.0, 0.0, 0.0]]


SMALL = {"num_embeddings": 100, "num_classes": CLASSES, "d_model": 32}
VARIANTS = {
    "scale+shift": lambda: DeLighTClassifier(**SMALL, block_scaling=True, glt_shuffle=True),
    "scale": lambda: DeLighTClassifier(**SMALL, block_scaling=True, glt_shuffle=False),
    "shift": lambda: DeLighTClassifier(**SMALL, block_scaling=False, glt_shuffle=True),
    "plain": lambda: DeLighTClassifier(**SMALL, block_scaling=False, glt_shuffle=False),
    "transformer": lambda: TransformerClassifier(**SMALL, dim_feedforward=48),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_trains_a_few_steps(variant: str) -> None:
    torch.manual_seed(0)
    model = VARIANTS[variant]()
    x, y = tokens() % 100, torch.tensor([0, 1, 2, 1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.7 * losses[0]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="padding_idx"):
        DeLighTClassifier(10, 3, padding_idx=10)
    with pytest.raises(ValueError, match="num_heads"):
        TransformerClassifier(VOCAB, CLASSES, 64, num_heads=5)
