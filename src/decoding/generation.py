"""Text generation with the language models: for a segment-level-recurrent character model
(Transformer-XL, Group-Transformer), sampling for sentence completion and beam search for word
completion (Group-Transformer, Park et al., COLING 2020, Table 4); for the word models,
:func:`sample_recurrent` (AWD-LSTM / AWD-PRU, the recurrent state carried) and
:func:`sample_windowed` (DeLighT / Transformer LM, the last window rerun). :func:`draw`, the choice
of one token from next-token logits, serves them all.

The network maps ``(tokens (B, T), memories | None) -> (logits (B, T, V), new_memories)``. The
context is read segment by segment (at most ``segment_len`` symbols a call, the memories carried),
and every new symbol is fed alone with the memories of everything before it, so producing ``N``
symbols costs ``N`` single-position calls: linear in ``N``, the context bounded by ``mem_len``.
"""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

Memories = list[Tensor] | None
State = TypeVar("State")  # what a sampler carries between network calls


def _check_recurrent(net: nn.Module) -> None:
    mem_len = getattr(net, "mem_len", None)
    if not isinstance(mem_len, int) or mem_len < 1:
        # without memories a symbol fed alone would see no context at all
        raise ValueError(f"generation needs a network with mem_len >= 1, got mem_len={mem_len!r}")


def read_context(
    net: nn.Module, tokens: Tensor, segment_len: int, memories: Memories = None
) -> tuple[Tensor, Memories]:
    """Run ``net`` over ``tokens`` in segments of at most ``segment_len``, carrying the memories.

    Args:
        net: the recurrent language model (``mem_len >= 1``).
        tokens: the context, at least one symbol.
        segment_len: longest segment one call may take (the training ``tgt_len``: the
            Group-Transformer's position table covers ``tgt_len + mem_len`` positions).
        memories: memories of text before ``tokens``, or None.

    Shape:
        tokens: (B, T) int64, T >= 1 -> logits of the last position (B, V), the memories after it.
    """
    _check_recurrent(net)
    if tokens.ndim != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be (B, T) with T >= 1, got shape {tuple(tokens.shape)}")
    if segment_len < 1:
        raise ValueError(f"segment_len must be >= 1, got {segment_len}")
    logits = tokens.new_empty(0)
    for begin in range(0, tokens.shape[1], segment_len):
        logits, memories = net(tokens[:, begin : begin + segment_len], memories)  # (B, t, V)
    return logits[:, -1], memories


def _masked(logits: Tensor, allowed: Tensor | None) -> Tensor:
    """``logits`` with the ids outside ``allowed`` at -inf. (..., V) -> (..., V)."""
    if allowed is None:
        return logits
    if allowed.shape != logits.shape[-1:] or not bool(allowed.any()):
        raise ValueError(
            f"allowed must be a (V,) = ({logits.shape[-1]},) mask with some True, "
            f"got {tuple(allowed.shape)}"
        )
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


def draw(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    allowed: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One id per row drawn from ``softmax(logits / temperature)`` over the ``allowed`` ids,
    restricted to the ``top_k`` most probable when ``top_k > 0`` (``top_k=1``: the argmax) and to
    the smallest set of most probable ids whose probability reaches ``top_p`` when ``top_p < 1``
    (nucleus sampling, Holtzman et al. 2020; the most probable id is always kept).

    Shape:
        logits (B, V) -> (B,) int64
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    scores = _masked(logits.float(), allowed) / temperature  # (B, V)
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)  # (B, V)
        mass_before = sorted_scores.softmax(-1).cumsum(-1) - sorted_scores.softmax(-1)  # (B, V)
        # drop an id once the more probable ones already reach top_p
        dropped = torch.zeros_like(scores, dtype=torch.bool).scatter(
            -1, order, mass_before >= top_p
        )
        scores = scores.masked_fill(dropped, float("-inf"))
    return torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(1)


