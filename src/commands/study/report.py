"""The study's report: ``docs/claims.md`` (a summary table, then per claim its models' recipes,
tuning grids, metrics, times, intervals and verdicts) and one curve plot per claim, from the
finished runs."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from src.commands.study.claims import SELECT_KEY, STUDY_CONF, Claim, ModelSpec
from src.commands.study.runner import (
    RunKey,
    RunResult,
    Study,
    Tuned,
    claim_runs,
    compute_minutes,
    decisions,
    effective,
    shown,
)
from src.commands.study.stats import (
    LEVEL,
    UNDECIDED,
    Verdict,
    Welch,
    decide,
    holm,
    mean_std,
)
from src.commands.study.stats import welch as welch_interval
from src.utils.extras import require


@dataclass
class Side:
    """One model's runs in the report: its tuning, the verdict's seeds at the chosen settings,
    and (for the faster one) the seeds at equal time."""

    model: ModelSpec
    tuned: Tuned
    grid: list[tuple[RunKey, RunResult | None]]
    runs: list[RunResult]
    run_dirs: list[Path]
    equal_time: list[RunResult]
    equal_dirs: list[Path]
    equal_length: int | None

    @property
    def lr(self) -> float:
        return self.tuned.lr


def collect(study: Study, claim: Claim) -> list[Side] | None:
    """The finished runs of a claim, None while a run its decisions need is missing."""
    found = decisions(study.out, claim, study.extend, study.extra_seeds)
    if found is None:
        return None
    sides = []
    for model in claim.models:
        tuned = found.tuned[model.name]
        keys = study.seed_keys(model, tuned, found.seeds)
        equal_keys: list[RunKey] = []
        equal_length = None
        if found.equal is not None and found.equal[0] == model:
            equal_length = found.equal[1]
            equal_keys = study.seed_keys(model, tuned, found.seeds, equal_length)
        sides.append(
            Side(
                model,
                tuned,
                [(k, study.result(claim, k)) for k in tuned.tried],
                [study.result(claim, k) for k in keys],
                [k.run_dir(study.out) for k in keys],
                [study.result(claim, k) for k in equal_keys],
                [k.run_dir(study.out) for k in equal_keys],
                equal_length,
            )
        )
    return sides


@dataclass(frozen=True)
class Outcome:
    """A comparison of A and B over the verdict's seeds: Welch's interval, the verdict it gives,
    and the paired bootstrap over the test examples (None where the runs kept none)."""

    welch: Welch
    verdict: Verdict
    bootstrap: tuple[float, float, float] | None


def outcome(claim: Claim, a: Side, b: Side, equal_time: bool = False) -> Outcome:
    """A − B at the chosen settings, or at equal time (the faster model's longer runs)."""
    a_runs, a_dirs = (
        (a.equal_time, a.equal_dirs) if equal_time and a.equal_time else (a.runs, a.run_dirs)
    )
    b_runs, b_dirs = (
        (b.equal_time, b.equal_dirs) if equal_time and b.equal_time else (b.runs, b.run_dirs)
    )
    interval = welch_interval(
        [r.metrics[claim.metric] for r in a_runs],
        [r.metrics[claim.metric] for r in b_runs],
        higher_is_better=claim.higher_is_better,
    )
    return Outcome(
        interval, decide(claim.kind, interval, claim.margin), bootstrap(claim, a_dirs, b_dirs)
    )


def bootstrap(
    claim: Claim, a_dirs: Sequence[Path], b_dirs: Sequence[Path]
) -> tuple[float, float, float] | None:
    """The paired bootstrap over the test examples (A − B, "better" direction, and its interval)
    where every run kept its per-example test outputs; None otherwise (language models: one
    stream of text, not a sample of sentences)."""
    if not all((d / "test_outputs.json").is_file() for d in (*a_dirs, *b_dirs)):
        return None
    from src.commands.study.bootstrap import paired_bootstrap, read_test_outputs

    a_out = [read_test_outputs(d) for d in a_dirs]
    b_out = [read_test_outputs(d) for d in b_dirs]
    if any(o is None for o in a_out + b_out):
        return None
    return paired_bootstrap(
        a_out, b_out, a_out[0]["kind"], higher_is_better=claim.higher_is_better, level=LEVEL
    )


def digits_for(value: float) -> int:
    """Decimals that show a metric's differences: 3 below 10 (bpc, accuracy), else 2 (BLEU, ppl)."""
    return 3 if abs(value) < 10 else 2


def fmt(mean: float, std: float, digits: int | None = None) -> str:
    digits = digits_for(mean) if digits is None else digits
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def interval_text(difference: float, low: float, high: float, digits: int) -> str:
    return f"{difference:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def ms_per_update(side: Side) -> float:
    """Training milliseconds per update of the seeds at the chosen settings (mean over them)."""
    fit = statistics.mean(r.training_s for r in side.runs)
    return 1e3 * fit / max(1, statistics.mean(r.updates for r in side.runs))


def same_best_note(side: Side, metric: str) -> str:
    """A sentence for equal-time runs whose scores are their shorter runs' own (their schedule
    does not depend on the length, so they retrace the shorter runs and then do not beat the
    best validation loss those reached); empty otherwise."""
    pairs = list(zip(side.runs, side.equal_time))
    if not pairs or any(
        short.metrics[metric] != long.metrics[metric]
        or short.val_loss != long.val_loss
        or any(long.curve.get(step) != value for step, value in short.curve.items())
        for short, long in pairs
    ):
        return ""
    best = sorted({min(r.curve, key=r.curve.get) for r, _ in pairs if r.curve})
    at = f" (update {', '.join(f'{step:,}' for step in best)})" if best else ""
    return (
        " The longer runs score exactly as the shorter ones: they retrace them (the schedule does "
        "not depend on the length) and their validation loss never improves on the best the "
        f"shorter runs reached{at}, whose checkpoint is tested in both."
    )


LOADED_SHARE = 0.85  # under this share of its threads' time on the CPU a run counts as slowed


def loaded_line(sides: Sequence[Side]) -> str | None:
    """A line counting the claim's runs (tuning, seeds, equal time) that other work on the
    machine slowed (their CPU share: process CPU seconds / (training seconds x threads)), None
    when every run with a share on record ran with the CPU to itself."""
    # the tuning runs are at seed 1, the verdict's at fresh seeds: no run is counted twice
    runs = [r for s in sides for _, r in s.grid if r is not None]
    runs += [r for s in sides for r in (*s.runs, *s.equal_time)]
    known = [r for r in runs if r.cpu_share is not None]
    slowed = [r.cpu_share for r in known if r.cpu_share < LOADED_SHARE]
    if not slowed:
        return None
    return (
        f"{len(slowed)} of the claim's {len(known)} runs with CPU time on record ran on a "
        f"loaded machine (CPU share {min(slowed):.2f}–{max(slowed):.2f}, under "
        f"{LOADED_SHARE:.2f}): their wall times are inflated (the tables give CPU seconds), "
        "their metrics are not."
    )


# the early stopping's patience, as the claims add it (+callbacks/early_stopping=default)
PLATEAU_VALIDATIONS: int = OmegaConf.load(
    STUDY_CONF.parent / "callbacks" / "early_stopping" / "default.yaml"
).patience


def stopping_line(sides: Sequence[Side]) -> str | None:
    """For models that train to a plateau: how many of the verdict's runs early stopping ended,
    and for those the update cap ended instead, how much their validation loss still fell over
    their last validations (what a higher cap could still give). None when no model stops early."""
    parts = []
    for side in sides:
        if not side.model.early_stopping or not side.runs:
            continue
        capped = [r for r in side.runs if r.updates >= side.model.length]
        text = (
            f"{side.model.name}: {len(side.runs) - len(capped)} of {len(side.runs)} runs "
            f"stopped early ({PLATEAU_VALIDATIONS} validations without a new best)"
        )
        falls = []
        for run in capped:
            values = [v for _, v in sorted(run.curve.items())]
            if len(values) > PLATEAU_VALIDATIONS:
                falls.append(values[-1 - PLATEAU_VALIDATIONS] - values[-1])
        if capped:
            text += f", {len(capped)} at the cap of {side.model.length:,} updates"
            if falls:
                text += (
                    f" (validation loss still falling by {min(falls):.3f}–{max(falls):.3f} over "
                    f"their last {PLATEAU_VALIDATIONS} validations)"
                )
        parts.append(text)
    return "Early stopping: " + "; ".join(parts) + "." if parts else None


# curves of one seed on two machines (or builds) agree to about this relative tolerance
RETRACE_TOLERANCE = 1e-3


def pause_note(side: Side) -> str:
    """A sentence for a model that stops early when its equal-time runs (same seeds, no early
    stopping, a schedule that does not depend on the length) retrace the early-stopped runs and
    then pass their best validation loss: those stops ended the runs at a pause, not a plateau.
    Empty otherwise."""
    if not side.model.early_stopping:
        return ""
    stopped = [
        (short, long)
        for short, long in zip(side.runs, side.equal_time)
        if short.curve
        and short.updates < side.model.length
        and all(
            step in long.curve and math.isclose(long.curve[step], v, rel_tol=RETRACE_TOLERANCE)
            for step, v in short.curve.items()
        )
    ]
    passed = []
    for short, long in stopped:
        best, stop = min(short.curve.values()), max(short.curve)
        first = next((n for n, v in sorted(long.curve.items()) if n > stop and v < best), None)
        if first is not None:
            passed.append((first, best, min(long.curve.values())))
    if not passed:
        return ""
    firsts = ", ".join(f"{step:,}" for step, _, _ in passed)
    falls = ", ".join(f"{best:.3f} → {low:.3f}" for _, best, low in passed)
    return (
        f" Early stopping ended {len(stopped)} of {side.model.name}'s runs before the cap; the "
        f"equal-time runs retrace them and pass their best validation loss in {len(passed)} "
        f"(first at update {firsts}; best {falls}): those stops were pauses of more than "
        f"{PLATEAU_VALIDATIONS} validations, not plateaus."
    )


def cost_line(runs: int, minutes: float, jobs: int) -> str:
    return (
        f"{runs} runs, {minutes:.0f} CPU-thread minutes: about {minutes / jobs:.0f} min "
        f"at {jobs} runs at a time"
    )


def recipe(run_dir: Path) -> str:
    """The run's recipe as its resolved config states it: warm-up, dropouts and early stopping
    (the rate and the updates are the table's own columns)."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return "—"
    cfg = OmegaConf.load(path)
    parts = []
    scheduler = OmegaConf.select(cfg, "task.scheduler") or {}
    warmup = [f"{v:g}" for k, v in scheduler.items() if "warmup" in k and "lr" not in k]
    parts.append(f"warm-up {warmup[0]}" if warmup else "no warm-up")
    model = OmegaConf.select(cfg, "model") or {}
    drops = [
        f"{k.removesuffix('dropout').rstrip('_') or 'dropout'} {v:g}"
        for k, v in model.items()
        if "dropout" in k and isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    if drops:
        parts.append(", ".join(drops))
    stopping = OmegaConf.select(cfg, "callbacks.early_stopping")
    parts.append(
        f"early stopping (patience {stopping.patience})" if stopping is not None else "fixed length"
    )
    return "; ".join(parts)


def grid_text(side: Side) -> str:
    """The runs the tuning looked at: rate and options, and their best validation loss."""
    entries = []
    for key, result in side.grid:
        tags = "".join(f" {stage}={option}" for stage, option in key.options)
        entries.append(f"{key.lr:g}{tags}: " + (f"{result.val_loss:.3f}" if result else "—"))
    return ", ".join(entries)


def holm_word(found: Verdict, kept: bool | None) -> str:
    """The verdict after Holm's correction: a decided verdict the family's correction does not
    keep becomes undecided; a measurement has none."""
    if kept is None or found.p is None:
        return "—" if kept is None else found.word
    return found.word if kept else UNDECIDED


def claim_section(
    claim: Claim,
    sides: list[Side],
    plot: str | None,
    cost: str | None = None,
    kept: bool | None = None,
    main: Outcome | None = None,
) -> tuple[str, str]:
    """The claim's Markdown section and its row of the summary table; ``cost`` is what the
    claim's runs take from scratch, ``kept`` whether Holm's correction over the family keeps its
    verdict (None: not in the family), ``main`` the comparison when already computed (the
    bootstrap is the costly part)."""
    metric = claim.metric
    seeds = len(sides[0].runs)
    lines = [f"## {claim.title}", "", f"**Claim** ({claim.source}): {claim.statement}", ""]
    if claim.kind == "not_worse":
        lines += [f"**Margin**: {claim.margin:g} {metric} ({claim.margin_source}).", ""]
    lines.append(
        f"| model | params | recipe | tuning at seed 1: best {SELECT_KEY} | lr | "
        f"{metric} (mean ± std, {seeds} seeds) | best {SELECT_KEY} | updates | "
        "training time (with validation; CPU seconds a thread where on record) | ms / update |"
    )
    lines.append("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for side in sides:
        # the best rate still at an edge of its grid (the chosen first-stage option's) after the
        # grid's extensions: a better one may lie beyond
        first = effective(side.model, side.tuned.options[:1])
        tried = [k.lr for k, r in side.grid if r is not None and k.options == first]
        edge = " (grid edge)" if tried and side.lr in (min(tried), max(tried)) else ""
        rows = [(side.model.name, side.runs, side.run_dirs)]
        if side.equal_time:
            unit = side.model.equal_key.split(".")[-1]
            rows.append(
                (
                    f"{side.model.name}, equal time ({unit} {side.equal_length})",
                    side.equal_time,
                    side.equal_dirs,
                )
            )
        for name, runs, dirs in rows:
            test = mean_std([r.metrics[metric] for r in runs])
            val = mean_std([r.val_loss for r in runs])
            updates = statistics.mean(r.updates for r in runs)
            fit = statistics.mean(r.training_s for r in runs)
            per = 1e3 * fit / updates if updates else float("nan")
            grid = grid_text(side) if runs is side.runs else "(same settings)"
            lines.append(
                f"| {name} | {runs[0].params:,} | {recipe(dirs[0])} | {grid} | "
                f"{side.lr:g}{edge} | {fmt(*test)} | {fmt(*val, 3)} | {updates:,.0f} | "
                f"{fit:,.0f} s | {per:.0f} |"
            )
    for extra in (stopping_line(sides), loaded_line(sides)):
        if extra:
            lines += ["", extra]
    a, b = sides
    d = digits_for(statistics.mean(r.metrics[metric] for r in a.runs))
    main = main or outcome(claim, a, b)
    better = "higher is better" if claim.higher_is_better else "lower is better"
    params = a.runs[0].params / b.runs[0].params - 1
    w = main.welch
    boot = (
        f"paired bootstrap over the test examples {interval_text(*main.bootstrap, d)}"
        if main.bootstrap
        else "no paired bootstrap (one stream of test text, not a sample of sentences)"
    )
    lines += [
        "",
        (
            f"**Verdict: {main.verdict.word}** (after Holm's correction over the claims: "
            f"{holm_word(main.verdict, kept)}). {a.model.name} − {b.model.name}, in the "
            f"{better} direction (positive: {a.model.name} better), over {seeds} fresh seeds: "
            f"Welch {LEVEL:.0%} interval {interval_text(w.difference, w.low, w.high, d)} "
            f"(df {w.dof:.1f}"
            + (f", p {main.verdict.p:.3f}" if main.verdict.p is not None else "")
            + f"); {boot}; parameters {params:+.1%}."
        ),
    ]
    faster = next((s for s in sides if s.equal_time), None)
    if faster is not None:
        other = b if faster is a else a
        eq = outcome(claim, a, b, equal_time=True)
        lines.append(
            f"At equal training time ({faster.model.name} given {other.model.name}'s): "
            f"{interval_text(eq.welch.difference, eq.welch.low, eq.welch.high, d)}: "
            f"{eq.verdict.word}." + same_best_note(faster, metric) + pause_note(faster)
        )
    if claim.would_change:
        lines += ["", f"**What would change this verdict.** {claim.would_change}"]
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
    boot_cell = interval_text(*main.bootstrap, d) if main.bootstrap else "—"
    row = (
        f"| {claim.title} | {claim.statement} | {a.model.name} {a_metric} vs "
        f"{b.model.name} {b_metric} {metric} ({seeds} seeds) | "
        f"{interval_text(w.difference, w.low, w.high, d)} | {boot_cell} | "
        f"{main.verdict.word} | {holm_word(main.verdict, kept)} | {per_update} |"
    )
    return "\n".join(lines), row


def mean_curve(runs: Sequence[RunResult]) -> tuple[list[float], list[tuple[float, float]]]:
    """The seeds' validation curves averaged point by point: (mean update, (mean, std)) of the
    k-th validation of every seed, whose update counts can differ (variable BPTT windows give
    each seed its own number of updates per epoch)."""
    curves = [sorted(r.curve.items()) for r in runs]
    count = min((len(c) for c in curves), default=0)
    steps = [statistics.mean(c[k][0] for c in curves) for k in range(count)]
    return steps, [mean_std([c[k][1] for c in curves]) for k in range(count)]


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
    seeds = len(sides[0].runs)
    axes.set_title(f"{claim.title}\nmean ± std over {seeds} seeds", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_report(study: Study, claims: Sequence[Claim], path: Path, command: str) -> str:
    """``docs/claims.md``: the summary table, then one section per claim with finished runs."""
    complete, pending = [], []
    for claim in claims:
        sides = collect(study, claim)
        (complete if sides is not None else pending).append((claim, sides))
    outcomes = {claim.name: outcome(claim, *sides) for claim, sides in complete}
    # Holm's correction over the family of the claims decided (measurements are not in it)
    p_values = {
        claim.name: outcomes[claim.name].verdict.p
        for claim, _ in complete
        if claim.kind != "report"
    }
    kept = holm(p_values)
    sections, rows, everything = [], [], []
    for claim, sides in complete:
        keys = claim_runs(study.out, claim, study.extend, study.extra_seeds)
        cost = None
        if keys is not None:
            everything += keys
            cost = cost_line(*compute_minutes(study.out, keys), study.jobs)
        plot = plot_curves(claim, sides, path.parent / f"claims_{claim.name}.png")
        section, row = claim_section(
            claim,
            sides,
            plot.name,
            cost,
            kept.get(claim.name) if claim.name in p_values else None,
            outcomes[claim.name],
        )
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
        "Generated by `" + command + "` from the runs under `" + shown(study.out) + "` (do not "
        "edit by hand)"
        + (
            f"; each run's metrics, validation curve, test outputs and recipe are kept in "
            f"`{shown(study.record)}`, so that a clone re-writes this page without running again"
            if study.record is not None
            else ""
        )
        + ". Each model runs its own recipe at equal parameters (within 1%). Its "
        f"settings are tuned at seed 1 on {SELECT_KEY}: the learning rate on a grid of factors of "
        "two (grown while the best is at an edge), crossed with a claim's first tuned setting, "
        "then any further setting at the best so far. The verdict uses fresh seeds, never the "
        "tuning seed: "
        + (
            "2, 3, 4, and 5 and 6 as well where three leave it undecided. "
            if study.extra_seeds
            else "2, 3 and 4 (run with `--no-extra-seeds`: seeds 5 and 6, which the study adds "
            "where three leave a verdict undecided, would exceed its budget). "
        )
        + "The faster model "
        "runs again at equal training time (judged on the runs' CPU seconds where they are on "
        "record: other work on the machine inflates wall times, hardly a lone thread's CPU "
        "time).",
        "",
        f"Statistics: Welch's {LEVEL:.0%} t interval on the difference of the means (positive: A "
        "better). A claim that A beats B holds when the interval lies above 0 and does not hold "
        "when it lies below; a claim that A is no worse holds when it lies above minus the "
        "claim's stated margin and does not hold when it lies below it; otherwise undecided. "
        "The paired bootstrap (1,000 resamples of the test sentences, the same for both "
        "models, each model's metric averaged over its seeds) shows the test set's own sampling "
        "noise for BLEU and accuracy. Holm's correction over the family of claims "
        f"(family-wise error {1 - LEVEL:.0%}) is reported beside the raw verdicts. Times are one "
        "PyTorch thread per run, two runs at a time on a 2-core CPU." + total,
        "",
        f"| claim | statement | ours (mean ± std) | Welch {LEVEL:.0%} interval (A − B) | "
        "bootstrap interval | verdict | after Holm | ms / update (A vs B, CPU) |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *sections,
    ]
    if pending:
        text += ["## Not yet measured", ""]
        text += [f"- {c.title}: `python study.py {c.name}`" for c, _ in pending]
        text.append("")
    out = "\n".join(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out)
    return out
