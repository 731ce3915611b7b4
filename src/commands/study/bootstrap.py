"""A paired bootstrap over the test examples: how far the difference of two models' test scores
could move with another draw of the test set of the same size.

Each ``train.py`` run of a translation or text classification model leaves its per-example test
results in ``<run_dir>/test_outputs.json`` (:func:`read_test_outputs`), in the order of the test
split. Each example is reduced to the statistics its metric sums over a corpus
(:func:`example_statistics`): for sacreBLEU the sentence's hypothesis and reference lengths and
its matched and total n-grams of each order (sacreBLEU's own per-sentence statistics, so the score
of the summed statistics is the corpus score); for accuracy 1 when the prediction is right.

:func:`paired_bootstrap` draws test-example indices with replacement, the same draw for every run
of both models (paired: a hard sentence drawn twice counts twice for both), scores every run on
each draw, averages each model's seeds and takes A - B (Koehn, 2004, "Statistical Significance
Tests for Machine Translation Evaluation", paired bootstrap resampling). The interval is the
percentile interval of the draws' differences. It measures the test set's sampling noise only;
the spread of the seeds is what :mod:`src.commands.study.stats` weighs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from src.evaluation.bleu import sacre_bleu_metric

TEST_OUTPUTS = "test_outputs.json"
# each kind's fields; the first two must be the same for every run compared (the same examples)
FIELDS = {
    "translation": ("ids", "references", "hypotheses"),
    "classification": ("ids", "labels", "predictions"),
}
SHARED_FIELDS = {kind: fields[:2] for kind, fields in FIELDS.items()}
KINDS = tuple(FIELDS)
CHUNK = 1 << 22  # draws x examples held at once: 32 MiB of float64 counts


def read_test_outputs(run_dir: Path) -> dict[str, Any] | None:
    """The per-example test results a run left in ``run_dir``, or None when it left none (a task
    that keeps none, a run without a test, or a run from before they were written)."""
    path = Path(run_dir) / TEST_OUTPUTS
    if not path.is_file():
        return None
    outputs = json.loads(path.read_text())
    kind = outputs.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{path}: kind {kind!r} is not one of {KINDS}")
    missing = [field for field in FIELDS[kind] if not isinstance(outputs.get(field), list)]
    if missing:
        raise ValueError(f"{path}: no list {', '.join(missing)} in the {kind} outputs")
    lengths = {field: len(outputs[field]) for field in FIELDS[kind]}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{path}: fields of different lengths {lengths}")
    return outputs


def example_statistics(runs: Sequence[Mapping[str, Any]], kind: str) -> np.ndarray:
    """The statistics each test example adds to its metric, for runs over the same examples.

    Shape:
        -> (R, N, 2 + 2 * 4) int64 for translation (hypothesis length, reference length, matched
        n-grams of orders 1-4, hypothesis n-grams of orders 1-4, as sacreBLEU counts them);
        (R, N, 1) int64 for classification (1 when the prediction is the label)
    """
    if kind == "translation":
        references = list(runs[0]["references"])
        metric = sacre_bleu_metric(references)  # the references' n-grams counted once
        rows = []
        for outputs in runs:
            hypotheses = list(outputs["hypotheses"])
            if len(hypotheses) != len(references):
                raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
            # what BLEU.corpus_score sums before it scores
            rows.append(metric._extract_corpus_statistics(hypotheses, None))
        return np.asarray(rows, dtype=np.int64).reshape(len(runs), len(references), -1)
    if kind == "classification":
        correct = []
        for outputs in runs:
            predictions, labels = np.asarray(outputs["predictions"]), np.asarray(outputs["labels"])
            if predictions.shape != labels.shape:
                raise ValueError(f"{predictions.size} predictions for {labels.size} labels")
            correct.append(predictions == labels)
        return np.asarray(correct, dtype=np.int64).reshape(len(runs), -1, 1)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def score(kind: str, summed: np.ndarray, count: int) -> np.ndarray:
    """The metric of summed example statistics: sacreBLEU (0-100) or accuracy (0-1).

    Shape:
        summed (..., K) int64, sums over ``count`` examples -> (...) float64
    """
    if kind == "classification":
        return summed[..., 0] / count
    metric = sacre_bleu_metric()
    flat = summed.reshape(-1, summed.shape[-1]).tolist()  # Python ints: sacreBLEU's arithmetic
    scores = [metric._compute_score_from_stats(stats).score for stats in flat]
    return np.asarray(scores, dtype=np.float64).reshape(summed.shape[:-1])


def check_same_examples(runs: Sequence[tuple[str, Mapping[str, Any]]], kind: str) -> None:
    """Raise ``ValueError`` naming the first run whose examples differ from the first run's: the
    kind, the count, or the first example whose id or reference (label) differs."""
    first_name, first = runs[0]
    for name, outputs in runs:
        if outputs.get("kind") != kind:
            raise ValueError(f"{name} holds {outputs.get('kind')!r} outputs, expected {kind!r}")
        for field in SHARED_FIELDS[kind]:
            mine, theirs = list(outputs[field]), list(first[field])
            if len(mine) != len(theirs):
                raise ValueError(
                    f"{name} has {len(mine)} test examples but {first_name} has {len(theirs)}: "
                    "the runs were not tested on the same examples"
                )
            for i, (a, b) in enumerate(zip(mine, theirs)):
                if a != b:
                    raise ValueError(
                        f"{name} differs from {first_name} at test example {i}: {field} "
                        f"{a!r} against {b!r}; the runs were not tested on the same examples"
                    )


def resample_counts(count: int, samples: int, generator: np.random.Generator) -> np.ndarray:
    """How often each of ``count`` examples is drawn in ``samples`` draws of ``count`` examples
    with replacement.

    Shape:
        -> (samples, count) float64, each row summing to ``count``
    """
    indices = generator.integers(0, count, size=(samples, count))
    # one bincount over all draws: draw s's indices shifted by s * count
    shifted = indices + count * np.arange(samples)[:, None]
    return (
        np.bincount(shifted.ravel(), minlength=samples * count)
        .reshape(samples, count)
        .astype(np.float64)
    )


def paired_bootstrap(
    a_runs: Sequence[Mapping[str, Any]],
    b_runs: Sequence[Mapping[str, Any]],
    kind: str,
    *,
    higher_is_better: bool,
    samples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(A - B on the whole test set, low, high): the difference of the seeds' mean metrics and its
    ``level`` percentile interval over ``samples`` paired resamples of the test examples.

    Args:
        a_runs: model A's per-example test outputs, one per seed (:func:`read_test_outputs`).
        b_runs: model B's, over the same test examples in the same order.
        kind: ``"translation"`` (sacreBLEU) or ``"classification"`` (accuracy).
        higher_is_better: False flips the sign, so that a positive difference means A is better.
        samples: the number of resamples.
        seed: seed of the draws; the same seed gives the same interval.
        level: the interval's coverage.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not a_runs or not b_runs:
        raise ValueError(f"need runs of both models, got {len(a_runs)} and {len(b_runs)}")
    if samples < 1 or not 0.0 < level < 1.0:
        raise ValueError(f"need samples >= 1 and 0 < level < 1, got {samples}, {level}")
    named = [(f"A run {i}", r) for i, r in enumerate(a_runs)]
    named += [(f"B run {i}", r) for i, r in enumerate(b_runs)]
    check_same_examples(named, kind)
    count = len(a_runs[0]["ids"])
    if count == 0:
        raise ValueError("the runs have no test examples")
    # (R, N, K), float64 for the matrix products: sums of small counts, exact
    stats = example_statistics([*a_runs, *b_runs], kind).astype(np.float64)
    sign = 1.0 if higher_is_better else -1.0

    def differences(weights: np.ndarray) -> np.ndarray:
        """A - B of the mean scores for each row of example weights (S, N) -> (S,)."""
        summed = np.rint(weights @ stats).astype(np.int64)  # (S, N) @ (R, N, K) -> (R, S, K)
        scores = score(kind, summed, count)  # (R, S)
        return sign * (scores[: len(a_runs)].mean(axis=0) - scores[len(a_runs) :].mean(axis=0))

    (full,) = differences(np.ones((1, count)))
    generator = np.random.default_rng(seed)
    chunk = max(1, CHUNK // count)
    drawn = np.concatenate(
        [
            differences(resample_counts(count, min(chunk, samples - start), generator))
            for start in range(0, samples, chunk)
        ]
    )
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(drawn, [tail, 100.0 - tail])
    return float(full), float(low), float(high)
