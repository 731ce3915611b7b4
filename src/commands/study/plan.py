"""The study's budget before it runs (``python study.py --plan``): per model and claim, the runs
its decisions take from scratch (at least: the grids as configured and three seeds; at most: every
grid extension, the extra seeds and the equal-time runs), what one run costs, what is done and
what runs next."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from src.commands.study.claims import Claim, ModelSpec
from src.commands.study.runner import read_run, replay


@dataclass(frozen=True)
class ModelBudget:
    """One model's tuning and verdict runs (shared by the claims that compare it)."""

    model: ModelSpec
    least: int
    most: int
    minutes: float  # a run's wall minutes: measured on its finished runs, else the configured

    def cpu_minutes(self, runs: int) -> float:
        return runs * self.minutes


def runs_range(claim: Claim, model: ModelSpec, extend: int, extra_seeds: bool) -> tuple[int, int]:
    """(least, most) tuning and seed runs of a model from scratch."""
    starts = len(model.tune[0].options) if model.tune else 1
    later = model.tune[1:]
    # a later stage's option that overrides nothing is the run its stage starts from
    least_later = sum(len(s.options) - any(not o for _, o in s.options) for s in later)
    extra = len(claim.extra_seeds) if extra_seeds and claim.kind != "report" else 0
    least = starts * len(model.lrs) + least_later + len(claim.seeds)
    most = starts * (len(model.lrs) + extend) + sum(len(s.options) for s in later)
    return least, most + len(claim.seeds) + extra


def run_minutes(out: Path, model: ModelSpec) -> float:
    """The mean wall minutes of the model's finished runs at its own length, else the claim's
    configured estimate."""
    walls = []
    for run_dir in model.folder(out).glob("lr*"):
        result = read_run(run_dir)
        # an equal-time run's label ends in its length (``..._s2_1755``)
        if result is not None and not re.search(r"_\d+$", run_dir.name):
            walls.append(result.wall_time_s / 60)
    return statistics.mean(walls) if walls else model.estimate_minutes


def plan(
    out: Path, claims: Sequence[Claim], extend: int = 2, extra_seeds: bool = True, jobs: int = 2
) -> str:
    """The plan as text: one line per claim and model, then the totals against the runs done."""
    budgets: dict[Path, ModelBudget] = {}
    lines = [
        "claim / model: runs from scratch (least-most) x minutes a run = CPU-thread minutes; "
        "finished; due next"
    ]
    least_total = most_total = 0.0
    done_total = 0.0
    for claim in claims:
        used, due = replay(out, claim, extend, extra_seeds)
        # each finished run's wall minutes, read once
        finished = {}
        for key in used:
            result = read_run(key.run_dir(out)) if key not in due else None
            if result is not None:
                finished[key] = result.wall_time_s / 60
        lines.append(f"{claim.name}: {claim.title}")
        for model in claim.models:
            folder = model.folder(out)
            least, most = runs_range(claim, model, extend, extra_seeds)
            shared = folder in budgets
            budget = budgets.setdefault(
                folder, ModelBudget(model, least, most, run_minutes(out, model))
            )
            mine = [k for k in finished if k.model == model]
            next_up = [k for k in due if k.model == model]
            note = " (runs shared with an earlier claim)" if shared else ""
            lines.append(
                f"  {model.name}: {least}-{most} x {budget.minutes:.1f} min = "
                f"{budget.cpu_minutes(least):.0f}-{budget.cpu_minutes(most):.0f}{note}; "
                f"{len(mine)} finished; {len(next_up)} due next"
            )
            if not shared:
                least_total += budget.cpu_minutes(least)
                most_total += budget.cpu_minutes(most)
            done_total += 0.0 if shared else sum(finished[k] for k in mine)
        # the faster model's equal-time runs: as many again as the verdict's seeds, at about the
        # slower model's run time
        slow = max(budgets[m.folder(out)].minutes for m in claim.models)
        seeds = len(claim.seeds) + (len(claim.extra_seeds) if extra_seeds else 0)
        lines.append(
            f"  equal time: 0-{seeds} x {slow:.1f} min = 0-{seeds * slow:.0f} "
            "(none where the times are within 5%)"
        )
        most_total += seeds * slow
    lines.append(
        f"total: {least_total / 60:.1f}-{most_total / 60:.1f} CPU-thread hours "
        f"({least_total / 60 / jobs:.1f}-{most_total / 60 / jobs:.1f} h at {jobs} runs at a time); "
        f"finished: {done_total / 60:.1f} h"
    )
    return "\n".join(lines)
