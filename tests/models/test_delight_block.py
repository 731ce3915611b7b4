"""DeLighT blocks and block-wise scaling: shapes, masks, parameter counts, gradients, bf16."""

from __future__ import annotations

import pytest
import torch

from src.models.delight_block import DeLighTDecoderBlock, DeLighTEncoderBlock, block_wise_scaling
from tests.amp import NETWORK_TOLERANCE, autocast_errors

D_M, T, S, B = 128, 6, 7, 2
SIZES = {"width_multiplier": 2.0, "depth": 4, "max_groups": 4}


def _randomise(block: torch.nn.Module) -> torch.nn.Module:
    # no trivial LayerNorm affines or zero biases, as in the official fixtures
    with torch.no_grad():
        for name, param in block.named_parameters():
            if "norm" in name or "bias" in name:
                param.add_(0.1 * torch.randn_like(param))
    return block


def _encoder(**overrides: object) -> DeLighTEncoderBlock:
    torch.manual_seed(0)
    return _randomise(DeLighTEncoderBlock(D_M, **SIZES, **overrides)).double().eval()


def _decoder(**overrides: object) -> DeLighTDecoderBlock:
    torch.manual_seed(0)
    return _randomise(DeLighTDecoderBlock(D_M, **SIZES, **overrides)).double().eval()


def _x(length: int = T) -> torch.Tensor:
    return torch.randn(length, B, D_M, dtype=torch.float64)


def test_block_wise_scaling_official() -> None:
    # thesis Sec. 5.4 MT setting, N 4 -> 8, w_m 2, B = N_max = 8; depths truncated
    assert block_wise_scaling(4, 8, 2.0) == (
        (4, 2.0), (4, 2.143), (5, 2.286), (5, 2.429), (6, 2.571), (6, 2.714), (7, 2.857), (8, 3.0)
    )  # fmt: skip
    iwslt = block_wise_scaling(3, 9, 1.0)
    assert [n for n, _ in iwslt] == [3, 3, 4, 5, 6, 6, 7, 8, 9]
    assert [w for _, w in iwslt] == [1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0]
    wt103 = block_wise_scaling(4, 12, 2.0)
    assert [n for n, _ in wt103] == [4, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11, 12]
    assert [w for _, w in wt103][:3] == [2.0, 2.182, 2.364]
    assert block_wise_scaling(4, 4, 2.0) == ((4, 2.0),) * 4  # uniform


def test_block_wise_scaling_paper() -> None:
    # Eq. 5.4: N^b = 4 + 4b/7 rounded to the nearest integer, w^b = 2 + 4b/(4 * 7) unrounded
    paper = block_wise_scaling(4, 8, 2.0, rule="paper")
    assert [n for n, _ in paper] == [4, 5, 5, 6, 6, 7, 7, 8]
    assert [w for _, w in paper] == pytest.approx([2 + b / 7 for b in range(8)], abs=1e-15)
    # the widths agree with the code's to its three decimals
    official = block_wise_scaling(4, 8, 2.0)
    assert [round(w, 3) for _, w in paper] == [w for _, w in official]
    assert block_wise_scaling(4, 8, 2.0, num_blocks=1, rule="paper") == ((4, 2.0),)


def test_block_wise_scaling_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="n_min <= n_max"):
        block_wise_scaling(8, 4, 2.0)
    with pytest.raises(ValueError, match="rule must be"):
        block_wise_scaling(4, 8, 2.0, rule="thesis")


def test_parameter_counts() -> None:
    # d_m = 128, d_o = 64, N = 4, w_m = 2, g_max = 4: GLTs (in, out, g) = (64, 64, 2),
    # (128, 256, 4), (320, 256, 4), (320, 64, 2) (official schedule)
    # DExTra: input Linear 128*64+64 + LN 2*64                         =  8,384
    #   GLT weights in*out/g + biases out + shared per-group LN 2*out/g:
    #   2,048+64+64 = 2,176; 8,192+256+128 = 8,576; 20,480+256+128 = 20,864; 10,240+64+64 = 10,368
    #   output Linear 128*64+64 + LN 2*64                              =  8,384 -> 58,752
    # self-attention: qkv 64*192+192 = 12,480, out_proj 64*128+128 = 8,320   -> 20,800
    # FFN: fc1 128*32+32 = 4,128, fc2 32*128+128 = 4,224                       ->  8,352
    # two LayerNorms(128): 512. Encoder: 58,752 + 20,800 + 8,352 + 512 = 88,416
    # encoder attention: q 128*64+64 = 8,256, kv 128*128+128 = 16,512, out_proj 8,320, LN 256
    #   = 33,344. Decoder: 88,416 + 33,344 = 121,760
    assert sum(p.numel() for p in _encoder().parameters()) == 88_416
    assert sum(p.numel() for p in _decoder(cross_attention=False).parameters()) == 88_416
    assert sum(p.numel() for p in _decoder().parameters()) == 121_760


@pytest.mark.parametrize("normalize_before", [False, True])
def test_shapes(normalize_before: bool) -> None:
    assert _encoder(normalize_before=normalize_before)(_x()).shape == (T, B, D_M)
    y, weights = _decoder(normalize_before=normalize_before)(_x(), _x(S), need_weights=True)
    assert y.shape == (T, B, D_M) and weights.shape == (T, B, S)
    y, weights = _decoder(cross_attention=False, normalize_before=normalize_before)(_x())
    assert y.shape == (T, B, D_M) and weights is None


