"""DeLighT's single-head attention: masks, shapes, the fused and explicit paths, gradients, bf16."""

from __future__ import annotations

import pytest
import torch

from src.ops.single_head_attention import (
    KeyValueCache,
    SingleHeadAttention,
    causal_attention_mask,
    encoder_keys_values,
)
from tests.amp import OP_TOLERANCE, autocast_errors

T, S, B, D_O, D_M = 5, 6, 3, 16, 32


def _self(dtype: torch.dtype = torch.float64) -> SingleHeadAttention:
    torch.manual_seed(0)
    return SingleHeadAttention(D_M, D_O).to(dtype).eval()


def _cross(dtype: torch.dtype = torch.float64) -> SingleHeadAttention:
    torch.manual_seed(0)
    return SingleHeadAttention(D_M, D_O, cross_attention=True).to(dtype).eval()


def _query_width(attention: SingleHeadAttention) -> int:
    # self-attention reads the DExTra output (d_o), cross-attention the residual stream (d_model)
    return attention.d_model if attention.cross_attention else attention.d_o


def test_causal_attention_mask() -> None:
    inf = float("-inf")
    assert causal_attention_mask(3).tolist() == [[0, inf, inf], [0, 0, inf], [0, 0, 0]]


def test_shapes_and_weights() -> None:
    x = torch.randn(T, B, D_O, dtype=torch.float64)
    out, probs = _self()(x, need_weights=True)
    assert out.shape == (T, B, D_M) and probs.shape == (T, B, T)
    torch.testing.assert_close(probs.sum(-1), torch.ones(T, B, dtype=torch.float64))
    assert _self()(x)[1] is None
    memory = torch.randn(S, B, D_M, dtype=torch.float64)
    out, probs = _cross()(torch.randn(T, B, D_M, dtype=torch.float64), memory, need_weights=True)
    assert out.shape == (T, B, D_M) and probs.shape == (T, B, S)


def test_projection_is_split_q_k_v_and_q_is_scaled_after_the_bias() -> None:
    attention = _self()
    x = torch.randn(T, B, D_O, dtype=torch.float64)
    weight, bias = attention.qkv_proj.weight, attention.qkv_proj.bias
    rows = [slice(i * D_O, (i + 1) * D_O) for i in range(3)]  # q, k, v in that order
    q, k, v = (x @ weight[r].T + bias[r] for r in rows)
    q = q * D_O**-0.5
    # (T, B, d) -> (B, T, d)
    scores = torch.einsum("tbd,sbd->bts", q, k)
    probs = scores.softmax(-1)
    expected = attention.out_proj(torch.einsum("bts,sbd->tbd", probs, v))
    out, weights = attention(x, need_weights=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, probs.transpose(0, 1), rtol=0, atol=1e-14)


@pytest.mark.parametrize("make", [_self, _cross])
def test_fused_and_explicit_paths_agree(make) -> None:
    attention = make()
    query = torch.randn(T, B, _query_width(attention), dtype=torch.float64)
    memory = torch.randn(S, B, D_M, dtype=torch.float64) if attention.cross_attention else None
    keys = S if attention.cross_attention else T
    pad = torch.zeros(B, keys, dtype=torch.bool)
    pad[0, -2:] = True
    mask = torch.randn(T, keys, dtype=torch.float64)
    kwargs = {"key_padding_mask": pad, "attn_mask": mask}
    fused, _ = attention(query, memory, **kwargs)
    explicit, _ = attention(query, memory, need_weights=True, **kwargs)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-12)


def test_causal_mask_makes_position_t_blind_to_later_inputs() -> None:
    attention = _self()
    x = torch.randn(T, B, D_O, dtype=torch.float64)
    mask = causal_attention_mask(T, dtype=torch.float64)
    for need_weights in (False, True):
        out, _ = attention(x, attn_mask=mask, need_weights=need_weights)
        for t in range(T - 1):
            changed = x.clone()
            changed[t + 1 :] += torch.randn_like(changed[t + 1 :])
            perturbed, _ = attention(changed, attn_mask=mask, need_weights=need_weights)
            assert torch.equal(perturbed[: t + 1], out[: t + 1])
            assert not torch.equal(perturbed[t + 1 :], out[t + 1 :])


