"""The statistics over a claim's seeds: mean and standard deviation, Welch's t interval on the
difference of the means, the verdict it gives (with a stated margin for "no worse" claims), Holm's
correction over the family of claims.

Every difference is taken in the metric's "better" direction (positive: A better), so that one
rule serves BLEU and accuracy (higher is better) and perplexity or bpc (lower is better).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

LEVEL = 0.95  # the intervals' confidence; the family's error rate for Holm is 1 - LEVEL
UNDECIDED = "undecided"


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


@dataclass(frozen=True)
class Welch:
    """Welch's t interval on A - B (in the "better" direction) from each model's seeds."""

    difference: float
    low: float
    high: float
    dof: float  # Welch-Satterthwaite degrees of freedom
    standard_error: float

    def p_value(self, null: float = 0.0) -> float:
        """Two-sided p of the hypothesis difference = ``null``."""
        if self.standard_error == 0:
            return 0.0 if self.difference != null else 1.0
        t = (self.difference - null) / self.standard_error
        return float(2 * scipy_stats.t.sf(abs(t), self.dof))


def welch(
    a: Sequence[float], b: Sequence[float], *, higher_is_better: bool, level: float = LEVEL
) -> Welch:
    """Welch's interval on mean(a) - mean(b), sign-flipped when lower is better; each side needs at
    least two values (its variance)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's interval needs two values a side, got {len(a)} and {len(b)}")
    sign = 1.0 if higher_is_better else -1.0
    difference = sign * (statistics.mean(a) - statistics.mean(b))
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Welch(difference, difference, difference, math.inf, 0.0)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(scipy_stats.t.ppf(0.5 + level / 2, dof)) * se
    return Welch(difference, difference - half, difference + half, dof, se)


@dataclass(frozen=True)
class Verdict:
    """A claim's verdict from an interval on A - B (``interval`` = (low, high), "better"
    direction): ``word`` and the two-sided p of the hypothesis it rejects (None where the interval
    decides nothing or the claim is a measurement)."""

    word: str
    p: float | None


def decide(kind: str, welch_interval: Welch, margin: float = 0.0) -> Verdict:
    """The verdict of a claim of ``kind`` from Welch's interval:

    - ``better`` (A beats B): **holds** when the interval lies above 0, **does not hold** when it
      lies below 0, else **undecided**;
    - ``not_worse`` (A no worse than B by more than ``margin``): **holds** when the interval lies
      above -margin, **does not hold** when it lies below -margin, else **undecided**. The margin
      comes from the paper's own precision; without it, a noisy baseline would make "holds" easy;
    - ``report`` (a measurement): **A better**, **B better** or **within noise**, no p.
    """
    low, high = welch_interval.low, welch_interval.high
    if kind == "report":
        word = "A better" if low > 0 else "B better" if high < 0 else "within noise"
        return Verdict(word, None)
    null = -margin if kind == "not_worse" else 0.0
    if low > null:
        return Verdict("holds", welch_interval.p_value(null))
    if high < null:
        return Verdict("does not hold", welch_interval.p_value(null))
    return Verdict(UNDECIDED, None)


def holm(p_values: Mapping[str, float | None], alpha: float = 1 - LEVEL) -> dict[str, bool]:
    """Holm's step-down correction over a family of decided verdicts: {name: still decided}.
    ``None`` (undecided, or a measurement) is not in the family and stays False."""
    family = sorted(((p, name) for name, p in p_values.items() if p is not None))
    kept = {name: False for name in p_values}
    for rank, (p, name) in enumerate(family):
        if p > alpha / (len(family) - rank):
            break
        kept[name] = True
    return kept
