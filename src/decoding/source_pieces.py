"""A source line longer than the model's maximum source length, cut into pieces it can translate.

The encoder's position table holds ``max_source_positions`` tokens, so a longer line cannot be
read whole. :func:`fit_source` splits it after sentence ends (``. ! ? …`` before white space, or
``。！？``) and packs consecutive sentences into pieces as long as fit; a single sentence that is
still too long is truncated to the maximum (its end is not translated). Each piece is a contiguous
part of the line, so the pieces' translations, joined, follow the line's order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# after these a sentence ends: Latin-script ends need white space after them (3.5 and www.x.org
# stay whole; an abbreviation such as "z.B. " counts as an end, harmless once pieces are packed),
# the CJK full stops and marks need none
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？])")


@dataclass(frozen=True)
class FittedSource:
    """A source line as the model reads it.

    Attributes:
        pieces: the token ids of each piece, eos last, each at most the maximum long.
        num_tokens: the tokens of the whole line (eos included).
        truncated: how many tokens the truncation of over-long sentences left out (0: none).
    """

    pieces: list[Tensor]
    num_tokens: int
    truncated: int

    @property
    def split(self) -> bool:
        """Whether the line is read in more than one piece."""
        return len(self.pieces) > 1


def sentence_ends(text: str) -> list[int]:
    """The offsets where the sentences of ``text`` end (the white space after an end included in
    the sentence before it), the end of ``text`` last."""
    ends = [m.end() for m in SENTENCE_END.finditer(text) if 0 < m.end() < len(text)]
    return [*ends, len(text)]


def fit_source(text: str, encode: Callable[[str], Tensor], limit: int) -> FittedSource:
    """``text`` encoded in pieces of at most ``limit`` tokens (module docstring).

    Args:
        text: one source line.
        encode: text -> its ids with eos last (``TranslationDataModule.encode_source``).
        limit: the most tokens (eos included) one piece may have, at least 2.

    Shape:
        each of ``pieces``: (S,) int64, S <= limit
    """
    if limit < 2:
        raise ValueError(f"limit must be >= 2 (a token and eos), got {limit}")
    whole = encode(text)
    if len(whole) <= limit:
        return FittedSource([whole], len(whole), 0)
    parts: list[str] = []
    start, fitting = 0, None  # fitting: the furthest sentence end up to which text[start:] fits
    for end in sentence_ends(text):
        if len(encode(text[start:end])) <= limit:
            fitting = end
            continue
        if fitting is not None:  # close the piece before this sentence, which may fit alone
            parts.append(text[start:fitting])
            start, fitting = fitting, None
            if len(encode(text[start:end])) <= limit:
                fitting = end
                continue
        parts.append(text[start:end])  # one sentence alone too long: truncated below
        start = end
    if fitting is not None:
        parts.append(text[start:fitting])
    pieces, truncated = [], 0
    for part in parts:
        ids = encode(part.strip())
        if len(ids) > limit:
            truncated += len(ids) - limit
            ids = torch.cat([ids[: limit - 1], ids[-1:]])  # the first limit - 1 tokens and eos
        pieces.append(ids)
    return FittedSource(pieces, len(whole), truncated)
