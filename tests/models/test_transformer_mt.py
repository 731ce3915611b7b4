"""The Transformer baseline for translation: fairseq's parameter counts, shapes, incremental
decoding with a key/value cache, beam search, source padding, mixed precision and initialisation.

The counts are fairseq's (per layer ``4(d^2 + d)`` per attention, ``2 d f + f + d`` per FFN,
``2 d`` per LayerNorm, ``V d`` per table) for the architectures the DeLighT thesis compares with;
the big models are built on the meta device. The rest runs a tiny float64 model.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from src.decoding.beam_search import beam_search, greedy_search
from src.models.transformer_mt import KeyValueState, TransformerEncoderDecoder
from tests.amp import NETWORK_TOLERANCE, autocast_errors

BOS, PAD, EOS = 0, 1, 2  # fairseq's dictionary; 3 is <unk>, 4.. ordinary tokens
VOCAB = 12
TINY = {"d_model": 16, "ffn_dim": 32, "num_heads": 2, "num_layers": 2}
B, S, T = 3, 7, 6

IWSLT = {"d_model": 512, "ffn_dim": 1024, "num_heads": 4, "num_layers": 6}
BASE = {"d_model": 512, "ffn_dim": 2048, "num_heads": 8, "num_layers": 6}
BIG = {"d_model": 1024, "ffn_dim": 4096, "num_heads": 16, "num_layers": 6}
# (name, vocabularies, architecture, shared tables, fairseq's count)
COUNTS = [
    ("iwslt14_de_en", (8848, 6632), IWSLT, False, 39_469_056),
    ("wmt14_en_de", (43736, 43736), BASE, True, 66_531_328),
    ("wmt14_en_fr", (44512, 44512), BASE, True, 66_928_640),
    ("wmt16_en_ro", (34968, 34968), BASE, True, 62_042_112),
    ("wmt14_en_de_big", (43736, 43736), BIG, True, 221_143_040),
    ("wmt14_en_fr_big", (44512, 44512), BIG, True, 221_937_664),
    ("wmt16_en_ro_big", (34968, 34968), BIG, True, 212_164_608),
]


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _fairseq_count(src_vocab: int, tgt_vocab: int, arch: dict[str, int], shared: bool) -> int:
    """fairseq's post-norm ``TransformerModel`` with separate q/k/v/out projections (with
    biases), no final LayerNorms and a tied output layer."""
    d, f, n = arch["d_model"], arch["ffn_dim"], arch["num_layers"]
    attention = 4 * (d * d + d)
    ffn = d * f + f + f * d + d
    encoder_layer = attention + ffn + 2 * (2 * d)
    decoder_layer = 2 * attention + ffn + 3 * (2 * d)
    tables = src_vocab * d + (0 if shared else tgt_vocab * d)
    return n * (encoder_layer + decoder_layer) + tables


@pytest.mark.parametrize(
    ("name", "vocab", "arch", "shared", "expected"), COUNTS, ids=[c[0] for c in COUNTS]
)
def test_params_match_fairseq(
    name: str, vocab: tuple[int, int], arch: dict[str, int], shared: bool, expected: int
) -> None:
    assert _fairseq_count(*vocab, arch, shared) == expected
    with torch.device("meta"):
        model = TransformerEncoderDecoder(*vocab, **arch, share_all_embeddings=shared)
    assert _count(model) == expected
    d = arch["d_model"]
    # torch's packed q/k/v with bias hold fairseq's three (d, d) projections and three biases
    attention = model.encoder_layers[0].self_attn
    assert attention.in_proj_weight.numel() + attention.in_proj_bias.numel() == 3 * (d * d + d)
    assert model.encoder_norm is None and model.decoder_norm is None


def test_thesis_sizes() -> None:
    """Table 5.1's "Transformer (our impl.)": 62 M (En-Ro) and 67 M (En-De, En-Fr); IWSLT'14's
    42 M is the IWSLT model with an untied output layer."""
    millions = {name: round(expected / 1e6) for name, *_, expected in COUNTS}
    wmt = (millions["wmt16_en_ro"], millions["wmt14_en_de"], millions["wmt14_en_fr"])
    assert wmt == (62, 67, 67)
    with torch.device("meta"):
        untied = TransformerEncoderDecoder(
            8848, 6632, **IWSLT, share_decoder_input_output_embed=False
        )
    assert _count(untied) == 39_469_056 + 6632 * 512 == 42_864_640


def test_pre_norm_adds_the_final_layer_norms() -> None:
    with torch.device("meta"):
        post = TransformerEncoderDecoder(VOCAB, VOCAB, **TINY)
        pre = TransformerEncoderDecoder(VOCAB, VOCAB, **TINY, normalize_before=True)
    assert _count(pre) - _count(post) == 2 * 2 * TINY["d_model"]
    assert pre.encoder_layers[0].norm_first and not post.encoder_layers[0].norm_first


def _tiny(**overrides: Any) -> TransformerEncoderDecoder:
    torch.manual_seed(0)
    kwargs = {"src_vocab": VOCAB, "tgt_vocab": VOCAB, **TINY, **overrides}
    return TransformerEncoderDecoder(**kwargs).double().eval()


def _tokens(batch: int, length: int, vocab: int = VOCAB) -> torch.Tensor:
    # ids from 4 on: clear of <s>, <pad>, </s>, <unk>
    return torch.randint(4, vocab, (batch, length))


@pytest.mark.parametrize("share_all", [True, False])
def test_forward_shapes(share_all: bool) -> None:
    tgt_vocab = VOCAB if share_all else 9
    model = _tiny(tgt_vocab=tgt_vocab, share_all_embeddings=share_all)
    src, prev = _tokens(B, S), _tokens(B, T, tgt_vocab)
    logits = model(src, None, prev)
    assert logits.shape == (B, T, tgt_vocab) and logits.dtype == torch.float64
    assert model.encode(src).shape == (S, B, TINY["d_model"])
    assert (model.decoder_embedding is model.encoder_embedding) == share_all
    untied = _tiny(share_decoder_input_output_embed=False)
    assert untied.output.weight.shape == (VOCAB, TINY["d_model"]) and untied.output.bias is None
    assert untied(src, None, prev).shape == (B, T, VOCAB)


def test_invalid_settings_raise() -> None:
    with pytest.raises(ValueError, match="joined dictionary"):
        TransformerEncoderDecoder(VOCAB, VOCAB + 1, **TINY, share_all_embeddings=True)
    with pytest.raises(ValueError, match="share_decoder_input_output_embed"):
        TransformerEncoderDecoder(
            VOCAB, VOCAB, **TINY, share_all_embeddings=True, share_decoder_input_output_embed=False
        )
    with pytest.raises(ValueError, match="num_heads"):
        TransformerEncoderDecoder(VOCAB, VOCAB, d_model=18, num_heads=4)
    with pytest.raises(ValueError, match="attention_dropout"):
        TransformerEncoderDecoder(VOCAB, VOCAB, **TINY, attention_dropout=1.0)


def test_dropouts_follow_fairseq() -> None:
    model = TransformerEncoderDecoder(
        VOCAB, VOCAB, **TINY, dropout=0.3, attention_dropout=0.1, activation_dropout=0.05
    )
    layer = model.decoder_layers[1]
    assert layer.self_attn.dropout == layer.multihead_attn.dropout == 0.1
    assert layer.dropout.p == 0.05  # after the FFN's ReLU
    assert layer.dropout1.p == layer.dropout2.p == layer.dropout3.p == model.dropout.p == 0.3
    assert model.encoder_layers[0].self_attn.dropout == 0.1


def test_decoder_is_causal() -> None:
    model = _tiny()
    src, prev = _tokens(B, S), _tokens(B, T)
    changed = prev.clone()
    changed[:, -1] = (prev[:, -1] - 4 + 1) % (VOCAB - 4) + 4
    with torch.no_grad():
        before, after = model(src, None, prev), model(src, None, changed)
    torch.testing.assert_close(before[:, :-1], after[:, :-1], atol=1e-12, rtol=0)
    assert (before[:, -1] - after[:, -1]).abs().max() > 1e-3


def _sources() -> torch.Tensor:
    return torch.tensor([[4, 5, 6, 7, EOS], [6, 4, EOS, PAD, PAD]])


@pytest.mark.parametrize("normalize_before", [False, True])
@torch.no_grad()
def test_decode_step_equals_teacher_forcing(normalize_before: bool) -> None:
    model = _tiny(normalize_before=normalize_before)
    src = _sources()
    mask = src.eq(PAD)
    encoder_out = model.encode(src, mask)
    prev = torch.tensor([[EOS, 4, 5, 3, 7, 6], [EOS, 7, 7, 0, 4, 2]])
    full = model.decode(prev, encoder_out, mask)  # (B, T, V)
    state = None
    heads, d_h = TINY["num_heads"], TINY["d_model"] // TINY["num_heads"]
    for t in range(prev.shape[1]):
        logits, state = model.decode_step(prev[:, t : t + 1], encoder_out, mask, state)
        assert state.length == t + 1 and logits.shape == (2, 1, VOCAB)
        assert len(state.layers) == TINY["num_layers"]
        for cache in state.layers:
            assert cache.self_keys.shape == cache.self_values.shape == (2, heads, t + 1, d_h)
            assert cache.encoder_keys.shape == cache.encoder_values.shape == (2, heads, 5, d_h)
        torch.testing.assert_close(logits[:, 0], full[:, t], atol=1e-10, rtol=0)
    # several new positions at once, first and after a cached prefix
    logits, state = model.decode_step(prev[:, :2], encoder_out, mask, None)
    torch.testing.assert_close(logits, full[:, :2], atol=1e-10, rtol=0)
    logits, state = model.decode_step(prev[:, 2:5], encoder_out, mask, state)
    torch.testing.assert_close(logits, full[:, 2:5], atol=1e-10, rtol=0)
    logits, _ = model.decode_step(prev[:, 5:], encoder_out, mask, state)
    torch.testing.assert_close(logits, full[:, 5:], atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="unpadded"):
        model.decode_step(torch.tensor([[EOS], [PAD]]), encoder_out, mask, None)


@pytest.mark.parametrize("normalize_before", [False, True])
@torch.no_grad()
def test_decode_step_follows_beam_reordering(normalize_before: bool) -> None:
    """Beams move among the rows of their source between steps, as in beam search; every step
    equals the full decoder over each row's reordered prefix."""
    model = _tiny(normalize_before=normalize_before, share_decoder_input_output_embed=False)
    src, k = _sources(), 3
    rows = torch.arange(2).repeat_interleave(k)  # (B K,), source of each row
    mask = src.eq(PAD).index_select(0, rows)  # (B K, S)
    encoder_out = model.encode(src, src.eq(PAD)).index_select(1, rows)  # (S, B K, d)
    torch.manual_seed(1)
    tokens = torch.full((2 * k, 1), EOS)  # (B K, t)
    state = None
    for _ in range(5):
        logits, state = model.decode_step(tokens[:, -1:], encoder_out, mask, state)
        full = model.decode(tokens, encoder_out, mask)[:, -1:]  # (B K, 1, V)
        torch.testing.assert_close(logits, full, atol=1e-10, rtol=0)
        # each row continues a random beam of its own source
        order = rows * k + torch.randint(0, k, (2 * k,))
        state = state.reorder(order)
        tokens = torch.cat((tokens.index_select(0, order), _tokens(2 * k, 1)), dim=1)


