"""Incremental decoding of the DeLighT encoder-decoder, beam search and greedy search.

A tiny float64 model in eval mode: incremental logits equal the full decoder's, the cache
reorders like its sequences, a wide beam finds the exhaustive optimum, greedy search is a beam of
one, and lengths, eos and source padding behave as fairseq's generator (module docstring).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from src.decoding.beam_search import Hypothesis, beam_search, greedy_search
from src.models.delight_mt import DecoderState, DeLighTEncoderDecoder

BOS, PAD, EOS = 0, 1, 2  # fairseq's dictionary; 3 is <unk>, 4.. ordinary tokens
VOCAB = 8


@pytest.fixture(scope="module")
def model() -> DeLighTEncoderDecoder:
    torch.manual_seed(0)
    net = DeLighTEncoderDecoder(VOCAB, VOCAB, d_model=64, n_min=2, n_max=3, padding_idx=PAD)
    return net.double().eval()


def _sources() -> torch.Tensor:
    return torch.tensor([[4, 5, 6, 7, EOS], [6, 4, EOS, PAD, PAD]])


def _full_logits(
    model: DeLighTEncoderDecoder, src: torch.Tensor, prev: torch.Tensor
) -> torch.Tensor:
    mask = src.eq(PAD)
    return model.decode(prev, model.encode(src, mask), mask)


@torch.no_grad()
def test_incremental_logits_equal_full_decoder(model: DeLighTEncoderDecoder) -> None:
    src = _sources()
    mask = src.eq(PAD)
    encoder_out = model.encode(src, mask)
    prev = torch.tensor([[EOS, 4, 5, 3, 7, 6], [EOS, 7, 7, 0, 4, 2]])
    full = model.decode(prev, encoder_out, mask)  # (B, T, V)
    state = None
    for t in range(prev.shape[1]):
        logits, state = model.decode_step(prev[:, t : t + 1], encoder_out, mask, state)
        assert state.length == t + 1
        torch.testing.assert_close(logits[:, 0], full[:, t], atol=1e-10, rtol=0)
    # several new positions at once after a cached prefix
    _, state = model.decode_step(prev[:, :2], encoder_out, mask, None)
    logits, _ = model.decode_step(prev[:, 2:], encoder_out, mask, state)
    torch.testing.assert_close(logits, full[:, 2:], atol=1e-10, rtol=0)


@torch.no_grad()
def test_incremental_decoding_rejects_padding(model: DeLighTEncoderDecoder) -> None:
    src = _sources()
    mask = src.eq(PAD)
    with pytest.raises(ValueError, match="unpadded"):
        model.decode_step(torch.tensor([[EOS], [PAD]]), model.encode(src, mask), mask, None)


@torch.no_grad()
def test_reordered_cache_equals_reordered_prefixes(model: DeLighTEncoderDecoder) -> None:
    src = _sources()[[0, 0, 1, 1]]  # two beams per source
    mask = src.eq(PAD)
    encoder_out = model.encode(src, mask)
    prev = torch.tensor([[EOS, 4, 5], [EOS, 6, 6], [EOS, 7, 3], [EOS, 5, 4]])
    _, state = model.decode_step(prev, encoder_out, mask, None)
    order = torch.tensor([1, 1, 3, 2])  # beams are picked within their own source
    nxt = torch.tensor([[4], [5], [6], [7]])
    logits, _ = model.decode_step(nxt, encoder_out, mask, state.reorder(order))
    reordered = torch.cat((prev[order], nxt), dim=1)
    full = model.decode(reordered, encoder_out, mask)
    torch.testing.assert_close(logits[:, 0], full[:, -1], atol=1e-10, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("order", [[1, 1, 3, 2], [2, 0, 1, 3]], ids=["within", "across"])
def test_encoder_keys_move_only_when_a_row_changes_source(
    model: DeLighTEncoderDecoder, order: list[int]
) -> None:
    """Beams exchanged within their source keep the encoder cache as it is (the same keys and
    values); an order that moves rows across sources reorders it, and both stay exact."""
    src = _sources()[[0, 0, 1, 1]]
    mask = src.eq(PAD)
    encoder_out = model.encode(src, mask)
    prev = torch.tensor([[EOS, 4, 5], [EOS, 6, 6], [EOS, 7, 3], [EOS, 5, 4]])
    _, state = model.decode_step(prev, encoder_out, mask, None)
    assert state.sources.tolist() == [1, 1, 0, 0] or state.sources.tolist() == [0, 0, 1, 1]
    picked = state.reorder(torch.tensor(order))
    kept = picked.blocks[0].encoder_attn is state.blocks[0].encoder_attn
    assert kept == (order == [1, 1, 3, 2])
    index = torch.tensor(order)
    nxt = torch.tensor([[4], [5], [6], [7]])
    # across sources the rows' encoder outputs and masks move with them, as a caller must pass
    logits, _ = model.decode_step(nxt, encoder_out[:, index], mask[index], picked)
    full = model.decode(torch.cat((prev[index], nxt), dim=1), encoder_out[:, index], mask[index])
    torch.testing.assert_close(logits[:, 0], full[:, -1], atol=1e-10, rtol=0)


def _exhaustive_best(
    model: DeLighTEncoderDecoder, src: torch.Tensor, max_len: int, length_penalty: float
) -> tuple[list[int], float]:
    """Score every hypothesis of at most ``max_len`` tokens before eos (pad never generated)."""
    words = [t for t in range(VOCAB) if t not in (PAD, EOS)]
    best: tuple[list[int], float] = ([], float("-inf"))
    for n in range(max_len + 1):
        bodies = list(itertools.product(words, repeat=n))
        bodies = torch.tensor(bodies, dtype=torch.long).view(len(bodies), n)  # (H, n)
        hyps = torch.cat((bodies, torch.full((len(bodies), 1), EOS)), dim=1)  # (H, n + 1)
        prev = torch.cat((torch.full((len(bodies), 1), EOS), bodies), dim=1)
        logits = _full_logits(model, src.expand(len(bodies), -1), prev)
        lprobs = torch.log_softmax(logits, dim=-1).gather(-1, hyps.unsqueeze(-1)).squeeze(-1)
        scores = lprobs.sum(1) / (n + 1) ** length_penalty
        top = int(scores.argmax())
        if scores[top].item() > best[1]:
            best = (hyps[top].tolist(), scores[top].item())
    return best


@torch.no_grad()
@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_wide_beam_finds_exhaustive_optimum(
    model: DeLighTEncoderDecoder, length_penalty: float
) -> None:
    src = _sources()[:1]
    max_len = 3
    # a beam wider than every step's candidates (36 prefixes x 7 tokens) never prunes
    (hyps,) = beam_search(
        model,
        src,
        beam_size=256,
        max_len_a=0,
        max_len_b=max_len,
        length_penalty=length_penalty,
        eos=EOS,
        pad=PAD,
    )
    tokens, score = _exhaustive_best(model, src, max_len, length_penalty)
    assert hyps[0].tokens.tolist() == tokens
    assert hyps[0].score == pytest.approx(score, abs=1e-10)
    assert all(a.score >= b.score for a, b in itertools.pairwise(hyps))


@torch.no_grad()
def test_beam_hypothesis_scores_are_normalised_log_probs(model: DeLighTEncoderDecoder) -> None:
    src = _sources()
    results = beam_search(
        model, src, beam_size=3, max_len_a=1.0, max_len_b=2, length_penalty=0.6, eos=EOS, pad=PAD
    )
    for i, hyps in enumerate(results):
        assert len(hyps) == 3
        for h in hyps:
            prev = torch.cat((torch.tensor([EOS]), h.tokens[:-1])).unsqueeze(0)
            lprobs = torch.log_softmax(_full_logits(model, src[i : i + 1], prev)[0], dim=-1)
            total = lprobs.gather(-1, h.tokens.unsqueeze(-1)).sum().item()
            assert h.score == pytest.approx(total / len(h.tokens) ** 0.6, abs=1e-10)


@torch.no_grad()
def test_greedy_equals_beam_of_one(model: DeLighTEncoderDecoder) -> None:
    src = _sources()
    settings = {"max_len_a": 1.5, "max_len_b": 3, "length_penalty": 0.0, "eos": EOS, "pad": PAD}
    greedy = greedy_search(model, src, **settings)
    beam = beam_search(model, src, beam_size=1, **settings)
    for g, (b,) in zip(greedy, beam, strict=True):
        assert g.tokens.tolist() == b.tokens.tolist()
        assert g.score == pytest.approx(b.score, abs=1e-12)


class _Favouring:
    """The tiny model with ``token``'s logit raised by 100: the likeliest token at every step."""

    def __init__(self, model: DeLighTEncoderDecoder, token: int) -> None:
        self.model = model
        self.token = token

    def encode(
        self, src_tokens: torch.Tensor, src_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.model.encode(src_tokens, src_padding_mask)

    def decode_step(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: torch.Tensor,
        src_padding_mask: torch.Tensor | None,
        state: DecoderState | None,
    ) -> tuple[torch.Tensor, DecoderState]:
        logits, state = self.model.decode_step(
            prev_output_tokens, encoder_out, src_padding_mask, state
        )
        logits = logits.clone()
        logits[..., self.token] += 100.0
        return logits, state


@torch.no_grad()
@pytest.mark.parametrize("a, b", [(0.0, 0), (0.0, 2), (1.0, 1), (1.5, 0)])
def test_max_length_a_src_plus_b(model: DeLighTEncoderDecoder, a: float, b: int) -> None:
    net = _Favouring(model, 5)  # never chooses eos, so hypotheses run to the longest allowed
    src = _sources()
    src_len = src.ne(PAD).sum(1).tolist()  # 5 and 3
    settings = {"max_len_a": a, "max_len_b": b, "length_penalty": 1.0, "eos": EOS, "pad": PAD}
    greedy = greedy_search(net, src, **settings)
    beam = [hyps[0] for hyps in beam_search(net, src, beam_size=2, **settings)]
    for hyps in (greedy, beam):
        for h, n in zip(hyps, src_len, strict=True):
            assert h.tokens.tolist() == [5] * int(a * n + b) + [EOS]


@torch.no_grad()
def test_eos_terminates(model: DeLighTEncoderDecoder) -> None:
    net = _Favouring(model, EOS)
    src = _sources()
    settings = {"max_len_a": 1.0, "max_len_b": 5, "length_penalty": 1.0, "eos": EOS, "pad": PAD}
    for h in greedy_search(net, src, **settings):
        assert h.tokens.tolist() == [EOS]
    for hyps in beam_search(net, src, beam_size=3, **settings):
        assert hyps[0].tokens.tolist() == [EOS]
        assert all(h.tokens[-1].item() == EOS and EOS not in h.tokens[:-1].tolist() for h in hyps)


@torch.no_grad()
def test_source_padding_does_not_change_results(model: DeLighTEncoderDecoder) -> None:
    src = _sources()  # the second source is padded
    settings = {"max_len_a": 1.0, "max_len_b": 2, "length_penalty": 1.0, "eos": EOS, "pad": PAD}
    batch = beam_search(model, src, beam_size=4, **settings)
    alone = beam_search(model, src[1:, :3], beam_size=4, **settings)
    assert _same(batch[1], alone[0])
    greedy_batch = greedy_search(model, src, **settings)
    greedy_alone = greedy_search(model, src[1:, :3], **settings)
    assert _same(greedy_batch[1:], greedy_alone)


def _same(a: list[Hypothesis], b: list[Hypothesis]) -> bool:
    return len(a) == len(b) and all(
        x.tokens.tolist() == y.tokens.tolist() and abs(x.score - y.score) < 1e-10
        for x, y in zip(a, b, strict=True)
    )


@torch.no_grad()
def test_bos_replaces_the_first_decoder_input(model: DeLighTEncoderDecoder) -> None:
    src = _sources()[:1]
    settings = {"max_len_a": 0.0, "max_len_b": 3, "length_penalty": 0.0, "eos": EOS, "pad": PAD}
    (h,) = greedy_search(model, src, bos=BOS, **settings)
    prev = torch.cat((torch.tensor([BOS]), h.tokens[:-1])).unsqueeze(0)
    expected = _full_logits(model, src, prev)[0].argmax(-1)
    # the last step may be the eos forced at max_len
    assert h.tokens[:-1].tolist() == expected[:-1].tolist()
    assert h.tokens[-1].item() == EOS


def test_invalid_arguments(model: DeLighTEncoderDecoder) -> None:
    src = _sources()
    settings = {"max_len_a": 0.0, "length_penalty": 1.0, "eos": EOS, "pad": PAD}
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, beam_size=0, max_len_b=2, **settings)
    with pytest.raises(ValueError, match="max_len"):
        greedy_search(model, src, max_len_b=-1, **settings)