def _draw_continuation(
    logits: Tensor,
    state: State,
    step: Callable[[Tensor, State], tuple[Tensor, State]],
    num_tokens: int,
    *,
    stop: Tensor | int | None,
    temperature: float,
    top_k: int,
    top_p: float,
    allowed: Tensor | None,
    generator: torch.Generator | None,
) -> Tensor:
    """The loop of :func:`sample`, :func:`sample_recurrent` and :func:`sample_windowed`, which
    differ only in how the network reads each new id: draw one id per row (:func:`draw`), feed it
    back through ``step``, and repeat until ``num_tokens`` ids or every row has stopped.

    Args:
        logits: the next-token logits after the prompt.
        state: what ``step`` carries from call to call (memories, recurrent state, the text).
        step: (the ids just drawn (B,), state) -> (the next logits (B, V), the new state); not
            called after the last id.
        num_tokens: >= 1.
        stop: the ids after which a row adds nothing, as a (V,) bool mask or one id; a stopped
            row repeats the id it stopped on. None: never stop.

    Shape:
        logits (B, V) -> (B, n) int64, n = num_tokens unless every row stopped earlier
    """
    if isinstance(stop, Tensor):
        stop = stop.to(logits.device)
    chosen: list[Tensor] = []
    stopped = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)  # (B,)
    while True:
        choice = draw(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, allowed=allowed,
            generator=generator,
        )  # fmt: skip
        if stop is not None:
            if chosen:
                choice = torch.where(stopped, chosen[-1], choice)  # a stopped row repeats its end
            stopped |= stop[choice] if isinstance(stop, Tensor) else choice == stop
        chosen.append(choice)
        if len(chosen) == num_tokens or (stop is not None and bool(stopped.all())):
            return torch.stack(chosen, dim=1)
        logits, state = step(choice, state)


