"""Word completion accuracy of a character language model (Group-Transformer, Park et al., COLING
2020, Table 4, turned into a metric).

Table 4 shows the 20 words a trained model ranks highest to complete the prefix "pr" after a text8
test context. As a metric: at every word of held-out text whose first ``prefix_len`` characters are
given (with all text before them as context), rank whole-word completions by probability
(:func:`~src.decoding.generation.complete_words`: beam search over characters up to the next word
boundary) and count whether the true word is among the top 1, 5 and 20. A word is a maximal run of
non-boundary characters (:func:`~src.decoding.generation.is_boundary`: white space and
punctuation) of at least ``prefix_len`` characters; a word that is exactly the prefix is completed
by the empty continuation (the next symbol a boundary). Words longer than ``prefix_len +
max_word_len`` characters cannot be found and count as misses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from src.decoding.generation import complete_words_batch


@dataclass(frozen=True)
class WordCompletionResult:
    """How often the true word ranked within each cut-off: ``hits[k]`` of ``count`` words."""

    count: int
    hits: dict[int, int]

    def accuracy(self, k: int) -> float:
        """Fraction of the words whose true completion ranked within the top ``k``."""
        return self.hits[k] / self.count if self.count else float("nan")

    def as_metrics(self, prefix: str) -> dict[str, float]:
        """``{prefix}/word_top{k}`` accuracies (in [0, 1]) and ``{prefix}/word_count``."""
        metrics = {f"{prefix}/word_top{k}": self.accuracy(k) for k in sorted(self.hits)}
        metrics[f"{prefix}/word_count"] = float(self.count)
        return metrics


def word_spans(boundary: Sequence[bool], prefix_len: int) -> list[tuple[int, int]]:
    """``(start, end)`` of every word of at least ``prefix_len`` symbols in a text whose symbols'
    word-boundary flags are ``boundary``: maximal runs of non-boundary symbols. A run touching the
    end of the text is left out (its end is unknown)."""
    if prefix_len < 1:
        raise ValueError(f"prefix_len must be >= 1, got {prefix_len}")
    spans, start = [], None
    for i, ends in enumerate(boundary):
        if not ends and start is None:
            start = i
        elif ends and start is not None:
            if i - start >= prefix_len:
                spans.append((start, i))
            start = None
    return spans


def spread(items: Sequence, limit: int | None) -> list:
    """At most ``limit`` of ``items``, evenly spaced over the whole sequence (all of them for
    ``None``), so a capped evaluation still samples the whole text."""
    if limit is None or len(items) <= limit:
        return list(items)
    if limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


@torch.no_grad()
def word_completion(
    net: nn.Module,
    tokens: Tensor,
    boundary: Tensor,
    *,
    segment_len: int,
    context_len: int,
    prefix_len: int = 2,
    top: Sequence[int] = (1, 5, 20),
    max_words: int | None = 1000,
    max_word_len: int = 20,
    beam_size: int = 32,
    allowed: Tensor | None = None,
    words_per_batch: int = 16,
) -> WordCompletionResult:
    """Score word completion on ``tokens`` (see the module docstring).

    Args:
        net: the recurrent character model (``mem_len >= 1``), in eval mode, on its device.
        tokens: the held-out text as symbol ids.
        boundary: which ids end a word (:func:`~src.decoding.generation.vocabulary_masks`).
        segment_len: longest segment one call may take while reading a context.
        context_len: symbols of context read before each word's prefix (the model sees at most
            ``mem_len`` of them plus the current segment, so ``mem_len + segment_len`` suffices).
        prefix_len: symbols of each word that are given (Table 4: 2).
        top: the cut-offs counted; the search returns ``max(top)`` words.
        max_words: words scored at most, spread evenly over the text (None: all).
        max_word_len: longest continuation searched, in symbols.
        beam_size: unfinished continuations kept per search step (>= ``max(top)``).
        allowed: ids that may be produced, or None for all.
        words_per_batch: words searched at once (``words_per_batch * beam_size`` rows a call).

    Shape:
        tokens: (N,) int64, boundary: (V,) bool
    """
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be one text (N,), got shape {tuple(tokens.shape)}")
    if not top or min(top) < 1:
        raise ValueError(f"top must list cut-offs >= 1, got {list(top)}")
    if beam_size < max(top):
        raise ValueError(f"beam_size ({beam_size}) must be >= the largest cut-off ({max(top)})")
    if context_len < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}")
    ends = boundary.cpu()[tokens.cpu()].tolist()
    spans = spread(word_spans(ends, prefix_len), max_words)
    weight = next(net.parameters(), None)  # an exported graph's runtime has none: the CPU
    device = weight.device if weight is not None else torch.device("cpu")
    hits = dict.fromkeys(top, 0)
    # words whose contexts have one length are searched together (all but the first few words)
    by_length: dict[int, list[tuple[int, int]]] = {}
    for start, end in spans:
        by_length.setdefault(min(start, context_len), []).append((start, end))
    for length, group in by_length.items():
        for first in range(0, len(group), words_per_batch):
            batch = group[first : first + words_per_batch]
            contexts = torch.stack(
                [tokens[start - length : start + prefix_len] for start, _ in batch]
            ).to(device)  # (W, length + prefix_len)
            found = complete_words_batch(
                net,
                contexts,
                boundary,
                segment_len=segment_len,
                num_words=max(top),
                max_word_len=max_word_len,
                beam_size=beam_size,
                allowed=allowed,
                allow_empty=True,
            )
            for (start, end), ranked in zip(batch, found):
                truth = tokens[start + prefix_len : end].tolist()
                rank = next((r for r, (path, _) in enumerate(ranked) if path == truth), None)
                for k in top:
                    hits[k] += rank is not None and rank < k
    return WordCompletionResult(count=len(spans), hits=hits)
