from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from src.ops.pyramidal import SUBSAMPLINGS, PyramidalTransform, level_out_features


@pytest.mark.parametrize("subsampling", SUBSAMPLINGS)
@pytest.mark.parametrize(
    ("n", "m", "levels"), [(32, 64, 2), (64, 64, 4), (600, 600, 4), (7, 10, 3)]
)
def test_shapes(subsampling: str, n: int, m: int, levels: int) -> None:
    pt = PyramidalTransform(n, m, levels=levels, subsampling=subsampling)
    assert pt.level_in_features == tuple(-(-n // 2**k) for k in range(levels))
    assert sum(pt.level_out_features) == m
    assert pt(torch.randn(2, 3, n)).shape == (2, 3, 4, m)
    assert pt(torch.randn(n)).shape == (4, m)


def test_official_output_split() -> None:
    assert level_out_features(64, 2) == (48, 16)
    assert level_out_features(64, 4) == (36, 16, 8, 4)
    assert level_out_features(1400, 2) == (1050, 350)
    assert level_out_features(600, 4) == (337, 150, 75, 38)
    assert level_out_features(64, 1) == (64,)


def test_gates_are_level_chunks_concatenated() -> None:
    """Zero weights and a bias that names (level, gate): each gate is its chunks over the levels."""
    pt = PyramidalTransform(8, 12, levels=2)
    with torch.no_grad():
        for k, transform in enumerate(pt.transforms):
            transform.weight.zero_()
            m_k = pt.level_out_features[k]
            transform.bias.copy_(torch.arange(4).repeat_interleave(m_k) + 10 * k)  # (4 * m_k,)
    out = pt(torch.randn(5, 8))  # (5, 4, 12)
    m_0 = pt.level_out_features[0]
    for gate in range(4):
        assert torch.equal(out[:, gate, :m_0], torch.full((5, m_0), float(gate)))
        assert torch.equal(out[:, gate, m_0:], torch.full((5, 12 - m_0), float(gate + 10)))


@pytest.mark.parametrize(("n", "m"), [(12, 12), (12, 16)])
def test_residual_only_when_n_equals_m(n: int, m: int) -> None:
    pt = PyramidalTransform(n, m, levels=3)
    for transform in pt.transforms:
        nn.init.zeros_(transform.weight)
        nn.init.zeros_(transform.bias)
    x = torch.randn(3, n)
    expected = x.unsqueeze(-2).expand(3, 4, n) if n == m else torch.zeros(3, 4, m)
    assert pt.residual == (n == m)
    assert torch.equal(pt(x), expected)


def test_avg_cascade_counts_the_padding() -> None:
    pt = PyramidalTransform(8, 8, levels=3)
    x = torch.arange(1.0, 9.0)
    level1 = pt.subsample(x, 1)  # kernel 5, padding 2, stride 2
    assert torch.allclose(
        level1, torch.tensor([1 + 2 + 3, 1 + 2 + 3 + 4 + 5, 3 + 4 + 5 + 6 + 7, 5 + 6 + 7 + 8]) / 5
    )
    level2 = pt.subsample(level1, 2)  # kernel 3, padding 1: pools level 1, not x
    assert torch.allclose(level2, torch.stack([level1[:2].sum(), level1[1:].sum()]) / 3)


def test_other_subsamplers() -> None:
    x = torch.tensor([[3.0, -1.0, 4.0, 1.0, -5.0, 9.0, 2.0]])
    skip = PyramidalTransform(7, 8, levels=2, subsampling="skip")
    assert torch.equal(skip.subsample(x, 1), x[:, ::2])
    maxpool = PyramidalTransform(7, 8, levels=2, subsampling="max")
    assert torch.equal(maxpool.subsample(x, 1), torch.tensor([[3.0, 4.0, 9.0, 9.0]]))
    learned = PyramidalTransform(7, 8, levels=2, subsampling="learned")
    avg = F.avg_pool1d(x.unsqueeze(1), 3, stride=2, padding=1).squeeze(1)
    assert torch.allclose(learned.subsample(x, 1), avg)  # initialised to the average pooling
    assert [p.shape for p in learned.subsamplers.parameters()] == [(1, 1, 3)]
    assert len(list(PyramidalTransform(7, 8, levels=2).parameters())) == 4  # pooling learns nothing


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match=r"levels \(0\)"):
        PyramidalTransform(8, 8, levels=0)
    with pytest.raises(ValueError, match=r"in_features \(0\)"):
        PyramidalTransform(0, 8)
    with pytest.raises(ValueError, match=r"out_features \(3\) is too small for 4 levels"):
        PyramidalTransform(8, 3, levels=4)
    with pytest.raises(ValueError, match="subsampling must be one of"):
        PyramidalTransform(8, 8, subsampling="mean")
    with pytest.raises(ValueError, match=r"expected 8 input features, got shape \(2, 9\)"):
        PyramidalTransform(8, 8)(torch.randn(2, 9))


@pytest.mark.parametrize("subsampling", SUBSAMPLINGS)
def test_gradcheck(subsampling: str) -> None:
    torch.manual_seed(0)
    pt = PyramidalTransform(6, 6, levels=3, subsampling=subsampling).double()
    x = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(pt, (x,))
    params = tuple(pt.parameters())

    def of_params(*values: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(pt, dict(zip(dict(pt.named_parameters()), values)), (x,))

    assert torch.autograd.gradcheck(of_params, params, fast_mode=True)


def test_thesis_k4_example_buildable() -> None:
    """N = M = 600, K = 4 (thesis): not buildable by the official code; saves ~27% here, not 53%."""
    pt = PyramidalTransform(600, 600, levels=4)
    linear = nn.Linear(600, 4 * 600)
    saving = 1 - sum(p.numel() for p in pt.parameters()) / sum(
        p.numel() for p in linear.parameters()
    )
    assert 0.26 < saving < 0.28


def test_paper_split_gives_each_level_m_over_k() -> None:
    assert level_out_features(64, 2, "paper") == (32, 32)
    assert level_out_features(600, 4, "paper") == (150, 150, 150, 150)
    assert level_out_features(66, 4, "paper") == (18, 16, 16, 16)  # remainder to level 0
    assert level_out_features(64, 2) == (48, 16)  # the code's 3M/4, M/4
    with pytest.raises(ValueError, match="split must be one of"):
        level_out_features(64, 2, "equal")


def test_paper_split_reproduces_the_thesis_table_4_2_unit() -> None:
    """Thesis Table 4.2, "PT input + LT context" at 600 -> 600, K = 2: 2.5 M recurrent-unit
    parameters with the thesis's equal split, 2,704,800 with the code's."""
    context = 600 * 2400 + 2400  # the LT of h to the four gates, with bias

    def unit(split: str) -> int:
        pt = PyramidalTransform(600, 600, levels=2, split=split)
        return sum(p.numel() for p in pt.parameters()) + context

    assert unit("official") == 2_704_800
    assert unit("paper") == 2_524_800


def test_residual_can_be_switched_off() -> None:
    torch.manual_seed(0)
    with_residual = PyramidalTransform(8, 8, levels=2)
    without = PyramidalTransform(8, 8, levels=2, residual=False)
    without.load_state_dict(with_residual.state_dict())
    x = torch.randn(3, 8)
    assert with_residual.residual and not without.residual
    torch.testing.assert_close(with_residual(x) - without(x), x.unsqueeze(-2).expand(3, 4, 8))
    assert not PyramidalTransform(8, 16).residual
    with pytest.raises(ValueError, match="the residual needs in_features == out_features"):
        PyramidalTransform(8, 16, residual=True)
