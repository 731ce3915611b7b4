"""The study's report: ``docs/claims.md`` (a summary table, then per claim its models' grids,
metrics, times and verdict) and one curve plot per claim, from the finished runs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from src.commands.study.claims import FIRST_SEED, SELECT_KEY, Claim, ModelSpec
from src.commands.study.runner import (
    RunKey,
    RunResult,
    Study,
    claim_runs,
    compute_minutes,
    shown,
)
from src.commands.study.stats import mean_curve, mean_std, verdict
from src.utils.extras import require


@dataclass
class Side:
    """One model's runs in the report: the grid, the seeds at the chosen rate, and (for the
    faster one) the seeds at equal time."""

    model: ModelSpec
    grid: dict[float, RunResult | None]
    lr: float
    runs: list[RunResult]
    equal_time: list[RunResult]
    equal_length: int | None


def collect(study: Study, claim: Claim) -> list[Side] | None:
    """The finished runs of a claim, None while its seeds are incomplete."""
    found = {}
    for model in claim.models:
        lrs = sorted(
            {float(p.name.split("_")[0][2:]) for p in model.folder(study.out).glob("lr*_s1")}
            | set(model.lrs)
        )
        grid = {lr: study.result(claim, RunKey(model, lr, FIRST_SEED, model.length)) for lr in lrs}
        if not any(grid.values()):
            return None
        lr = study.chosen_lr(claim, model, lrs)
        runs = [study.result(claim, k) for k in study.seeds(claim, model, lr)]
        if any(r is None for r in runs):
            return None
        found[model.name] = (grid, lr, runs)
    equal = study.equal_time_length(claim, {name: lr for name, (_, lr, _) in found.items()})
    sides = []
    for model in claim.models:
        grid, lr, runs = found[model.name]
        equal_time, equal_length = [], None
        if equal is not None and equal[0] == model:
            equal_length = equal[1]
            longer = [study.result(claim, k) for k in study.seeds(claim, model, lr, equal_length)]
            equal_time = [r for r in longer if r is not None]
        sides.append(Side(model, grid, lr, runs, equal_time, equal_length))
    return sides


def digits_for(value: float) -> int:
    """Decimals that show a metric's differences: 3 below 10 (bpc, accuracy), else 2 (BLEU, ppl)."""
    return 3 if abs(value) < 10 else 2


def fmt(mean: float, std: float, digits: int | None = None) -> str:
    digits = digits_for(mean) if digits is None else digits
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def ms_per_update(side: Side) -> float:
    """Training milliseconds per update of the seeds at the chosen rate (mean over the seeds)."""
    fit = statistics.mean(r.fit_time_s for r in side.runs)
    return 1e3 * fit / max(1, statistics.mean(r.updates for r in side.runs))


def cost_line(runs: int, minutes: float, jobs: int) -> str:
    return (
        f"{runs} runs, {minutes:.0f} CPU-thread minutes: about {minutes / jobs:.0f} min "
        f"at {jobs} runs at a time"
    )


