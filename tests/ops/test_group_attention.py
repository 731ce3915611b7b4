from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from src.ops.group_attention import GroupAttention
from src.ops.relative_position import (
    causal_memory_mask,
    rel_shift,
    relative_attention,
    relative_sinusoid,
)

D, H, G = 16, 4, 2


@pytest.fixture(autouse=True)
def one_thread():
    # at these tiny shapes waking a second thread costs more than it saves on a shared CPU
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_inputs(batch: int = 2, qlen: int = 5, mlen: int = 3, d_model: int = D, n_head: int = H):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(batch, qlen, d_model, generator=gen)
    memory = torch.randn(batch, mlen, d_model, generator=gen) if mlen else None
    r = relative_sinusoid(mlen + qlen, d_model)
    biases = torch.randn(2, n_head, d_model // n_head, generator=gen) * 0.1
    return h, memory, r, biases[0], biases[1]


def test_shapes_batch_first_with_and_without_memory() -> None:
    attn = GroupAttention(D, H, G).eval()
    h, memory, r, rw, rr = make_inputs()
    assert attn(h, r, rw, rr, memory=memory).shape == h.shape
    assert attn(h, relative_sinusoid(5, D), rw, rr).shape == h.shape


def test_future_tokens_do_not_change_earlier_outputs() -> None:
    attn = GroupAttention(D, H, G).eval()
    h, memory, r, rw, rr = make_inputs()
    changed = h.clone()
    changed[:, 3] += torch.randn(2, D)  # not a constant shift, which the norms would remove
    out, out_changed = attn(h, r, rw, rr, memory=memory), attn(changed, r, rw, rr, memory=memory)
    torch.testing.assert_close(out[:, :3], out_changed[:, :3], rtol=0, atol=0)
    assert (out[:, 3:] - out_changed[:, 3:]).abs().amax(dim=-1).min() > 1e-4


def test_memory_equals_rows_of_the_concatenated_run() -> None:
    # query i of the segment sees the same keys at the same distances as row mlen + i of a
    # memory-free run over cat(memory, segment), and all norms act per position
    attn = GroupAttention(D, H, G).eval()
    h, memory, r, rw, rr = make_inputs(mlen=4)
    with_memory = attn(h, r, rw, rr, memory=memory)
    full = attn(torch.cat([memory, h], 1), r, rw, rr)
    torch.testing.assert_close(with_memory, full[:, 4:], rtol=1e-5, atol=1e-6)


def test_memory_changes_the_output() -> None:
    attn = GroupAttention(D, H, G).eval()
    h, memory, r, rw, rr = make_inputs()
    out = attn(h, r, rw, rr, memory=memory)
    assert not torch.allclose(out, attn(h, r, rw, rr, memory=torch.randn_like(memory)))


def test_without_inter_group_equals_zero_inter_maps() -> None:
    full = GroupAttention(D, H, G)
    intra = GroupAttention(D, H, G, inter_group=False)
    assert intra.inter_q_net is None and intra.inter_o_net is None
    state = {k: v for k, v in full.state_dict().items() if not k.startswith("inter_")}
    intra.load_state_dict(state)
    h, memory, r, rw, rr = make_inputs()
    assert not torch.allclose(full(h, r, rw, rr, memory=memory), intra(h, r, rw, rr, memory=memory))
    with torch.no_grad():
        full.inter_q_net.weight.zero_()
        full.inter_o_net.weight.zero_()
    torch.testing.assert_close(
        full(h, r, rw, rr, memory=memory), intra(h, r, rw, rr, memory=memory)
    )


@pytest.mark.parametrize(("groups", "official"), [(2, 295_936), (4, 214_016)])
def test_parameter_count_matches_formula(groups: int, official: int) -> None:
    # 2D^2 + 5D^2/G + 4D (params.json, per_module_params_d256_8heads)
    d = 256
    count = sum(p.numel() for p in GroupAttention(d, 8, groups).parameters())
    assert count == 2 * d * d + 5 * d * d // groups + 4 * d == official
    intra = sum(p.numel() for p in GroupAttention(d, 8, groups, inter_group=False).parameters())
    assert intra == 2 * d * d + 3 * d * d // groups + 4 * d


def test_gradcheck() -> None:
    attn = GroupAttention(8, 4, 2).double()
    h, memory, r, rw, rr = (t.double() for t in make_inputs(batch=1, qlen=3, mlen=2, d_model=8))
    names = [name for name, _ in attn.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in attn.parameters())
    inputs = tuple(t.clone().requires_grad_() for t in (h, memory, r, rw, rr))

    def run(*args: torch.Tensor) -> torch.Tensor:
        weights, (h_, m_, r_, rw_, rr_) = args[: len(names)], args[len(names) :]
        return functional_call(attn, dict(zip(names, weights)), (h_, r_, rw_, rr_, m_))

    # every input and weight by random projections, the activations also element by element
    assert torch.autograd.gradcheck(run, params + inputs, fast_mode=True)
    params = tuple(p.detach() for p in params)
    assert torch.autograd.gradcheck(lambda *xs: run(*params, *xs), inputs)


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match=r"n_head \(6\) divisible by groups \(4\)"):
        GroupAttention(24, 6, 4)
    attn = GroupAttention(D, H, G)
    h, memory, r, rw, rr = make_inputs()
    with pytest.raises(ValueError, match=r"\(8, 16\), got \(5, 16\)"):
        attn(h, r[:5], rw, rr, memory=memory)


def test_rel_shift_aligns_distances() -> None:
    qlen, klen = 3, 5
    x = torch.arange(qlen * klen, dtype=torch.float).view(qlen, klen)
    shifted = rel_shift(x.expand(2, 1, qlen, klen))
    mask = causal_memory_mask(qlen, klen - qlen)
    for i in range(qlen):
        for j in range(klen):
            if not mask[i, j]:
                assert shifted[1, 0, i, j] == x[i, j + qlen - 1 - i]
    with pytest.raises(ValueError, match="qlen=5, klen=3"):
        rel_shift(torch.zeros(5, 3))


def test_causal_memory_mask() -> None:
    mask = causal_memory_mask(2, 3)
    assert mask.tolist() == [[False] * 4 + [True], [False] * 5]


def test_relative_attention_without_positions_is_causal_softmax_attention() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 4, 6, generator=gen) for _ in range(3))
    zeros = torch.zeros(3, 6)
    mask = causal_memory_mask(4, 0)
    out = relative_attention(q, k, v, torch.zeros(3, 4, 6), zeros, zeros, mask=mask)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, expected)