@pytest.mark.parametrize("need_weights", [False, True])
def test_padded_keys_are_ignored(need_weights: bool) -> None:
    attention = _cross()
    query = torch.randn(T, B, D_M, dtype=torch.float64)
    memory = torch.randn(S, B, D_M, dtype=torch.float64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, 4:] = True
    out, probs = attention(query, memory, key_padding_mask=pad, need_weights=need_weights)
    changed = memory.clone()
    changed[4:, 1] = 1e3 * torch.randn(S - 4, D_M, dtype=torch.float64)
    perturbed, _ = attention(query, changed, key_padding_mask=pad, need_weights=need_weights)
    torch.testing.assert_close(perturbed, out, rtol=0, atol=1e-12)
    # the same as attending over the unpadded keys alone
    alone, _ = attention(query[:, 1:2], memory[:4, 1:2])
    torch.testing.assert_close(out[:, 1:2], alone, rtol=0, atol=1e-12)
    if need_weights:
        assert (probs[:, 1, 4:] == 0).all()


def test_backward_gives_finite_gradients() -> None:
    torch.manual_seed(0)
    attention = SingleHeadAttention(D_M, D_O, cross_attention=True, dropout=0.1).train()
    query = torch.randn(T, B, D_M, requires_grad=True)
    memory = torch.randn(S, B, D_M, requires_grad=True)
    out, _ = attention(query, memory)
    out.square().mean().backward()
    for tensor in [query, memory, *attention.parameters()]:
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all()


@pytest.mark.parametrize("cross_attention", [False, True])
def test_bf16_autocast_is_close_to_float32(cross_attention: bool) -> None:
    width = D_M if cross_attention else D_O

    def make() -> SingleHeadAttention:
        return SingleHeadAttention(D_M, D_O, cross_attention=cross_attention)

    def inputs() -> list[torch.Tensor]:
        memory = [torch.randn(S, B, D_M)] if cross_attention else []
        return [torch.randn(T, B, width), *memory]

    errors = autocast_errors(make, inputs, torch.bfloat16, "cpu")
    assert errors["output"] < OP_TOLERANCE, errors


@pytest.mark.parametrize("make", [_self, _cross])
def test_16_bit_fused_path_is_as_close_to_exact_as_the_official_form(make) -> None:
    """In bfloat16 the fused kernel (no probabilities asked for) and the official explicit form
    (float32 softmax of 16-bit scores) both stay within bf16 rounding of the float64 result, the
    fused one no further from it."""
    torch.manual_seed(1)
    exact = make()
    keys = S if exact.cross_attention else 4 * T
    query = 3 * torch.randn(4 * T, B, _query_width(exact), dtype=torch.float64)
    memory = 3 * torch.randn(S, B, D_M, dtype=torch.float64) if exact.cross_attention else None
    pad = torch.zeros(B, keys, dtype=torch.bool)
    pad[0, -2:] = True
    kwargs = {"key_padding_mask": pad, "attn_mask": torch.randn(4 * T, keys, dtype=torch.float64)}
    with torch.no_grad():
        truth, _ = exact(query, memory, **kwargs)
    half = make(torch.bfloat16)
    inputs = [t if t is None else t.bfloat16() for t in (query, memory)]
    half_kwargs = {**kwargs, "attn_mask": kwargs["attn_mask"].bfloat16()}
    fused, _ = half(*inputs, **half_kwargs)
    explicit, _ = half(*inputs, need_weights=True, **half_kwargs)

    def error(out: torch.Tensor) -> float:
        return float((out.detach().double() - truth).abs().max() / truth.abs().max())

    assert error(explicit) < OP_TOLERANCE
    assert error(fused) <= error(explicit) * 1.25, (error(fused), error(explicit))