@pytest.mark.parametrize("cross_attention", [False, True])
def test_decoder_is_causal(cross_attention: bool) -> None:
    block = _decoder(cross_attention=cross_attention)
    x = _x()
    memory = [_x(S)] if cross_attention else []
    y, _ = block(x, *memory)
    for t in range(T - 1):
        changed = x.clone()
        changed[t + 1 :] += torch.randn_like(changed[t + 1 :])
        perturbed, _ = block(changed, *memory)
        assert torch.equal(perturbed[: t + 1], y[: t + 1])
        assert not torch.equal(perturbed[t + 1 :], y[t + 1 :])


@pytest.mark.parametrize(
    "cross_attention, normalize_before",
    [(True, False), (False, True)],  # the MT and LM blocks
)
@torch.no_grad()
def test_decoder_step_equals_forward(cross_attention: bool, normalize_before: bool) -> None:
    block = _decoder(cross_attention=cross_attention, normalize_before=normalize_before)
    x = _x()
    padding_mask = torch.tensor([[False] * S, [False] * (S - 2) + [True] * 2])
    memory = (_x(S), padding_mask) if cross_attention else (None, None)
    y, _ = block(x, *memory)
    cache = None
    for t in range(T):
        step, cache = block.forward_step(x[t : t + 1], *memory, cache)
        assert cache.self_attn.key.shape == (t + 1, B, block.d_o)
        assert (cache.encoder_attn is not None) == cross_attention
        torch.testing.assert_close(step[0], y[t], atol=1e-10, rtol=0)
    # the cache follows its sequences when reordered; the encoder output is then read from it
    order = torch.tensor([1, 1])
    new = _x(1)
    if cross_attention:
        memory = (memory[0][:, order], padding_mask[order])
    step, _ = block.forward_step(new, *memory, cache.reorder(order))
    full, _ = block(torch.cat((x[:, order], new)), *memory)
    torch.testing.assert_close(step[0], full[-1], atol=1e-10, rtol=0)


def test_encoder_attn_mask_blocks_its_nonzero_entries() -> None:
    block = _encoder()
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = _x()
    y = block(x, attn_mask=future)
    changed = x.clone()
    changed[3:] += 1.0
    # -1e8 underflows to probability 0, so earlier positions are untouched
    assert torch.equal(block(changed, attn_mask=future)[:3], y[:3])
    assert torch.equal(block(x, attn_mask=future.double()), y)


def test_encoder_ignores_padded_positions() -> None:
    block = _encoder()
    x = _x()
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, 4:] = True
    y = block(x, pad)
    changed = x.clone()
    changed[4:, 1] = 100 * torch.randn(T - 4, D_M, dtype=torch.float64)
    perturbed = block(changed, pad)
    torch.testing.assert_close(perturbed[:4, 1], y[:4, 1], rtol=0, atol=1e-12)
    torch.testing.assert_close(perturbed[:, 0], y[:, 0], rtol=0, atol=0)
    # the same as the unpadded sequence alone
    torch.testing.assert_close(block(x[:4, 1:2])[:, 0], y[:4, 1], rtol=0, atol=1e-12)


def test_decoder_ignores_padded_source_positions() -> None:
    block = _decoder()
    x, memory = _x(), _x(S)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, 5:] = True
    y, weights = block(x, memory, pad, need_weights=True)
    assert (weights[:, 0, 5:] == 0).all()
    changed = memory.clone()
    changed[5:, 0] = 100 * torch.randn(S - 5, D_M, dtype=torch.float64)
    perturbed, _ = block(x, changed, pad)
    torch.testing.assert_close(perturbed, y, rtol=0, atol=1e-12)


def test_decoder_checks_encoder_out() -> None:
    with pytest.raises(ValueError, match="encoder_out must be given"):
        _decoder(cross_attention=False)(_x(), _x(S))
    with pytest.raises(ValueError, match="encoder_out must be given"):
        _decoder()(_x())


@pytest.mark.parametrize("normalize_before", [False, True])
def test_backward_gives_finite_gradients(normalize_before: bool) -> None:
    dropouts = {
        "dropout": 0.1,
        "attention_dropout": 0.1,
        "activation_dropout": 0.1,
        "ffn_dropout": 0.1,
        "dextra_dropout": 0.1,
    }
    torch.manual_seed(0)
    block = DeLighTDecoderBlock(D_M, **SIZES, normalize_before=normalize_before, **dropouts)
    x = torch.randn(T, B, D_M, requires_grad=True)
    memory = torch.randn(S, B, D_M, requires_grad=True)
    y, _ = block.train()(x, memory)
    y.square().mean().backward()
    for tensor in [x, memory, *block.parameters()]:
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all()


@pytest.mark.parametrize("kind", ["encoder", "decoder", "lm"])
def test_bf16_autocast_is_close_to_float32(kind: str) -> None:
    def make() -> torch.nn.Module:
        if kind == "encoder":
            return _randomise(DeLighTEncoderBlock(D_M, **SIZES)).eval()
        cross = kind == "decoder"
        return _randomise(
            DeLighTDecoderBlock(D_M, **SIZES, cross_attention=cross, normalize_before=not cross)
        ).eval()

    def inputs() -> list[torch.Tensor]:
        memory = [torch.randn(S, B, D_M)] if kind == "decoder" else []
        return [torch.randn(T, B, D_M), *memory]

    errors = autocast_errors(make, inputs, torch.bfloat16, "cpu")
    assert errors["output"] < NETWORK_TOLERANCE, errors
    assert errors["parameters.grad"] < NETWORK_TOLERANCE, errors


def test_reset_parameters_reinitialises_every_submodule() -> None:
    block = _decoder()
    before = {name: p.clone() for name, p in block.named_parameters()}
    block.reset_parameters()
    for name, p in block.named_parameters():
        if "weight" in name and "norm" not in name:
            assert not torch.equal(p, before[name]), name
        if "norm" in name:
            fresh = torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)
            assert torch.equal(p, fresh), name