def test_reorder_picks_self_attention_keys_and_keeps_encoders() -> None:
    model = _tiny()
    src = _sources()
    with torch.no_grad():
        encoder_out = model.encode(src)
        _, state = model.decode_step(_tokens(2, 3), encoder_out, src.eq(PAD), None)
    order = torch.tensor([1, 1])
    reordered = state.reorder(order)
    assert isinstance(reordered, KeyValueState) and reordered.length == 3
    for before, after in zip(state.layers, reordered.layers, strict=True):
        assert torch.equal(after.self_keys, before.self_keys[order])
        assert torch.equal(after.self_values, before.self_values[order])
        # all beams of a source share its encoder output: row r keeps row r's keys/values
        assert after.encoder_keys is before.encoder_keys
        assert after.encoder_values is before.encoder_values


@torch.no_grad()
def test_decode_step_computes_only_the_new_positions() -> None:
    """A step's layer work does not grow with the prefix: every decoder layer's FFN and
    attention output projections see the B new rows only, and the encoder's keys/values are
    projected at the first step only."""
    model = _tiny()
    src = _sources()
    mask = src.eq(PAD)
    encoder_out = model.encode(src, mask)
    rows: list[int] = []

    def count(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        rows.append(inputs[0].shape[:-1].numel())

    hooks = [
        module.register_forward_hook(count)
        for layer in model.decoder_layers
        for module in (layer.linear1, layer.self_attn.out_proj, layer.multihead_attn.out_proj)
    ]
    state = None
    for t in range(6):
        rows.clear()
        _, new_state = model.decode_step(_tokens(2, 1), encoder_out, mask, state)
        assert rows == [2] * 3 * TINY["num_layers"], (t, rows)
        if state is not None:
            for before, after in zip(state.layers, new_state.layers, strict=True):
                assert after.encoder_keys is before.encoder_keys
        state = new_state
    for hook in hooks:
        hook.remove()


@torch.no_grad()
def test_decode_step_rejects_what_it_cannot_cache() -> None:
    model = _tiny()
    src = _sources()
    encoder_out = model.encode(src)
    _, state = model.decode_step(_tokens(2, 1), encoder_out, src.eq(PAD), None)
    with pytest.raises(ValueError, match="encoder keys/values"):
        model.decode_step(_tokens(1, 1), encoder_out[:, :1], src[:1].eq(PAD), state)
    model.decoder_layers[1] = nn.TransformerDecoderLayer(
        TINY["d_model"], TINY["num_heads"], TINY["ffn_dim"], batch_first=True
    )
    with pytest.raises(ValueError, match="batch_first"):
        model.decode_step(_tokens(2, 1), encoder_out, src.eq(PAD), None)


@pytest.mark.parametrize("left_pad", [False, True])
def test_padded_source_tokens_do_not_matter(left_pad: bool) -> None:
    model = _tiny()
    src, prev = _tokens(B, S), _tokens(B, T)
    lengths = torch.tensor([S, S - 2, 3])
    pad = torch.arange(S) >= lengths[:, None]  # (B, S), right padding
    if left_pad:
        pad = pad.flip(1)
    src = src.masked_fill(pad, PAD)
    noise = src.masked_scatter(pad, _tokens(B, S)[pad])
    with torch.no_grad():
        logits = model(src, None, prev)
        # the mask from padding_idx equals an explicit one, and with it the pads' ids are ignored
        assert torch.equal(model(src, pad, prev), logits)
        assert torch.equal(model(noise, pad, prev), logits)
        # a padded source translates as the same source alone in its batch
        alone = model(src[2:, ~pad[2]], None, prev[2:])
    torch.testing.assert_close(logits[2:], alone, atol=1e-10, rtol=0)


def _sequence_log_prob(
    model: TransformerEncoderDecoder, src: torch.Tensor, tokens: torch.Tensor
) -> float:
    """sum log p(tokens) by teacher forcing after the eos start (the search's log-softmax runs
    over the whole vocabulary, pad included, before it bans pad)."""
    prev = torch.cat((torch.tensor([EOS]), tokens[:-1])).unsqueeze(0)
    with torch.no_grad():
        lprobs = F.log_softmax(model(src.unsqueeze(0), None, prev)[0], dim=-1)  # (n, V)
    return float(lprobs.gather(1, tokens.unsqueeze(1)).sum())


def test_beam_search_runs_and_scores_by_teacher_forcing() -> None:
    model = _tiny()
    src = _sources()
    common = {"max_len_a": 1.0, "max_len_b": 3, "eos": EOS, "pad": PAD}
    hypotheses = beam_search(model, src, beam_size=3, length_penalty=1.0, **common)
    assert len(hypotheses) == 2
    for i, hyps in enumerate(hypotheses):
        assert 1 <= len(hyps) <= 3
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        for hyp in hyps:
            assert hyp.tokens[-1].item() == EOS and len(hyp.tokens) <= src[i].ne(PAD).sum() + 4
            n = len(hyp.tokens)
            expected = _sequence_log_prob(model, src[i][src[i].ne(PAD)], hyp.tokens) / n
            assert hyp.score == pytest.approx(expected, abs=1e-9)
    # a beam of one without length normalisation is greedy search
    single = beam_search(model, src, beam_size=1, length_penalty=0.0, **common)
    greedy = greedy_search(model, src, length_penalty=0.0, **common)
    for (beam,), best in zip(single, greedy, strict=True):
        assert torch.equal(beam.tokens, best.tokens)
        assert beam.score == pytest.approx(best.score, abs=1e-9)


class _Prefix:
    """The prefix-recomputing decoder's state: the target tokens so far."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def reorder(self, order: torch.Tensor) -> _Prefix:
        return _Prefix(self.tokens.index_select(0, order))


class _PrefixDecoder:
    """``model`` for the searches without the cache: each step runs the full decoder over the
    whole prefix."""

    def __init__(self, model: TransformerEncoderDecoder) -> None:
        self.model = model

    def encode(
        self, src_tokens: torch.Tensor, src_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        return self.model.encode(src_tokens, src_padding_mask)

    def decode_step(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: torch.Tensor,
        src_padding_mask: torch.Tensor | None,
        state: _Prefix | None,
    ) -> tuple[torch.Tensor, _Prefix]:
        tokens = (
            prev_output_tokens
            if state is None
            else torch.cat((state.tokens, prev_output_tokens), 1)
        )
        logits = self.model.decode(tokens, encoder_out, src_padding_mask)
        return logits[:, -prev_output_tokens.shape[1] :], _Prefix(tokens)


@pytest.mark.parametrize("normalize_before", [False, True])
def test_beam_search_with_the_cache_equals_the_prefix_decoder(normalize_before: bool) -> None:
    model = _tiny(normalize_before=normalize_before)
    src = torch.cat((_sources(), _tokens(2, 5)))  # two padded, two full sources
    common = {"max_len_a": 1.0, "max_len_b": 4, "eos": EOS, "pad": PAD, "length_penalty": 1.0}
    cached = beam_search(model, src, beam_size=4, **common)
    prefix = beam_search(_PrefixDecoder(model), src, beam_size=4, **common)
    assert [len(hyps) for hyps in cached] == [len(hyps) for hyps in prefix]
    for hyps, expected in zip(cached, prefix, strict=True):
        for hyp, want in zip(hyps, expected, strict=True):
            assert torch.equal(hyp.tokens, want.tokens)
            assert hyp.score == pytest.approx(want.score, abs=1e-10)


def test_bf16_autocast_forward_backward_keeps_float32() -> None:
    src, prev = _tokens(B, S), _tokens(B, T)
    src[1, -2:] = PAD
    errors = autocast_errors(
        lambda: TransformerEncoderDecoder(VOCAB, VOCAB, **TINY).eval(),
        lambda: [src, src.eq(PAD), prev],
        torch.bfloat16,
        "cpu",
        input_grads=False,
    )
    assert errors["output"] <= NETWORK_TOLERANCE, errors["output"]
    assert errors["parameters.grad"] <= 2 * NETWORK_TOLERANCE, errors["parameters.grad"]
    # training mode with every dropout: the loss is finite and bf16 logits train fp32 weights
    torch.manual_seed(0)
    model = TransformerEncoderDecoder(
        VOCAB, VOCAB, **TINY, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1
    ).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, None, prev)
    assert logits.dtype == torch.bfloat16
    target = torch.roll(prev, -1, dims=1)
    loss = F.cross_entropy(
        logits.float().reshape(-1, VOCAB), target.reshape(-1), label_smoothing=0.1
    )
    loss.backward()
    assert math.isfinite(loss.item()) and 0.5 * math.log(VOCAB) < loss.item() < 3 * math.log(VOCAB)
    for name, param in model.named_parameters():
        assert param.dtype == param.grad.dtype == torch.float32, name
        assert torch.isfinite(param.grad).all(), name


def test_init_follows_fairseq() -> None:
    torch.manual_seed(0)
    d = 64
    model = TransformerEncoderDecoder(200, 200, d_model=d, ffn_dim=128, num_heads=4, num_layers=1)
    table = model.encoder_embedding.weight
    assert torch.count_nonzero(table[PAD]) == 0
    assert table.std().item() == pytest.approx(d**-0.5, rel=0.05)
    attention = model.decoder_layers[0].multihead_attn
    # each of q, k, v: xavier-uniform over (d, d) with gain 1/sqrt(2)
    bound = 2**-0.5 * math.sqrt(6 / (2 * d))
    for projection in attention.in_proj_weight.chunk(3):
        assert projection.abs().max() <= bound and projection.abs().max() > 0.9 * bound
    assert attention.in_proj_bias.abs().max() <= d**-0.5
    assert torch.count_nonzero(attention.out_proj.bias) == 0
    linear1 = model.encoder_layers[0].linear1
    assert linear1.weight.abs().max() <= math.sqrt(6 / (d + 128))
    assert torch.count_nonzero(linear1.bias) == 0
    assert model.embed_scale == math.sqrt(d)