def claim_section(
    claim: Claim, sides: list[Side], plot: str | None, cost: str | None = None
) -> tuple[str, str]:
    """The claim's Markdown section and its row of the summary table; ``cost`` is what the
    claim's runs take from scratch."""
    metric = claim.metric
    lines = [f"## {claim.title}", "", f"**Claim** ({claim.source}): {claim.statement}", ""]
    lines.append(
        f"| model | params | lr grid at seed 1: best {SELECT_KEY} | lr | {metric} (mean ± std, "
        f"{len(claim.seeds)} seeds) | best {SELECT_KEY} | updates | "
        "training time (with validation) | ms / update |"
    )
    lines.append("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for side in sides:
        grid = ", ".join(
            f"{lr:g}: {r.val_loss:.3f}" if r else f"{lr:g}: —"
            for lr, r in sorted(side.grid.items())
        )
        # the best rate still at an edge after the grid's extensions: a better one may lie beyond
        tried = [lr for lr, r in side.grid.items() if r is not None]
        edge = " (grid edge)" if side.lr in (min(tried), max(tried)) else ""
        rows = [(side.model.name, side.runs)]
        if side.equal_time:
            unit = side.model.length_key.split(".")[-1]
            rows.append(
                (f"{side.model.name}, equal time ({unit} {side.equal_length})", side.equal_time)
            )
        for name, runs in rows:
            test = mean_std([r.metrics[metric] for r in runs])
            val = mean_std([r.val_loss for r in runs])
            updates = statistics.mean(r.updates for r in runs)
            fit = statistics.mean(r.fit_time_s for r in runs)
            per = 1e3 * fit / updates if updates else float("nan")
            lines.append(
                f"| {name} | {runs[0].params:,} | {grid if runs is side.runs else '(same lr)'} | "
                f"{side.lr:g}{edge} | {fmt(*test)} | {fmt(*val, 3)} | {updates:,.0f} | "
                f"{fit:,.0f} s | {per:.0f} |"
            )
    a, b = sides
    d = digits_for(statistics.mean(r.metrics[metric] for r in a.runs))
    found, diff, noise = verdict(
        claim, [r.metrics[metric] for r in a.runs], [r.metrics[metric] for r in b.runs]
    )
    # the differences as measured (verdict() turns them to the "better" direction)
    sign, better = (1, "higher is better") if claim.higher_is_better else (-1, "lower is better")
    params = a.runs[0].params / b.runs[0].params - 1
    lines += [
        "",
        (
            f"**Verdict: {found}.** {a.model.name} − {b.model.name} = "
            f"{sign * diff:+.{d}f} {metric}, {better} "
            f"(two standard errors: {noise:.{d}f}); parameters {params:+.1%}."
        ),
    ]
    faster = next((s for s in sides if s.equal_time), None)
    if faster is not None:
        other = b if faster is a else a
        a_runs = a.equal_time if faster is a else a.runs
        b_runs = b.equal_time if faster is b else b.runs
        eq_found, eq_diff, eq_noise = verdict(
            claim, [r.metrics[metric] for r in a_runs], [r.metrics[metric] for r in b_runs]
        )
        lines.append(
            f"At equal training time ({faster.model.name} given {other.model.name}'s): "
            f"{a.model.name} − {b.model.name} = {sign * eq_diff:+.{d}f} "
            f"(two standard errors {eq_noise:.{d}f}): "
            f"{eq_found}."
        )
    if claim.notes:
        lines += ["", claim.notes]
    if cost:
        lines += ["", f"Cost from scratch (`python study.py {claim.name}`): {cost}."]
    if plot:
        lines += ["", f"![{claim.title}: {SELECT_KEY} by update]({plot})"]
    lines.append("")
    per_update = " vs ".join(f"{ms_per_update(s):.0f}" for s in sides)
    a_metric = fmt(*mean_std([r.metrics[metric] for r in a.runs]))
    b_metric = fmt(*mean_std([r.metrics[metric] for r in b.runs]))
    row = (
        f"| {claim.title} | {claim.statement} | {a.model.name} {a_metric} vs "
        f"{b.model.name} {b_metric} {metric} | {found} | {per_update} |"
    )
    return "\n".join(lines), row


def plot_curves(claim: Claim, sides: list[Side], path: Path) -> Path:
    """Validation loss by update, mean over the seeds with a ± one standard deviation band."""
    require("matplotlib", "demos", "the study's plots")
    import matplotlib  # an extra: imported where used

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for number, side in enumerate(sides):
        color = f"C{number}"  # a model's curves share its colour
        for name, runs, style in (
            (side.model.name, side.runs, "-"),
            # dashed: it follows the shorter run's curve until that one ends
            (f"{side.model.name} (equal time)", side.equal_time, "--"),
        ):
            if not runs:
                continue
            steps, stats = mean_curve(runs)
            if not steps:
                continue
            axes.plot(steps, [m for m, _ in stats], style, color=color, marker=".", label=name)
            axes.fill_between(
                steps, [m - s for m, s in stats], [m + s for m, s in stats], color=color, alpha=0.2
            )
    axes.set_xlabel("update")
    axes.set_ylabel(SELECT_KEY)
    axes.set_title(f"{claim.title}\nmean ± std over {len(claim.seeds)} seeds", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_report(study: Study, claims: Sequence[Claim], path: Path, command: str) -> str:
    """``docs/claims.md``: the summary table, then one section per claim with finished runs."""
    sections, rows, pending, everything = [], [], [], []
    for claim in claims:
        sides = collect(study, claim)
        if sides is None:
            pending.append(claim)
            continue
        keys = claim_runs(study.out, claim, study.extend)
        cost = None
        if keys is not None:
            everything += keys
            cost = cost_line(*compute_minutes(study.out, keys), study.jobs)
        plot = plot_curves(claim, sides, path.parent / f"claims_{claim.name}.png")
        section, row = claim_section(claim, sides, plot.name, cost)
        sections.append(section)
        rows.append(row)
    total = (
        " All of it from scratch: "
        f"{cost_line(*compute_minutes(study.out, everything), study.jobs)}."
        if everything
        else ""
    )
    text = [
        "# The papers' claims, tested fairly",
        "",
        "Generated by `"
        + command
        + "` from the runs under `"
        + shown(study.out)
        + "` (do not edit by "
        "hand). Each model runs its own recipe at equal parameters (within 1%); its learning "
        f"rate is chosen on {SELECT_KEY} at seed 1 from a grid of factors of two (grown while the "
        "best is at an edge); the chosen rate runs at three seeds; the faster model runs again at "
        "equal training time. Verdict: the difference of the means against two standard errors "
        "of it. Times are "
        "one PyTorch thread per run, two runs at a time on a 2-core CPU." + total,
        "",
        "| claim | statement | ours (mean ± std) | verdict | ms / update (A vs B, CPU) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        *sections,
    ]
    if pending:
        text += ["## Not yet measured", ""]
        text += [f"- {c.title}: `python study.py {c.name}`" for c in pending]
        text.append("")
    out = "\n".join(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out)
    return out
