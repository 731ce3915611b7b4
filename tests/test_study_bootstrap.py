"""The study's paired bootstrap over test examples: its full-set scores are sacreBLEU's corpus BLEU
and the accuracy, its draws are the same for both models, and its interval separates a clearly
better system from an equal one."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from src.commands.study.bootstrap import (
    example_statistics,
    paired_bootstrap,
    read_test_outputs,
    score,
)
from src.evaluation.bleu import sacre_bleu

WORDS = [f"w{i}" for i in range(30)]


def references(count: int, seed: int = 0) -> list[str]:
    """Sentences of 3-15 words, some with punctuation and capitals (13a tokens them apart)."""
    generator = random.Random(seed)
    sentences = []
    for _ in range(count):
        words = [generator.choice(WORDS) for _ in range(generator.randint(3, 15))]
        if generator.random() < 0.3:
            words[0] = words[0].capitalize()
            words[-1] += "."
        sentences.append(" ".join(words))
    return sentences


def translations(refs: list[str], error: float, seed: int) -> dict:
    """A system's test outputs: each reference word replaced by a random one with probability
    ``error``."""
    generator = random.Random(seed)
    hypotheses = [
        " ".join(w if generator.random() > error else generator.choice(WORDS) for w in r.split())
        for r in refs
    ]
    return {
        "kind": "translation",
        "ids": list(range(len(refs))),
        "hypotheses": hypotheses,
        "references": refs,
    }


def classifications(labels: list[int], error: float, seed: int) -> dict:
    """A classifier's test outputs: each label wrong (shifted by one of 3 classes) with
    probability ``error``."""
    generator = random.Random(seed)
    predictions = [(y + 1) % 3 if generator.random() < error else y for y in labels]
    return {
        "kind": "classification",
        "ids": list(range(len(labels))),
        "predictions": predictions,
        "labels": labels,
    }


def test_full_set_bleu_from_the_statistics_is_sacrebleus_corpus_score() -> None:
    refs = references(50)
    run = translations(refs, 0.3, seed=1)
    run["hypotheses"][3] = ""  # an empty translation counts: no n-grams, its reference's length
    stats = example_statistics([run], "translation")
    assert stats.shape == (1, 50, 10) and stats.dtype == np.int64
    assert stats[0, 3, 0] == 0 and stats[0, 3, 1] == len(refs[3].split()) + refs[3].count(".")
    corpus = sacrebleu.corpus_bleu(run["hypotheses"], [refs]).score
    assert 10.0 < corpus < 90.0
    assert score("translation", stats[0].sum(axis=0), 50) == corpus  # exactly
    assert sacre_bleu(run["hypotheses"], refs) == corpus
    other = translations(refs, 0.5, seed=2)
    difference, _, _ = paired_bootstrap([run], [other], "translation", higher_is_better=True)
    assert difference == corpus - sacre_bleu(other["hypotheses"], refs)


def test_full_set_accuracy_is_the_share_right_averaged_over_seeds() -> None:
    labels = [i % 3 for i in range(40)]
    a = [classifications(labels, 0.1, seed) for seed in (1, 2)]
    b = [classifications(labels, 0.4, seed) for seed in (3, 4, 5)]
    stats = example_statistics(a, "classification")
    assert stats.shape == (2, 40, 1)

    def accuracy(run: dict) -> float:
        return float(np.mean(np.equal(run["predictions"], labels)))

    assert score("classification", stats[0].sum(axis=0), 40) == accuracy(a[0])
    difference, low, high = paired_bootstrap(a, b, "classification", higher_is_better=True)
    expected = np.mean([accuracy(r) for r in a]) - np.mean([accuracy(r) for r in b])
    assert difference == pytest.approx(expected, abs=1e-12)
    assert low < difference < high


def test_the_draws_are_the_same_for_every_run_as_a_loop_over_resampled_corpora_gives() -> None:
    """The counting and matrix products give what scoring each resampled corpus anew gives, with
    one draw of example indices shared by all runs."""
    refs = references(30)
    a = [translations(refs, 0.2, seed) for seed in (1, 2)]
    b = [translations(refs, 0.3, seed) for seed in (3, 4)]
    difference, low, high = paired_bootstrap(
        a, b, "translation", higher_is_better=True, samples=40, seed=7, level=0.9
    )
    indices = np.random.default_rng(7).integers(0, 30, size=(40, 30))
    drawn = []
    for draw in indices:
        r = [refs[i] for i in draw]

        def bleu(runs: list[dict], r: list[str] = r, draw: np.ndarray = draw) -> float:
            return float(np.mean([sacre_bleu([x["hypotheses"][i] for i in draw], r) for x in runs]))

        drawn.append(bleu(a) - bleu(b))
    assert (low, high) == pytest.approx(tuple(np.percentile(drawn, [5.0, 95.0])), abs=1e-9)
    assert difference == pytest.approx(
        np.mean([sacre_bleu(x["hypotheses"], refs) for x in a])
        - np.mean([sacre_bleu(x["hypotheses"], refs) for x in b]),
        abs=1e-9,
    )


def test_identical_systems_differ_by_zero() -> None:
    refs = references(60)
    runs = [translations(refs, 0.3, seed) for seed in (1, 2, 3)]
    # the same three runs, their seeds in another order: every draw scores them alike
    assert paired_bootstrap(runs, runs[::-1], "translation", higher_is_better=True) == (
        pytest.approx(0.0, abs=1e-9),
        pytest.approx(0.0, abs=1e-9),
        pytest.approx(0.0, abs=1e-9),
    )
    # two systems equally good, wrong on other examples: an interval around 0
    labels = [i % 3 for i in range(300)]
    a = [classifications(labels, 0.2, seed) for seed in (1, 2, 3)]
    b = [classifications(labels, 0.2, seed) for seed in (4, 5, 6)]
    difference, low, high = paired_bootstrap(a, b, "classification", higher_is_better=True)
    assert abs(difference) < 0.03 and low < 0.0 < high and high - low < 0.1


def test_a_clearly_better_system_has_an_interval_above_zero() -> None:
    refs = references(200)
    a = [translations(refs, 0.1, seed) for seed in (1, 2, 3)]
    b = [translations(refs, 0.4, seed) for seed in (4, 5, 6)]
    difference, low, high = paired_bootstrap(a, b, "translation", higher_is_better=True)
    assert 0.0 < low < difference < high and difference > 20.0
    # a metric where lower is better: the sign flips, so B's lower score is B better
    flipped = paired_bootstrap(a, b, "translation", higher_is_better=False)
    assert flipped == pytest.approx((-difference, -high, -low), abs=1e-9)
    assert flipped[2] < 0.0


def test_the_interval_is_the_same_for_the_same_seed() -> None:
    labels = [i % 3 for i in range(100)]
    a = [classifications(labels, 0.2, seed) for seed in (1, 2)]
    b = [classifications(labels, 0.3, seed) for seed in (3, 4)]
    first = paired_bootstrap(a, b, "classification", higher_is_better=True, seed=3)
    assert paired_bootstrap(a, b, "classification", higher_is_better=True, seed=3) == first
    other = paired_bootstrap(a, b, "classification", higher_is_better=True, seed=4)
    assert other[0] == first[0] and other[1:] != first[1:]


def test_runs_over_other_examples_are_refused_by_name() -> None:
    refs = references(10)
    a = [translations(refs, 0.2, 1), translations(refs, 0.2, 2)]
    moved = translations(refs[:3] + [refs[4], refs[3]] + refs[5:], 0.2, 3)
    with pytest.raises(ValueError, match=r"B run 0 differs from A run 0 at test example 3: ref"):
        paired_bootstrap(a, [moved], "translation", higher_is_better=True)
    short = translations(refs[:9], 0.2, 3)
    with pytest.raises(ValueError, match="B run 1 has 9 test examples but A run 0 has 10"):
        paired_bootstrap(a, [a[0], short], "translation", higher_is_better=True)
    labels = [0, 1, 2, 0]
    with pytest.raises(ValueError, match="A run 0 holds 'classification' outputs, expected 'tr"):
        paired_bootstrap([classifications(labels, 0.0, 1)], a, "translation", higher_is_better=True)
    renumbered = classifications(labels, 0.0, 1) | {"ids": [0, 1, 2, 5]}
    with pytest.raises(ValueError, match="B run 0 differs .* example 3: ids 5 against 3"):
        paired_bootstrap(
            [classifications(labels, 0.0, 2)],
            [renumbered],
            "classification",
            higher_is_better=True,
        )


def test_read_test_outputs(tmp_path: Path) -> None:
    assert read_test_outputs(tmp_path) is None  # a run that left none
    run = classifications([0, 1, 2], 0.0, 1)
    (tmp_path / "test_outputs.json").write_text(json.dumps(run))
    assert read_test_outputs(tmp_path) == run
    (tmp_path / "test_outputs.json").write_text(json.dumps({**run, "labels": [0, 1]}))
    with pytest.raises(ValueError, match="fields of different lengths"):
        read_test_outputs(tmp_path)
    (tmp_path / "test_outputs.json").write_text(json.dumps({"kind": "detection"}))
    with pytest.raises(ValueError, match="kind 'detection' is not one of"):
        read_test_outputs(tmp_path)


def test_a_thousand_draws_of_a_thousand_examples_take_well_under_seconds() -> None:
    labels = [i % 3 for i in range(1000)]
    a = [classifications(labels, 0.2, seed) for seed in (1, 2, 3)]
    b = [classifications(labels, 0.25, seed) for seed in (4, 5, 6)]
    start = time.perf_counter()
    difference, low, high = paired_bootstrap(a, b, "classification", higher_is_better=True)
    assert time.perf_counter() - start < 2.0
    assert low < difference < high
