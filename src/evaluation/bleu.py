"""BLEU as the papers report it and as sacreBLEU standardises it, both computed by ``sacrebleu``.

- :func:`sacre_bleu`: sacreBLEU's default signature (``13a`` tokenisation, exponential smoothing,
  case-sensitive) on detokenised text. Comparable across papers when the text is raw. Its metric
  object (:func:`sacre_bleu_metric`) also gives the per-sentence statistics that resampling the
  test set sums (:mod:`src.commands.study.bootstrap`).
- :func:`tokenized_bleu`: the DeLighT tables' BLEU (fairseq's ``--remove-bpe`` output scored by
  ``fairseq-score``, i.e. ``multi-bleu.perl``): n-gram statistics over the whitespace tokens of
  already tokenised text (``tokenize="none"``), no smoothing. For raw text the tokens are
  sacreBLEU's ``13a`` ones. ``compound_split`` applies the WMT'14 En-De convention of the official
  ``compound_split_bleu.sh`` (``a-b`` -> ``a ##AT##-##AT## b`` in hypotheses and references).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sacrebleu
from sacrebleu.metrics import BLEU

COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text: str) -> str:
    """``"Know-how"`` -> ``"Know ##AT##-##AT## how"``.

    One left-to-right pass without overlaps, as the official script's Perl ``s{...}{...}g``:
    ``"a-b-c"`` -> ``"a ##AT##-##AT## b-c"``.
    """
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")


def sacre_bleu_metric(references: Sequence[str] | None = None) -> BLEU:
    """sacreBLEU's BLEU with its default signature: 13a tokens, exp smoothing, case-sensitive,
    4-grams, no effective order; with ``references`` (one a sentence) their n-grams are counted
    once for every system scored against them."""
    return BLEU(references=None if references is None else [list(references)])


def sacre_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacreBLEU (13a, exp smoothing) of detokenised ``hypotheses`` against one reference each."""
    _check(hypotheses, references)
    return sacre_bleu_metric().corpus_score(list(hypotheses), [list(references)]).score


def tokenized_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    tokenized: bool = True,
    compound_split: bool = False,
    lowercase: bool = False,
) -> float:
    """BLEU-4 over whitespace tokens (tokenised text) or 13a tokens (raw text), unsmoothed."""
    _check(hypotheses, references)
    hypotheses, references = list(hypotheses), list(references)
    if compound_split:
        hypotheses = [split_compounds(h) for h in hypotheses]
        references = [split_compounds(r) for r in references]
    return sacrebleu.corpus_bleu(
        hypotheses,
        [references],
        tokenize="none" if tokenized else "13a",
        smooth_method="none",
        lowercase=lowercase,
        force=True,  # tokenised input is what this flavour is for
    ).score
