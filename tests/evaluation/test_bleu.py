"""BLEU flavours against sacrebleu's own numbers and hand-counted cases."""

from __future__ import annotations

import math

import pytest

from src.evaluation.bleu import sacre_bleu, split_compounds, tokenized_bleu


def test_identical_text_scores_100() -> None:
    assert sacre_bleu(["Das ist gut."], ["Das ist gut."]) == pytest.approx(100.0)
    assert tokenized_bleu(["das ist gut ."], ["das ist gut ."]) == pytest.approx(100.0)


def test_tokenized_bleu_counts_whitespace_tokens() -> None:
    # 6 tokens against 6: precisions 5/6, 3/5, 2/4, 1/3; no brevity penalty
    score = tokenized_bleu(["the cat sat on a mat"], ["the cat sat on the mat"])
    expected = 100 * math.exp(
        (math.log(5 / 6) + math.log(3 / 5) + math.log(2 / 4) + math.log(1 / 3)) / 4
    )
    assert score == pytest.approx(expected, rel=1e-9)
    # unsmoothed: no 4-gram match gives 0, as multi-bleu.perl
    assert tokenized_bleu(["the cat"], ["the cat sat"]) == 0.0
    # raw text: 13a splits the full stop off, tokenised text does not
    assert tokenized_bleu(["a b c d."], ["a b c d ."], tokenized=False) == pytest.approx(100.0)
    assert tokenized_bleu(["a b c d."], ["a b c d ."], tokenized=True) < 100.0


def test_compound_splitting_follows_the_official_script() -> None:
    assert (
        split_compounds("Know-how im 19.-20. Jh - gut")
        == "Know ##AT##-##AT## how im 19. ##AT##-##AT## 20. Jh - gut"
    )
    assert (
        split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    )  # Perl's s///g does not overlap matches
    # splitting turns one wrong compound token into two right tokens and one wrong
    hypothesis, reference = (
        ["und das ist ein Know-how Transfer und das ist gut"],
        ["und das ist ein Know-why Transfer und das ist gut"],
    )
    plain = tokenized_bleu(hypothesis, reference)
    split = tokenized_bleu(hypothesis, reference, compound_split=True)
    assert split > plain


def test_lengths_must_match() -> None:
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        sacre_bleu(["a", "b"], ["a"])