def test_softmax_runs_in_float32_for_16_bit_inputs() -> None:
    attention = _self(torch.bfloat16)
    _, probs = attention(torch.randn(T, B, D_O, dtype=torch.bfloat16), need_weights=True)
    assert probs.dtype == torch.float32


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="widths must be positive"):
        SingleHeadAttention(D_M, 0)
    with pytest.raises(ValueError, match="needs key_value"):
        _cross()(torch.randn(T, B, D_M, dtype=torch.float64))
    with pytest.raises(ValueError, match="takes no key_value"):
        _self()(torch.randn(T, B, D_O, dtype=torch.float64), torch.randn(S, B, D_O))
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        _self()(torch.randn(T, B, D_O, dtype=torch.float64), key_padding_mask=torch.ones(B, S) > 0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_padding_bias_is_the_bool_mask_built_once(need_weights: bool) -> None:
    """A model builds the key padding as an additive mask once (padding_bias); every layer then
    computes what the bool mask gives it, on both paths."""
    from src.ops.single_head_attention import attention_dtype, padding_bias

    attention = _cross()
    query = torch.randn(T, B, D_M, dtype=torch.float64)
    memory = torch.randn(S, B, D_M, dtype=torch.float64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, -2:] = True
    pad[2, -1] = True
    bias = padding_bias(pad, attention_dtype(attention.q_proj.weight))
    assert bias.dtype == torch.float64 and bias.shape == (B, S)
    assert (bias[pad] == float("-inf")).all() and (bias[~pad] == 0).all()
    out, probs = attention(query, memory, key_padding_mask=bias, need_weights=need_weights)
    expected, expected_probs = attention(
        query, memory, key_padding_mask=pad, need_weights=need_weights
    )
    assert torch.equal(out, expected)
    if need_weights:
        assert torch.equal(probs, expected_probs) and (probs[:, 0, -2:] == 0).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention_dtype(attention.q_proj.weight.float()) == torch.bfloat16


def test_encoder_keys_values_equal_each_layers_own_projection() -> None:
    torch.manual_seed(0)
    layers = [SingleHeadAttention(D_M, D_O, cross_attention=True).double() for _ in range(3)]
    memory = torch.randn(S, B, D_M, dtype=torch.float64, requires_grad=True)
    query = torch.randn(T, B, D_M, dtype=torch.float64)
    caches = encoder_keys_values(layers, memory)
    assert len(caches) == 3 and all(c.key.shape == c.value.shape == (S, B, D_O) for c in caches)
    for layer, cache in zip(layers, caches, strict=True):
        k, v = layer.kv_proj(memory).chunk(2, dim=-1)  # keys then values
        torch.testing.assert_close(cache.key, k, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(cache.value, v, rtol=1e-12, atol=1e-12)
    # the layers' outputs and every gradient, through the one product and through each its own
    stacked = sum(layer(query, cache)[0].square().sum() for layer, cache in zip(layers, caches))
    own = sum(layer(query, memory)[0].square().sum() for layer in layers)
    torch.testing.assert_close(stacked, own, rtol=1e-12, atol=0)
    wanted = [memory, *(p for layer in layers for p in layer.kv_proj.parameters())]
    for a, b in zip(torch.autograd.grad(stacked, wanted), torch.autograd.grad(own, wanted)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_projected_keys_values_are_checked() -> None:
    attention = _cross()
    query = torch.randn(T, B, D_M, dtype=torch.float64)
    wrong = KeyValueCache(torch.zeros(S, B, D_O + 1), torch.zeros(S, B, D_O + 1))
    with pytest.raises(ValueError, match="d_o=16"):
        attention(query, wrong)
    with pytest.raises(ValueError, match="cross-attention layers"):
        encoder_keys_values([attention, _self()], torch.zeros(S, B, D_M, dtype=torch.float64))
