"""The statistics over a claim's seeds: mean and standard deviation, the verdict (the difference of
the means against two standard errors of it) and the mean validation curve."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from src.commands.study.claims import Claim
from src.commands.study.runner import RunResult


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def verdict(claim: Claim, a: Sequence[float], b: Sequence[float]) -> tuple[str, float, float]:
    """(verdict, A - B in the metric's "better" direction, two standard errors of it)."""
    sign = 1.0 if claim.higher_is_better else -1.0
    diff = sign * (statistics.mean(a) - statistics.mean(b))
    var = sum(statistics.variance(v) / len(v) for v in (a, b) if len(v) > 1)
    noise = 2 * math.sqrt(var)
    if claim.kind == "report":
        return (
            ("A better" if diff > noise else "B better" if diff < -noise else "within noise"),
            diff,
            noise,
        )
    if abs(diff) <= noise:
        return ("holds" if claim.kind == "not_worse" else "within noise"), diff, noise
    return ("holds" if diff > 0 else "does not hold"), diff, noise


def mean_curve(runs: Sequence[RunResult]) -> tuple[list[float], list[tuple[float, float]]]:
    """The seeds' validation curves averaged point by point: (mean update, (mean, std)) of the
    k-th validation of every seed, whose update counts can differ (variable BPTT windows give
    each seed its own number of updates per epoch)."""
    curves = [sorted(r.curve.items()) for r in runs]
    count = min((len(c) for c in curves), default=0)
    steps = [statistics.mean(c[k][0] for c in curves) for k in range(count)]
    return steps, [mean_std([c[k][1] for c in curves]) for k in range(count)]