def sample(
    net: nn.Module,
    prompt: Tensor,
    num_symbols: int,
    *,
    segment_len: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    allowed: Tensor | None = None,
    stop: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue ``prompt`` by up to ``num_symbols`` symbols drawn one at a time from
    ``softmax(logits / temperature)``, restricted to the ``top_k`` most probable ids when
    ``top_k > 0`` (``top_k=1`` is greedy decoding) and to the ``top_p`` nucleus when ``top_p < 1``.

    Args:
        net: the recurrent language model (``mem_len >= 1``), in eval mode.
        prompt: the context (see :func:`read_context`); each row is sampled independently (the
            rows of one prompt repeated give several samples).
        num_symbols: how many symbols to produce at most (0 returns an empty continuation).
        segment_len: longest segment one call may take while reading the prompt.
        temperature: > 0; below 1 sharpens the distribution, above 1 flattens it.
        top_k: keep only the k most probable ids (0: all).
        top_p: keep the most probable ids up to this probability mass (1: all).
        allowed: ids that may be produced (e.g. the symbols of the vocabulary), or None for all.
        stop: ids after which a row adds nothing (sentence completion: the sentence ends), as a
            (V,) bool mask; the row's later positions repeat the stop symbol it drew, and sampling
            ends once every row has stopped. None: always ``num_symbols`` symbols.
        generator: random source, for reproducible samples.

    Shape:
        prompt: (B, T) int64 -> (B, n) int64, n = num_symbols unless every row stopped earlier
    """
    if num_symbols < 0:
        raise ValueError(f"num_symbols must be >= 0, got {num_symbols}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: no top-k), got {top_k}")
    if num_symbols == 0:
        return prompt.new_empty(prompt.shape[0], 0)

    def step(choice: Tensor, memories: Memories) -> tuple[Tensor, Memories]:
        logits, memories = net(choice[:, None], memories)  # (B, 1, V): one new position
        return logits[:, -1], memories

    logits, memories = read_context(net, prompt, segment_len)
    return _draw_continuation(
        logits, memories, step, num_symbols, stop=stop, temperature=temperature, top_k=top_k,
        top_p=top_p, allowed=allowed, generator=generator,
    )  # fmt: skip


def complete_words(
    net: nn.Module,
    prefix: Tensor,
    boundary: Tensor,
    *,
    segment_len: int,
    num_words: int = 5,
    max_word_len: int = 20,
    beam_size: int = 16,
    allowed: Tensor | None = None,
    allow_empty: bool = False,
) -> list[tuple[list[int], float]]:
    """The most probable whole-word continuations of ``prefix``, ranked (Table 4's word completion).

    A continuation is a string ``w`` of non-boundary symbols followed by any boundary symbol (space,
    punctuation); its score is ``log P(w, then a boundary | prefix)`` = the sum of the symbols'
    log-probabilities plus the log of the total probability of the boundary symbols after ``w``.
    Beam search over symbols keeps the ``beam_size`` best unfinished continuations per step; it
    stops after ``max_word_len`` symbols, or earlier once no unfinished one can still beat the
    ``num_words``-th best word (scores only decrease as a word grows).

    Args:
        net: the recurrent language model (``mem_len >= 1``), in eval mode.
        prefix: the context, one sequence.
        boundary: ids that end a word.
        segment_len: longest segment one call may take while reading the prefix.
        num_words: how many words to return (fewer if fewer are found).
        max_word_len: longest continuation, in symbols.
        beam_size: unfinished continuations kept per step.
        allowed: ids that may be produced, or None for all.
        allow_empty: whether the empty continuation counts (the prefix already ends a word).

    Shape:
        prefix: (1, T) int64, boundary: (V,) bool -> up to ``num_words`` (symbol ids,
        log-probability) pairs, best first.
    """
    if prefix.ndim != 2 or prefix.shape[0] != 1:
        raise ValueError(f"prefix must be one sequence (1, T), got shape {tuple(prefix.shape)}")
    return complete_words_batch(
        net, prefix, boundary, segment_len=segment_len, num_words=num_words,
        max_word_len=max_word_len, beam_size=beam_size, allowed=allowed, allow_empty=allow_empty,
    )[0]  # fmt: skip


@torch.no_grad()
def complete_words_batch(
    net: nn.Module,
    prefixes: Tensor,
    boundary: Tensor,
    *,
    segment_len: int,
    num_words: int = 5,
    max_word_len: int = 20,
    beam_size: int = 16,
    allowed: Tensor | None = None,
    allow_empty: bool = False,
) -> list[list[tuple[list[int], float]]]:
    """:func:`complete_words` for ``W`` prefixes of one length at once: each keeps its own beam of
    ``beam_size`` rows (a dead row scores -inf), all ``W * beam_size`` rows run in one call per
    step, and the search ends when every prefix's has.

    Shape:
        prefixes: (W, T) int64, boundary: (V,) bool -> W lists of up to ``num_words`` (symbol ids,
        log-probability) pairs, best first.
    """
    if prefixes.ndim != 2 or prefixes.shape[0] < 1:
        raise ValueError(f"prefixes must be (W, T) with W >= 1, got shape {tuple(prefixes.shape)}")
    if num_words < 1 or max_word_len < 1 or beam_size < 1:
        raise ValueError(
            "need num_words, max_word_len, beam_size >= 1, "
            f"got {num_words}, {max_word_len}, {beam_size}"
        )
    logits, memories = read_context(net, prefixes, segment_len)  # (W, V)
    n_prefix, vocab = logits.shape
    if boundary.dtype != torch.bool or boundary.shape != (vocab,):
        raise ValueError(
            f"boundary must be a ({vocab},) bool mask, got {boundary.dtype} {tuple(boundary.shape)}"
        )
    boundary = boundary.to(logits.device)
    if allowed is not None:
        boundary = boundary & allowed.to(logits.device)
    if not bool(boundary.any()):
        raise ValueError("no allowed symbol ends a word (boundary is empty)")

    k = beam_size
    rows = (
        torch.arange(n_prefix, device=logits.device)[:, None] * k
    )  # (W, 1) first row of each beam
    # every beam starts as one live row (the prefix) and k - 1 dead ones
    logits = logits.repeat_interleave(k, dim=0)  # (W*k, V)
    if memories is not None:
        memories = [m.repeat_interleave(k, dim=0) for m in memories]  # (W*k, M, D)
    scores = torch.full((n_prefix, k), float("-inf"), device=logits.device)  # (W, k)
    scores[:, 0] = 0.0
    paths: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(n_prefix)]
    words: list[list[tuple[list[int], float]]] = [[] for _ in range(n_prefix)]
    searching = [True] * n_prefix
    for length in range(max_word_len + 1):
        log_probs = scores[..., None] + _masked(logits.float(), allowed).log_softmax(-1).view(
            n_prefix, k, vocab
        )
        if length > 0 or allow_empty:
            ended = log_probs[..., boundary].logsumexp(-1).tolist()  # (W, k)
            for w in range(n_prefix):
                if searching[w]:
                    found = [
                        (path, score)
                        for path, score in zip(paths[w], ended[w])
                        if score > float("-inf")
                    ]
                    words[w] = sorted(words[w] + found, key=lambda word: -word[1])[:num_words]
        if length == max_word_len:
            break
        grown = log_probs.masked_fill(boundary, float("-inf")).view(n_prefix, k * vocab)  # (W, k*V)
        scores, index = grown.topk(min(k, k * vocab), dim=-1)  # (W, k)
        best = scores[:, 0].tolist()
        for w in range(n_prefix):
            full = len(words[w]) == num_words
            if searching[w] and (best[w] == float("-inf") or (full and best[w] <= words[w][-1][1])):
                searching[w] = False  # every longer word scores below the ones kept
        if not any(searching):
            break
        done = torch.tensor([not s for s in searching], device=scores.device)
        scores = scores.masked_fill(done[:, None], float("-inf"))
        origin, symbol = index // vocab, index % vocab  # (W, k), (W, k)
        origins, symbols = origin.tolist(), symbol.tolist()
        paths = [
            [paths[w][o] + [sym] for o, sym in zip(origins[w], symbols[w])]
            if searching[w]
            else paths[w]
            for w in range(n_prefix)
        ]
        if memories is not None:
            take = (rows + origin).flatten()  # (W*k,) rows of the previous step
            memories = [m.index_select(0, take) for m in memories]
        out, memories = net(symbol.reshape(-1, 1), memories)  # (W*k, 1, V)
        logits = out[:, -1]
    return words


def encode(text: str, symbols: Sequence[int]) -> list[int]:
    """The symbol ids of ``text``: id i is the character with code point ``symbols[i]`` (the
    vocabulary of ``src.datamodules.char_lm``). Raises ``ValueError`` naming every character the
    vocabulary lacks."""
    missing = missing_symbols(text, symbols)
    if missing:
        raise ValueError(
            f"characters not in the vocabulary ({len(symbols)} symbols): {', '.join(missing)}"
        )
    index = {code: i for i, code in enumerate(symbols)}
    return [index[ord(ch)] for ch in text]


def missing_symbols(text: str, symbols: Sequence[int]) -> list[str]:
    """The distinct characters of ``text`` that ``symbols`` (code points) lacks, in code-point
    order, each shown as ``'日' (U+65E5)``."""
    known = set(symbols)
    return [
        f"{ch!r} (U+{ord(ch):04X})" for ch in sorted({ch for ch in text if ord(ch) not in known})
    ]


def decode(ids: Sequence[int], symbols: Sequence[int]) -> str:
    """The text of symbol ids: id i is the character with code point ``symbols[i]``."""
    return "".join(chr(symbols[i]) for i in ids)


def is_boundary(ch: str) -> bool:
    """Whether ``ch`` ends a word: white space, ASCII punctuation or a Unicode punctuation mark."""
    return ch.isspace() or ch in string.punctuation or unicodedata.category(ch).startswith("P")


SENTENCE_ENDS = ".!?"  # what ends a sampled sentence (line breaks wrap sentences in the corpora)


def is_sentence_end(ch: str) -> bool:
    """Whether ``ch`` ends a sentence: a full stop, question or exclamation mark."""
    return ch in SENTENCE_ENDS


def vocabulary_masks(symbols: Sequence[int], vocab_size: int) -> tuple[Tensor, Tensor]:
    """Masks over the model's ids: those that are symbols of the corpus (the model may have more
    ids than the corpus has symbols; they are never trained) and those that end a word.

    Shape:
        -> allowed (vocab_size,) bool, boundary (vocab_size,) bool
    """
    if len(symbols) > vocab_size:
        raise ValueError(f"{len(symbols)} symbols do not fit a vocabulary of {vocab_size} ids")
    allowed = torch.zeros(vocab_size, dtype=torch.bool)
    allowed[: len(symbols)] = True
    return allowed, symbol_mask(symbols, vocab_size, is_boundary)


def symbol_mask(symbols: Sequence[int], vocab_size: int, predicate) -> Tensor:
    """(vocab_size,) bool: the ids whose character (code point ``symbols[i]``) satisfies
    ``predicate``; ids past the corpus's symbols are False."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[: len(symbols)] = torch.tensor(
        [bool(predicate(chr(code))) for code in symbols], dtype=torch.bool
    )
    return mask


