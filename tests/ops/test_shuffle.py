from __future__ import annotations

import pytest
import torch

from src.ops.shuffle import channel_shuffle, concat_shuffle, feature_shuffle


def test_feature_shuffle_interleaves_groups() -> None:
    x = torch.arange(6.0)  # groups of 3: [0 1 2] [3 4 5]
    assert feature_shuffle(x, 2).tolist() == [0, 3, 1, 4, 2, 5]
    assert feature_shuffle(x, 1).tolist() == x.tolist()


def test_channel_shuffle_matches_torch() -> None:
    x = torch.randn(2, 12, 3, 5)
    assert torch.equal(channel_shuffle(x, 3), torch.nn.functional.channel_shuffle(x, 3))


def test_shuffle_any_axis_and_bad_groups() -> None:
    x = torch.randn(4, 6, 5)
    assert torch.equal(
        feature_shuffle(x, 2, dim=1), channel_shuffle(x.unsqueeze(-1), 2).squeeze(-1)
    )
    with pytest.raises(ValueError, match="5 features into 2 groups"):
        feature_shuffle(x, 2, dim=-1)


@pytest.mark.parametrize(
    ("widths", "groups"), [((6, 6), 2), ((4, 8), 2), ((3, 3, 3), 3), ((2, 4), 3), ((6, 6), 3)]
)
def test_concat_shuffle_equals_shuffled_concatenation(widths: tuple[int, ...], groups: int) -> None:
    parts = [torch.randn(2, c, 3, 4) for c in widths]
    expected = channel_shuffle(torch.cat(parts, dim=1), groups)
    torch.testing.assert_close(concat_shuffle(parts, groups), expected, rtol=0, atol=0)
