from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from src.ops.group_feedforward import GroupFeedForward
from src.ops.per_group_layer_norm import PerGroupLayerNorm

D, G = 16, 2


@pytest.fixture(autouse=True)
def one_thread():
    # at these tiny shapes waking a second thread costs more than it saves on a shared CPU
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_shapes_any_leading_dims() -> None:
    ffn = GroupFeedForward(D, 4 * D, G)
    assert ffn(torch.randn(2, 5, D)).shape == (2, 5, D)
    assert ffn(torch.randn(5, D)).shape == (5, D)


def test_positions_are_independent() -> None:
    ffn = GroupFeedForward(D, 4 * D, G)
    x = torch.randn(2, 5, D)
    changed = x.clone()
    changed[:, 2] = torch.randn(2, D)
    out, out_changed = ffn(x), ffn(changed)
    keep = [0, 1, 3, 4]
    torch.testing.assert_close(out[:, keep], out_changed[:, keep], rtol=0, atol=0)


@pytest.mark.parametrize("groups", [2, 4])
def test_inter_group_path_mixes_groups_only_when_enabled(groups: int) -> None:
    x = torch.randn(3, D)
    changed = x.clone()
    changed[:, : D // groups] = torch.randn(3, D // groups)  # group 0 only
    for inter_group in (True, False):
        ffn = GroupFeedForward(D, 4 * D, groups, inter_group=inter_group)
        delta = (ffn(x) - ffn(changed)).abs().unflatten(-1, (groups, D // groups)).amax((0, 2))
        assert delta[0] > 1e-3
        if inter_group:
            assert (delta[1:] > 1e-3).all()
        else:
            assert (delta[1:] == 0).all()


@pytest.mark.parametrize("groups", [2, 4])
def test_shuffle_sends_m_interleaved_features_from_every_source_group(groups: int) -> None:
    # target group g' receives units [g'M, (g'+1)M) of every source group, source fastest
    ffn = GroupFeedForward(D, 4 * D, groups)
    d_group, m = D // groups, D // groups // groups
    with torch.no_grad():
        ffn.inter_linear.bias.zero_()
    for source in range(groups):
        x = torch.zeros(1, D)
        block = slice(source * d_group, (source + 1) * d_group)
        x[:, block] = torch.randn(1, d_group)
        unshuffled = x[:, block] @ ffn.inter_linear.weight[source]
        t = ffn.inter_linear(x).unflatten(-1, (groups, m, groups))  # (1, target, unit, source)
        for target in range(groups):
            expected = unshuffled[:, target * m : (target + 1) * m]
            torch.testing.assert_close(t[:, target, :, source], expected)
        others = [s for s in range(groups) if s != source]
        assert (t[..., others] == 0).all()


@pytest.mark.parametrize(("groups", "official"), [(2, 431_104), (4, 218_112)])
def test_parameter_count_matches_formula(groups: int, official: int) -> None:
    # 13D^2/G weights + 6D biases + 14D norm parameters at d_inner = 4D (params.json)
    d = 256
    count = sum(p.numel() for p in GroupFeedForward(d, 4 * d, groups).parameters())
    assert count == 13 * d * d // groups + 6 * d + 14 * d == official
    intra = GroupFeedForward(d, 4 * d, groups, inter_group=False)
    assert sum(p.numel() for p in intra.parameters()) == 8 * d * d // groups + 5 * d + 10 * d


def test_dropout_only_in_training() -> None:
    ffn = GroupFeedForward(D, 4 * D, G, dropout=0.5)
    x = torch.randn(4, D)
    torch.testing.assert_close(ffn.eval()(x), ffn.eval()(x))
    assert not torch.allclose(ffn.train()(x), ffn.eval()(x))


@pytest.mark.parametrize("inter_group", [True, False])
def test_gradcheck(inter_group: bool) -> None:
    ffn = GroupFeedForward(8, 16, 2, inter_group=inter_group).double()
    names = [name for name, _ in ffn.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in ffn.parameters())
    x = torch.randn(2, 8, dtype=torch.float64, requires_grad=True)

    def run(*args: torch.Tensor) -> torch.Tensor:
        return functional_call(ffn, dict(zip(names, args[:-1])), (args[-1],))

    assert torch.autograd.gradcheck(run, (*params, x), fast_mode=True)
    assert torch.autograd.gradcheck(lambda x_: ffn(x_), (x,))


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match=r"d_model / groups \(6\) divisible by groups \(4\)"):
        GroupFeedForward(24, 96, 4)
    GroupFeedForward(24, 96, 4, inter_group=False)
    with pytest.raises(ValueError, match=r"d_inner \(30\) must be divisible by groups \(4\)"):
        GroupFeedForward(32, 30, 4)


def test_per_group_layer_norm_uses_unbiased_std_plus_eps() -> None:
    norm = PerGroupLayerNorm(8, 2, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(3, 8)
    chunks = x.view(3, 2, 4)
    expected = (chunks - chunks.mean(-1, keepdim=True)) / (chunks.std(-1, keepdim=True) + 1e-6)
    expected = expected.view(3, 8) * norm.weight + norm.bias
    torch.testing.assert_close(norm(x), expected)
    layer_norm = torch.nn.LayerNorm(4, elementwise_affine=False)
    assert not torch.allclose(norm(x), layer_norm(chunks).view(3, 8) * norm.weight + norm.bias)


def test_per_group_layer_norm_gradcheck_and_errors() -> None:
    norm = PerGroupLayerNorm(6, 3).double()
    x = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))
    with pytest.raises(ValueError, match=r"num_features \(6\) must be divisible by groups \(4\)"):
        PerGroupLayerNorm(6, 4)
    with pytest.raises(ValueError, match="num_features=3, groups=3"):
        PerGroupLayerNorm(3, 3)
