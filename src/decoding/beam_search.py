"""Beam search and greedy search for an incrementally decoding encoder-decoder.

fairseq's ``SequenceGenerator`` conventions, which the official DeLighT translations use
(``generate.py --beam 5 --lenpen 0.4`` on WMT14 En-De, beam 4 and lenpen 1 on IWSLT'14):

- The decoder's first input is eos: fairseq's translation batches start ``prev_output_tokens``
  with ``</s>``. ``bos`` replaces it, as fairseq's ``bos_token`` does. Hypotheses leave the first
  input out and end with eos.
- pad is never generated; at step ``max_len`` only eos is allowed, so a hypothesis has at most
  ``max_len`` tokens before its eos, with ``max_len = int(a * src_len + b)`` and ``src_len`` the
  source's non-pad tokens. fairseq takes the batch's longest source; here each source uses its
  own length, so padding and batch-mates never change a source's result.
- A hypothesis of n tokens (eos included) scores ``sum(log p) / n ** length_penalty``.
- An eos candidate finishes a hypothesis only when it ranks among the best ``beam_size`` of the
  ``2 * beam_size`` candidates (so beam size 1 is greedy search); the best ``beam_size`` others
  stay live.
- A source is done when ``beam_size`` hypotheses have finished and no live one can still beat
  the worst of them (fairseq stops at ``beam_size`` finished), or at ``max_len``. With
  ``length_penalty > 0`` a live hypothesis can overtake a finished one by growing longer, so a
  beam of one may then search past the hypothesis greedy search returns.

The model maps ``encode(src_tokens, src_padding_mask) -> encoder_out (S, B, d)`` and
``decode_step(prev_output_tokens (B, 1), encoder_out, src_padding_mask, state)`` ->
``(logits (B, 1, V), state)``, the state having ``reorder(order)``
(:class:`src.models.delight_mt.DeLighTEncoderDecoder`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class DecoderState(Protocol):
    """An incremental decoder's cache; ``reorder`` keeps the sequences ``order`` (B',) picks."""

    def reorder(self, order: Tensor) -> DecoderState: ...


class IncrementalEncoderDecoder(Protocol):
    """What the searches need of a model (see the module docstring for the shapes)."""

    def encode(self, src_tokens: Tensor, src_padding_mask: Tensor | None = None) -> Tensor: ...

    def decode_step(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Tensor,
        src_padding_mask: Tensor | None,
        state: DecoderState | None,
    ) -> tuple[Tensor, DecoderState]: ...


@dataclass(frozen=True)
class Hypothesis:
    """One finished translation.

    Shape:
        tokens (n,) int64, ending with eos, without the decoder's first input; score, the
        length-normalised ``sum(log p) / n ** length_penalty``
    """

    tokens: Tensor
    score: float


def _max_lengths(src_tokens: Tensor, pad: int, max_len_a: float, max_len_b: int) -> list[int]:
    """``int(a * src_len + b)`` per source, src_len its non-pad tokens. (B, S) -> B ints."""
    lengths = [int(max_len_a * n + max_len_b) for n in src_tokens.ne(pad).sum(1).tolist()]
    if min(lengths) < 0:
        raise ValueError(
            f"max_len_a * src_len + max_len_b must be >= 0, got {lengths} for "
            f"max_len_a={max_len_a}, max_len_b={max_len_b}"
        )
    return lengths


def _log_probs(logits: Tensor, step: int, max_lengths: Tensor, eos: int, pad: int) -> Tensor:
    """Next-token log-probabilities without pad, and only eos where ``step`` reached max_len.

    The softmax runs in at least float32, as fairseq's does.

    Shape:
        logits (N, V); max_lengths (N,) -> (N, V)
    """
    lprobs = F.log_softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    lprobs[:, pad] = float("-inf")
    at_end = max_lengths.le(step)  # (N,)
    eos_lprobs = lprobs[:, eos].clone()
    lprobs[at_end] = float("-inf")
    lprobs[:, eos] = eos_lprobs
    return lprobs


def _check(src_tokens: Tensor) -> None:
    if src_tokens.ndim != 2 or src_tokens.shape[0] < 1:
        raise ValueError(f"src_tokens must be (B, S) with B >= 1, got {tuple(src_tokens.shape)}")


@torch.no_grad()
def beam_search(
    model: IncrementalEncoderDecoder,
    src_tokens: Tensor,
    *,
    beam_size: int,
    max_len_a: float,
    max_len_b: int,
    length_penalty: float,
    eos: int,
    pad: int,
    bos: int | None = None,
) -> list[list[Hypothesis]]:
    """The ``beam_size`` best translations of each source, best first.

    Args:
        model: the encoder-decoder, in eval mode for deterministic results.
        src_tokens: the sources, padded with ``pad``.
        beam_size: K, the live hypotheses kept per source.
        max_len_a: a in the largest target length ``a * src_len + b``.
        max_len_b: b in it.
        length_penalty: the exponent of the length that divides a hypothesis' log-probability.
        eos: end of sentence, also the decoder's first input unless ``bos`` is given.
        pad: the padding token, never generated.
        bos: the decoder's first input when not eos.

    Shape:
        src_tokens (B, S) int64 -> B lists of at most K hypotheses
    """
    _check(src_tokens)
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    k = beam_size
    n_src = src_tokens.shape[0]
    device = src_tokens.device
    max_lengths = _max_lengths(src_tokens, pad, max_len_a, max_len_b)
    src_padding_mask = src_tokens.eq(pad)
    encoder_out = model.encode(src_tokens, src_padding_mask)  # (S, B, d)
    # beam j of source i is row i * K + j
    rows = torch.arange(n_src, device=device).repeat_interleave(k)  # (B K,)
    encoder_out = encoder_out.index_select(1, rows)  # (S, B K, d)
    src_padding_mask = src_padding_mask.index_select(0, rows)  # (B K, S)
    row_max_lengths = torch.tensor(max_lengths, device=device).repeat_interleave(k)  # (B K,)
    first = eos if bos is None else bos
    tokens = torch.full((n_src * k, 1), first, dtype=torch.long, device=device)  # (B K, t)
    dtype = torch.promote_types(encoder_out.dtype, torch.float32)
    # only the first beam is live at the start: the K copies would propose the same candidates
    scores = torch.full((n_src, k), float("-inf"), dtype=dtype, device=device)
    scores[:, 0] = 0.0
    finished: list[list[Hypothesis]] = [[] for _ in range(n_src)]
    done = [False] * n_src
    state: DecoderState | None = None
    for step in range(max(max_lengths) + 1):
        logits, state = model.decode_step(tokens[:, -1:], encoder_out, src_padding_mask, state)
        lprobs = _log_probs(logits[:, -1], step, row_max_lengths, eos, pad)  # (B K, V)
        vocab = lprobs.shape[-1]
        candidates = (scores.unsqueeze(-1) + lprobs.view(n_src, k, vocab)).view(n_src, k * vocab)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=1)  # (B, 2K)
        order = torch.arange(n_src * k, device=device)  # (B K,), rows kept
        next_tokens = torch.full((n_src * k,), first, dtype=torch.long, device=device)
        next_scores = torch.full((n_src, k), float("-inf"), dtype=dtype, device=device)
        for i, (row_scores, row_index) in enumerate(
            zip(top_scores.tolist(), top_index.tolist(), strict=True)
        ):
            if done[i]:
                continue
            live = 0
            for rank, (score, index) in enumerate(zip(row_scores, row_index, strict=True)):
                if score == float("-inf") or live == k:
                    break
                beam, token = divmod(index, vocab)
                if token == eos:
                    if rank < k:
                        hypothesis = torch.cat((tokens[i * k + beam, 1:], tokens.new_tensor([eos])))
                        normalised = score / (step + 1) ** length_penalty
                        finished[i].append(Hypothesis(hypothesis, normalised))
                    continue
                order[i * k + live] = i * k + beam
                next_tokens[i * k + live] = token
                next_scores[i, live] = score
                live += 1
            done[i] = _is_done(
                finished[i], next_scores[i, 0].item(), step, max_lengths[i], k, length_penalty
            )
        if all(done):
            break
        state = state.reorder(order)
        tokens = torch.cat((tokens.index_select(0, order), next_tokens.unsqueeze(1)), dim=1)
        scores = next_scores
    return [sorted(hyps, key=lambda h: -h.score)[:k] for hyps in finished]


def _is_done(
    finished: list[Hypothesis],
    best_live: float,
    step: int,
    max_length: int,
    beam_size: int,
    length_penalty: float,
) -> bool:
    """Whether no live hypothesis (the best summing ``best_live``) can beat the K-th finished.

    A live hypothesis has ``step + 1`` tokens and will end with between ``step + 2`` and
    ``max_length + 1``; its log-probability only falls, so its best normalised score divides
    ``best_live`` (<= 0) by the largest length power in that range.
    """
    if best_live == float("-inf") or step >= max_length:
        return True
    if len(finished) < beam_size:
        return False
    worst_kept = sorted(h.score for h in finished)[-beam_size]
    longest = max_length + 1 if length_penalty >= 0 else step + 2
    return best_live / longest**length_penalty <= worst_kept


@torch.no_grad()
def greedy_search(
    model: IncrementalEncoderDecoder,
    src_tokens: Tensor,
    *,
    max_len_a: float,
    max_len_b: int,
    length_penalty: float,
    eos: int,
    pad: int,
    bos: int | None = None,
) -> list[Hypothesis]:
    """The translation that takes the most likely token at every step, for each source.

    Conventions and arguments as :func:`beam_search`; the score is length-normalised the same
    way, so with ``length_penalty=0`` it equals a beam of one.

    Shape:
        src_tokens (B, S) int64 -> B hypotheses
    """
    _check(src_tokens)
    n_src = src_tokens.shape[0]
    device = src_tokens.device
    max_lengths = _max_lengths(src_tokens, pad, max_len_a, max_len_b)
    src_padding_mask = src_tokens.eq(pad)
    encoder_out = model.encode(src_tokens, src_padding_mask)  # (S, B, d)
    first = eos if bos is None else bos
    tokens = torch.full((n_src, 1), first, dtype=torch.long, device=device)  # (B, t)
    dtype = torch.promote_types(encoder_out.dtype, torch.float32)
    scores = torch.zeros(n_src, dtype=dtype, device=device)
    finished: list[Hypothesis | None] = [None] * n_src
    state: DecoderState | None = None
    for step in range(max(max_lengths) + 1):
        logits, state = model.decode_step(tokens[:, -1:], encoder_out, src_padding_mask, state)
        lprobs = _log_probs(logits[:, -1], step, torch.tensor(max_lengths, device=device), eos, pad)
        best, token = lprobs.max(dim=-1)  # (B,)
        scores = scores + best
        for i in token.eq(eos).nonzero().flatten().tolist():
            if finished[i] is None:
                normalised = scores[i].item() / (step + 1) ** length_penalty
                finished[i] = Hypothesis(torch.cat((tokens[i, 1:], token[i : i + 1])), normalised)
        if all(h is not None for h in finished):
            break
        tokens = torch.cat((tokens, token.unsqueeze(1)), dim=1)
    # the step at each source's max_len allows only eos, so every source has finished
    return [h for h in finished if h is not None]