@torch.no_grad()
def sample_recurrent(
    net: nn.Module,
    prompt: Tensor,
    num_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    allowed: Tensor | None = None,
    stop: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue ``prompt`` by ``num_tokens`` words drawn one at a time from
    ``softmax(logits / temperature)`` (the ``top_k`` most probable when ``top_k > 0``).

    The recurrent state is carried: the prompt is read in one call from zero state, then each new
    word is fed alone with the state after everything before it (linear in ``num_tokens``).

    Args:
        net: the recurrent language model (``net(tokens, hidden)`` -> ``.logits``, ``.hidden``),
            in eval mode.
        prompt: the context, at least one token (start it with ``<eos>``, as every corpus line
            follows one).
        num_tokens: how many words to add.
        temperature: > 0.
        top_k: keep only the k most probable words (0: all; 1: greedy).
        top_p: keep the most probable words up to this probability mass (1: all).
        allowed: ids that may be produced (e.g. all but ``<unk>``), or None for all.
        stop: an id (the end of sentence) after which a row adds nothing: its later positions
            repeat ``stop``, and sampling ends once every row has produced it. None: never stop.
        generator: random source, for reproducible samples.

    Shape:
        prompt (B, T) int64 -> (B, n) int64, n = num_tokens unless every row stopped earlier
    """
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be (B, T) with T >= 1, got {tuple(prompt.shape)}")
    if num_tokens < 0 or not temperature > 0 or top_k < 0:
        raise ValueError(
            "need num_tokens >= 0, temperature > 0, top_k >= 0; "
            f"got {num_tokens}, {temperature}, {top_k}"
        )
    if num_tokens == 0:
        return prompt.new_empty(prompt.shape[0], 0)

    def step(choice: Tensor, hidden: Any) -> tuple[Tensor, Any]:
        out = net(choice[:, None], hidden)  # (B, 1) -> logits (B, 1, V): one new position
        return out.logits[:, -1], out.hidden

    out = net(prompt, None)
    return _draw_continuation(
        out.logits[:, -1], out.hidden, step, num_tokens, stop=stop, temperature=temperature,
        top_k=top_k, top_p=top_p, allowed=allowed, generator=generator,
    )  # fmt: skip


@torch.no_grad()
def sample_windowed(
    net: nn.Module,
    prompt: Tensor,
    num_tokens: int,
    *,
    context: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    banned: Tensor | None = None,
    stop: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue ``prompt`` by ``num_tokens`` words drawn one at a time from
    ``softmax(log_prob / temperature)`` (the ``top_k`` most probable when ``top_k > 0``).

    The network keeps no state between calls, so each step reruns the last ``context`` tokens
    (the training ``tokens_per_sample``: the model has seen no longer history).

    Args:
        net: the language model (``log_prob(tokens)``), in eval mode.
        prompt: the context, at least one token (start it with ``</s>`` as the corpus does).
        num_tokens: how many words to add.
        context: longest history a step reads.
        temperature: > 0.
        top_k: keep only the k most probable words (0: all; 1: greedy).
        top_p: keep the most probable words up to this probability mass (1: all).
        banned: ids never produced (the specials, the padding entries), or None.
        stop: an id (the end of sentence) after which a row adds nothing: its later positions
            repeat ``stop``, and sampling ends once every row has produced it. None: never stop.
        generator: random source, for reproducible samples.

    Shape:
        prompt (B, T) int64 -> (B, n) int64, n = num_tokens unless every row stopped earlier
    """
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be (B, T) with T >= 1, got {tuple(prompt.shape)}")
    if num_tokens < 0 or context < 1 or not temperature > 0 or top_k < 0:
        raise ValueError(
            f"need num_tokens >= 0, context >= 1, temperature > 0, top_k >= 0; got {num_tokens}, "
            f"{context}, {temperature}, {top_k}"
        )
    if num_tokens == 0:
        return prompt.new_empty(prompt.shape[0], 0)

    def step(choice: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        tokens = torch.cat([tokens, choice[:, None]], dim=1)  # (B, T + 1)
        return net.log_prob(tokens[:, -context:])[:, -1], tokens  # (B, V)

    return _draw_continuation(
        net.log_prob(prompt[:, -context:])[:, -1], prompt, step, num_tokens, stop=stop,
        temperature=temperature, top_k=top_k, top_p=top_p,
        allowed=None if banned is None else ~banned, generator=generator,
    )  # fmt: skip
