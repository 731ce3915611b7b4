"""study.py: the learning-rate grid grows at its edges, tuned stages cross it or follow it, the
chosen settings run at fresh seeds (more where the verdict is undecided), the faster model runs
again at equal time, the statistics (Welch, margins, Holm) are right, and the report's verdicts
follow the numbers.

The runs are simulated (a runner that writes what ``train.py`` writes: ``metrics.json`` and the CSV
log); one real ``train.py`` run checks the command line the study builds."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from src.commands.study.claims import Claim, ModelSpec, TuneStage, load_claim, load_claims
from src.commands.study.plan import plan
from src.commands.study.record import keep, keep_all, restore
from src.commands.study.report import (
    Side,
    claim_section,
    collect,
    cost_line,
    fmt,
    loaded_line,
    mean_curve,
    recipe,
    stopping_line,
    write_report,
)
from src.commands.study.runner import (
    RunKey,
    RunResult,
    Study,
    Tuned,
    claim_runs,
    compute_minutes,
    due_runs,
    multirun_commands,
    read_run,
    subprocess_runner,
)
from src.commands.study.stats import decide, holm, welch

ROOT = Path(__file__).resolve().parents[1]


def spec(name: str, lrs=(1e-3, 2e-3, 4e-3), length: int = 10) -> ModelSpec:
    return ModelSpec(name, (f"experiment={name}",), tuple(lrs), "trainer.max_epochs", length)


def claim(kind: str = "better", higher: bool = True, a=None, b=None, margin=0.0) -> Claim:
    return Claim(
        name="toy",
        title="A vs B",
        statement="A beats B",
        source="test",
        metric="test/score",
        higher_is_better=higher,
        kind=kind,
        models=(a or spec("A"), b or spec("B")),
        seeds=(2, 3, 4),
        lr_key="task.optimizer.lr",
        margin=margin,
        would_change="More data.",
    )


def write_run(
    run_dir: Path,
    val_loss: float,
    score: float,
    fit_time: float,
    updates: int,
    fit_cpu: float | None = None,
) -> None:
    """What train.py leaves in a finished run directory (one thread; the CPU seconds when
    ``fit_cpu`` is given)."""
    (run_dir / "csv" / "version_0").mkdir(parents=True, exist_ok=True)
    with (run_dir / "csv" / "version_0" / "metrics.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["step", "epoch", "val/loss"])
        writer.writeheader()
        for step, value in ((updates // 2 - 1, val_loss + 0.5), (updates - 1, val_loss)):
            writer.writerow({"step": step, "epoch": 0, "val/loss": value})
    summary = {
        "status": "finished",
        "metrics": {"val/loss": val_loss, "test/score": score},
        "params": 1000,
        "wall_time_s": fit_time + 5,
        "fit_time_s": fit_time,
        "updates": updates,
        "threads": 1,
    }
    if fit_cpu is not None:
        summary["fit_cpu_s"] = fit_cpu
    (run_dir / "metrics.json").write_text(json.dumps(summary))


def tiny_charlm() -> ModelSpec:
    """A one-layer character LM of 8 updates, validated at steps 4 and 8: real runs in seconds."""
    return ModelSpec(
        "charlm",
        (
            "experiment=char_lm/demo",
            "trainer.val_check_interval=4",
            "trainer.limit_val_batches=2",
            "trainer.limit_test_batches=2",
            "model.n_layer=1",
            "model.d_model=32",
            "model.d_inner=64",
            "logger=csv",
        ),
        (1e-3, 2e-3, 4e-3),
        "trainer.max_steps",
        8,
    )


class FakeRunner:
    """Model A's validation loss is lowest at lr 8e-3 (beyond its first grid), B's at 2e-3; A
    scores ``gap`` points higher; A takes twice B's time per update. Seeds spread the scores by
    0.1 a seed (B's in the other order where ``gap`` is small, so the verdict is undecided)."""

    def __init__(self, gap: float = 2.0) -> None:
        self.gap = gap
        self.calls: list[tuple[str, float, int, int]] = []
        self.keys: list[RunKey] = []
        self.prepared: list[str] = []

    def __call__(self, claim: Claim, key: RunKey, run_dir: Path, extra=()) -> None:
        if extra:  # the data preparation
            self.prepared.append(key.model.name)
            return
        self.calls.append((key.model.name, key.lr, key.seed, key.length))
        self.keys.append(key)
        best = 8e-3 if key.model.name == "A" else 2e-3
        val = 1.0 + abs(math.log2(key.lr / best)) * 0.1
        spread = 0.1 * key.seed if key.model.name == "A" or self.gap > 1 else 0.1 * (7 - key.seed)
        base = 10.0 + (self.gap if key.model.name == "A" else 0.0)
        score = base + spread + 0.01 * key.length
        per_update = 2.0 if key.model.name == "A" else 1.0
        write_run(run_dir, val, score, per_update * 10 * key.length, 10 * key.length)


def test_the_grid_grows_until_the_best_rate_is_inside(tmp_path: Path) -> None:
    runner = FakeRunner()
    toy = claim()
    tuned = Study(tmp_path, runner).tune(toy)
    # A's best (8e-3) was beyond the edge: the grid grew to 8e-3 and then to 1.6e-2
    assert [k.lr for k in tuned["A"].tried] == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    assert [k.lr for k in tuned["B"].tried] == [1e-3, 2e-3, 4e-3]
    assert (tuned["A"].lr, tuned["B"].lr) == (8e-3, 2e-3)
    # only seed 1 in the grid, each run once
    assert {c[2] for c in runner.calls} == {1}
    assert len(runner.calls) == len(set(runner.calls)) == 8


def test_the_grid_stops_after_its_extensions(tmp_path: Path) -> None:
    runner = FakeRunner()
    tuned = Study(tmp_path, runner, extend=1).tune(claim())
    assert [k.lr for k in tuned["A"].tried] == [1e-3, 2e-3, 4e-3, 8e-3]


def test_a_claim_runs_fresh_seeds_at_the_chosen_rate_and_the_faster_model_at_equal_time(
    tmp_path: Path,
) -> None:
    runner = FakeRunner()
    toy = claim()
    decided = Study(tmp_path, runner).run_claim(toy)
    seeds = {(name, lr, seed) for name, lr, seed, length in runner.calls if length == 10}
    assert {("A", 8e-3, s) for s in (2, 3, 4)} <= seeds
    assert {("B", 2e-3, s) for s in (2, 3, 4)} <= seeds
    # seed 1 tuned the rates; the verdict's seeds are fresh, and three decide it (no 5, 6)
    assert ("A", 8e-3, 1) in seeds and not any(s in (5, 6) for _, _, s in seeds)
    assert decided.seeds == (2, 3, 4)
    # B trains twice as fast per update: it runs again, twice as long, at its rate and every seed
    longer = sorted(
        (name, lr, seed, length) for name, lr, seed, length in runner.calls if length != 10
    )
    assert longer == [("B", 2e-3, 2, 20), ("B", 2e-3, 3, 20), ("B", 2e-3, 4, 20)]
    # each model's data was prepared once, first; resuming runs nothing again
    assert runner.prepared == ["A", "B"]
    before = len(runner.calls)
    Study(tmp_path, runner).run_claim(toy)
    assert len(runner.calls) == before and runner.prepared == ["A", "B"]


class LoadedRunner(FakeRunner):
    """As FakeRunner (A takes 2 CPU seconds an update, B 1), but other work on the machine
    slowed B's runs at the verdict's seeds to a third of the CPU: 3 wall seconds an update."""

    def __init__(self, cpu_on_record: bool) -> None:
        super().__init__()
        self.cpu_on_record = cpu_on_record

    def __call__(self, claim: Claim, key: RunKey, run_dir: Path, extra=()) -> None:
        super().__call__(claim, key, run_dir, extra)
        if extra:
            return
        summary = json.loads((run_dir / "metrics.json").read_text())
        cpu = summary["fit_time_s"]
        if key.model.name == "B" and key.seed != 1:
            summary["fit_time_s"] = 3 * cpu
        if self.cpu_on_record:
            summary["fit_cpu_s"] = cpu
        (run_dir / "metrics.json").write_text(json.dumps(summary))


@pytest.mark.parametrize("cpu_on_record", [True, False])
def test_equal_time_is_judged_on_cpu_seconds_when_other_work_slowed_the_runs(
    tmp_path: Path, cpu_on_record: bool
) -> None:
    decided = Study(tmp_path, LoadedRunner(cpu_on_record)).run_claim(claim())
    assert decided.equal is not None
    fast, length = decided.equal
    if cpu_on_record:
        # B is the faster model per CPU second (1 against 2): twice A's 10 epochs
        assert (fast.name, length) == ("B", 20)
    else:
        # wall seconds alone: B's slowed runs (3 s an update) make A look faster by 1.5x
        assert (fast.name, length) == ("A", 15)
    sides = collect(Study(tmp_path, LoadedRunner(cpu_on_record)), claim())
    assert sides is not None
    line = loaded_line(sides)
    if cpu_on_record:
        # B's three seeds and its three equal-time runs had a third of the CPU; none of A's
        assert line is not None and line.startswith("6 of the claim's 17 runs")
        assert "CPU share 0.33–0.33" in line
        section, row = claim_section(claim(), sides, None)
        assert line in section
        # times and ms / update from CPU seconds: B's 1 s an update, not its slowed 3 wall s
        assert row.endswith("| 2000 vs 1000 |") and "| 3000 |" not in section
    else:
        assert line is None


def test_the_report_has_the_numbers_and_the_verdicts(tmp_path: Path) -> None:
    runner = FakeRunner()
    toy = claim()
    experiment = Study(tmp_path / "runs", runner)
    experiment.run_claim(toy)
    sides = collect(experiment, toy)
    assert sides is not None
    a, b = sides
    assert (a.lr, b.lr) == (8e-3, 2e-3)
    assert [r.metrics["test/score"] for r in a.runs] == pytest.approx([12.3, 12.4, 12.5])
    assert b.equal_length == 20 and len(b.equal_time) == 3
    section, row = claim_section(toy, sides, None, kept=True)
    # A - B = 2.0 with a std of 0.1 each: Welch's interval 2 +- t(0.975, 4) * 0.0816 = +-0.227
    assert "**Verdict: holds** (after Holm's correction over the claims: holds)" in section
    assert "Welch 95% interval +2.00 [+1.77, +2.23] (df 4.0, p 0.000)" in section
    assert "12.40 ± 0.10" in section and "10.40 ± 0.10" in section
    # small metrics (bpc, accuracy) keep a third decimal: their differences are hundredths
    assert fmt(1.6789, 0.0123) == "1.679 ± 0.012" and fmt(87.704, 1.13) == "87.70 ± 1.13"
    # B at equal time scores 0.1 more (10 more epochs x 0.01): A - B = +1.90
    assert "A given B's" not in section and "+1.90 [+1.67, +2.13]: holds." in section
    assert "| 0.008 |" in section and "| 0.002 |" in section  # both inside their grids
    assert "grid edge" not in section
    assert "**What would change this verdict.** More data." in section
    # no per-example outputs in the fake runs: no bootstrap interval
    assert "no paired bootstrap" in section
    assert (
        "| 2000 |" in section and "| 1000 |" in section
    )  # ms per update: A 2 s, B 1 s in the fake
    assert row.startswith("| A vs B |") and "| holds | holds |" in row
    # a verdict Holm's correction does not keep reads undecided beside the raw one
    _, dropped = claim_section(toy, sides, None, kept=False)
    assert "| holds | undecided |" in dropped
    noted, _ = claim_section(dataclasses.replace(toy, notes="**Checked.** Parity."), sides, None)
    assert "**Checked.** Parity." in noted
    assert "**Checked.** Parity." not in section


class OutputsRunner(FakeRunner):
    """As FakeRunner, and each run leaves its per-example test results: 200 test texts, A right on
    160 of them and B on 120 (the same texts for every seed)."""

    def __call__(self, claim: Claim, key: RunKey, run_dir: Path, extra=()) -> None:
        super().__call__(claim, key, run_dir, extra)
        if extra:
            return
        right = 160 if key.model.name == "A" else 120
        labels = [i % 3 for i in range(200)]
        predictions = [label if i < right else (label + 1) % 3 for i, label in enumerate(labels)]
        outputs = {"kind": "classification", "ids": list(range(200)), "labels": labels,
                   "predictions": predictions}  # fmt: skip
        (run_dir / "test_outputs.json").write_text(json.dumps(outputs))


def test_the_report_gives_the_paired_bootstrap_where_runs_kept_their_test_outputs(
    tmp_path: Path,
) -> None:
    toy = claim()
    experiment = Study(tmp_path, OutputsRunner())
    experiment.run_claim(toy)
    section, row = claim_section(toy, collect(experiment, toy), None, kept=True)
    # accuracy 0.8 against 0.6 on every seed: +0.2, the interval about +-2 standard errors of a
    # paired difference of 200 texts (sqrt(0.2 * 0.8 / 200) ~ 0.028)
    found = section.split("paired bootstrap over the test examples ", 1)[1].split(";")[0]
    difference, low, high = (
        float(v) for v in found.replace("[", "").replace("]", "").replace(",", "").split()
    )
    assert difference == pytest.approx(0.2)
    assert 0.13 < low < 0.2 < high < 0.27
    assert f"| {found} |" in row


def test_the_record_lets_a_fresh_clone_resume_and_write_the_same_report(tmp_path: Path) -> None:
    """Every finished run is kept in the record (its validation rows only, kilobytes); a study in
    an empty folder restored from it runs nothing again and reports the same numbers."""
    toy = claim()
    first = Study(tmp_path / "logs", OutputsRunner(), record=tmp_path / "record")
    first.run_claim(toy)
    kept = sorted((tmp_path / "record").glob("runs/**/metrics.json"))
    assert len(kept) == len(set(first.runner.keys))
    # a CSV log with training rows: the record keeps the validation rows and columns only
    log = next((tmp_path / "logs").glob("runs/**/csv/version_0/metrics.csv"))
    run_dir = log.parents[2]
    with log.open("a") as file:
        file.write("99,0,\n")  # a training row: no validation
    keep(run_dir, tmp_path / "logs", tmp_path / "record")
    copied = (
        tmp_path / "record" / run_dir.relative_to(tmp_path / "logs") / "csv/version_0/metrics.csv"
    )
    assert copied.read_text().splitlines()[0] == "step,epoch,val/loss"
    assert len(copied.read_text().splitlines()) == 3  # the header and two validations
    # a fresh clone: nothing in logs/, the record restored
    fresh = tmp_path / "clone"
    assert restore(tmp_path / "record", fresh) == len(kept)
    assert restore(tmp_path / "record", fresh) == 0  # a finished run is never overwritten
    runner = OutputsRunner()
    again = Study(fresh, runner)
    again.run_claim(toy)
    assert runner.calls == []
    before, _ = claim_section(toy, collect(first, toy), None, kept=True)
    after, _ = claim_section(toy, collect(again, toy), None, kept=True)
    assert after == before.replace(str(tmp_path / "logs"), str(fresh))
    assert "paired bootstrap over the test examples +0.20" in after
    # nor is the data-preparing run
    preparing = tmp_path / "logs" / "runs" / "m" / "prepare"
    preparing.mkdir(parents=True)
    (preparing / "metrics.json").write_text(json.dumps({"status": "finished"}))
    assert keep_all(tmp_path / "logs", tmp_path / "record") == 0
    # an unfinished run is neither kept nor restored
    (run_dir / "metrics.json").write_text(json.dumps({"status": "running"}))
    assert keep(run_dir, tmp_path / "logs", tmp_path / "elsewhere") is None
    assert keep_all(tmp_path / "logs", tmp_path / "elsewhere") == len(kept) - 1


@pytest.mark.parametrize(
    ("kind", "higher", "margin", "a", "b", "expected"),
    [
        ("better", True, 0.0, [10.0, 10.2, 10.4], [10.1, 10.3, 10.2], "undecided"),
        # no worse by more than 0.3: the interval (-0.41, +0.41) reaches below -0.3
        ("not_worse", True, 0.3, [10.0, 10.2, 10.4], [10.1, 10.3, 10.2], "undecided"),
        ("not_worse", True, 1.0, [10.0, 10.2, 10.4], [10.1, 10.3, 10.2], "holds"),
        ("better", True, 0.0, [9.0, 9.1, 9.2], [10.0, 10.1, 10.2], "does not hold"),
        ("not_worse", True, 0.5, [9.0, 9.1, 9.2], [10.0, 10.1, 10.2], "does not hold"),
        # lower is better (perplexity): A's lower values win
        ("better", False, 0.0, [50.0, 50.5, 51.0], [60.0, 60.5, 61.0], "holds"),
        ("better", False, 0.0, [60.0, 60.5, 61.0], [50.0, 50.5, 51.0], "does not hold"),
        ("report", True, 0.0, [60.0, 60.5, 61.0], [50.0, 50.5, 51.0], "A better"),
        ("report", True, 0.0, [10.0, 10.2, 10.4], [10.1, 10.3, 10.2], "within noise"),
    ],
)
def test_verdict(
    kind: str, higher: bool, margin: float, a: list[float], b: list[float], expected: str
) -> None:
    interval = welch(a, b, higher_is_better=higher)
    found = decide(kind, interval, margin)
    assert found.word == expected
    sign = 1 if higher else -1
    assert interval.difference == pytest.approx(sign * (sum(a) - sum(b)) / 3)
    assert interval.low < interval.difference < interval.high
    assert (found.p is None) == (expected in ("undecided", "A better", "within noise"))


def test_welch_matches_scipys_test_and_a_hand_computed_interval() -> None:
    from scipy import stats as scipy_stats

    a, b = [1.0, 2.0, 4.0, 3.5], [0.5, 0.7, 0.9]
    interval = welch(a, b, higher_is_better=True)
    va, vb = 1.8958333333 / 4, 0.04 / 3  # the sample variances over n
    assert interval.standard_error == pytest.approx(math.sqrt(va + vb))
    assert interval.dof == pytest.approx((va + vb) ** 2 / (va**2 / 3 + vb**2 / 2))
    expected_p = scipy_stats.ttest_ind(a, b, equal_var=False).pvalue
    assert interval.p_value() == pytest.approx(expected_p)
    t = scipy_stats.t.ppf(0.975, interval.dof)
    assert interval.low == pytest.approx(interval.difference - t * interval.standard_error)
    # lower is better flips the sign, not the width
    flipped = welch(a, b, higher_is_better=False)
    assert flipped.difference == pytest.approx(-interval.difference)
    assert flipped.high - flipped.low == pytest.approx(interval.high - interval.low)
    with pytest.raises(ValueError, match="two values a side"):
        welch([1.0], b, higher_is_better=True)


def test_a_noisy_baseline_does_not_make_no_worse_easy() -> None:
    """The old rule called "no worse" held whenever the difference was within noise: the noisier
    B, the easier. With a margin a noisier B widens the interval and leaves it undecided."""
    a = [10.0, 10.1, 10.2]
    quiet = welch(a, [10.1, 10.2, 10.3], higher_is_better=True)
    noisy = welch(a, [8.0, 10.2, 12.4], higher_is_better=True)
    # quiet: -0.1 [-0.33, +0.13]; noisy: -0.1 [-5.6, +5.4]
    assert decide("not_worse", quiet, 0.4).word == "holds"
    assert decide("not_worse", noisy, 0.4).word == "undecided"


def test_holm_keeps_what_survives_the_step_down() -> None:
    # family of four: 0.01 <= 0.05/4, 0.012 <= 0.05/3, 0.03 > 0.05/2 stops; 0.04 is not reached
    kept = holm({"a": 0.03, "b": 0.01, "c": 0.012, "d": 0.04, "e": None})
    assert kept == {"a": False, "b": True, "c": True, "d": False, "e": False}
    assert holm({"a": 0.04}) == {"a": True}
    assert holm({}) == {}


def test_an_undecided_verdict_runs_two_more_seeds(tmp_path: Path) -> None:
    runner = FakeRunner(gap=0.05)
    decided = Study(tmp_path, runner).run_claim(claim())
    assert decided.seeds == (2, 3, 4, 5, 6)
    seeds = {(name, seed) for name, _, seed, length in runner.calls if length == 10}
    assert {(m, s) for m in "AB" for s in (2, 3, 4, 5, 6)} <= seeds
    # not where the study is told not to
    other = FakeRunner(gap=0.05)
    assert Study(tmp_path / "b", other, extra_seeds=False).run_claim(claim()).seeds == (2, 3, 4)
    assert not any(seed in (5, 6) for _, _, seed, _ in other.calls)


def tuned_spec(name: str) -> ModelSpec:
    """A model whose warm-up is crossed with the rates and whose dropout is tried after."""
    warmup = TuneStage("warm-up", (("short", ("task.scheduler.warmup_steps=10",)), ("recipe", ())))
    dropout = TuneStage(
        "dropout",
        (("0.1", ("model.dropout=0.1",)), ("0.2", ()), ("0.4", ("model.dropout=0.4",))),
    )
    return dataclasses.replace(spec(name), tune=(warmup, dropout))


class TunedRunner(FakeRunner):
    """As FakeRunner; the short warm-up and dropout 0.4 lower the validation loss."""

    def __call__(self, claim: Claim, key: RunKey, run_dir: Path, extra=()) -> None:
        super().__call__(claim, key, run_dir, extra)
        if extra:
            return
        summary = json.loads((run_dir / "metrics.json").read_text())
        options = dict(key.options)
        bonus = 0.05 * (options.get("warm-up") == "short") + 0.02 * (
            options.get("dropout") == "0.4"
        )
        summary["metrics"]["val/loss"] -= bonus
        (run_dir / "metrics.json").write_text(json.dumps(summary))


def test_tuned_stages_cross_the_rates_then_follow_the_best(tmp_path: Path) -> None:
    runner = TunedRunner()
    model = tuned_spec("A")
    toy = claim(a=model)
    tuned = Study(tmp_path, runner).tune(toy)["A"]
    assert tuned.lr == 8e-3
    assert tuned.options == (("warm-up", "short"), ("dropout", "0.4"))
    grid = [(k.lr, k.options) for k in tuned.tried]
    # both warm-ups over the grown rate grid, then the other two dropouts at the best: the
    # experiment's own dropout (0.2) is the best run already, not a run again
    short, recipe_ = (("warm-up", "short"),), ()
    rates = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    assert grid[:10] == [(lr, short) for lr in rates] + [(lr, recipe_) for lr in rates]
    assert grid[10:] == [
        (8e-3, (("warm-up", "short"), ("dropout", "0.1"))),
        (8e-3, (("warm-up", "short"), ("dropout", "0.4"))),
    ]
    a_calls = [k for k in runner.keys if k.model.name == "A"]
    assert len(a_calls) == len(set(a_calls)) == 12
    best = tuned.key(model, 2)
    assert best.label == "lr0.008_s2_warm-up-short_dropout-0.4"
    command = best.command(toy, tmp_path)
    assert "task.scheduler.warmup_steps=10" in command and "model.dropout=0.4" in command


def test_a_model_that_stops_early_gets_the_updates_of_the_slower_ones_time(
    tmp_path: Path,
) -> None:
    b = dataclasses.replace(
        spec("B"),
        length_key="trainer.max_steps",
        length=1000,
        early_stopping=True,
        equal_time_overrides=("~callbacks.early_stopping",),
    )
    toy = claim(b=b)
    runner = FakeRunner()
    decided = Study(tmp_path, runner).run_claim(toy)
    # A: 100 updates in 200 s; B: 10,000 in 10,000 s. A is faster: as before, its length (10
    # epochs) times the ratio of the times (50)
    fast, length = decided.equal
    assert fast.name == "A" and length == 500
    # the other way round: A takes 40,000 s, and B (stopping early) is given the updates it makes
    # in that time: 10,000 updates x 4
    slow_a = dataclasses.replace(spec("A"), length=2000)
    decided = Study(tmp_path / "2", FakeRunner()).run_claim(claim(a=slow_a, b=b))
    fast, length = decided.equal
    assert fast.name == "B" and length == 40000
    key = decided.tuned["B"].key(b, 2, length)
    assert key.equal_time and "~callbacks.early_stopping" in key.command(toy, tmp_path)


def test_a_run_of_one_epoch_gets_its_equal_time_in_updates(tmp_path: Path) -> None:
    """One epoch a run: a time ratio of 1.3 is 1.3x the updates, not two epochs."""
    a = dataclasses.replace(spec("A", length=1), equal_time_key="trainer.max_steps")
    b = dataclasses.replace(spec("B"), length=2)
    # A: 10 updates (one epoch) in 20 s; B: 20 updates in 20 s, plus 6 s that FakeRunner does
    # not know of: the ratio is 26 / 20 = 1.3
    runner = FakeRunner()
    toy = claim(a=a, b=b)
    study = Study(tmp_path, runner)
    found = study.tune(toy)

    class Slower(FakeRunner):
        def __call__(self, claim, key, run_dir, extra=()):
            super().__call__(claim, key, run_dir, extra)
            if key.model.name == "B" and not extra:
                summary = json.loads((run_dir / "metrics.json").read_text())
                summary["fit_time_s"] += 6
                (run_dir / "metrics.json").write_text(json.dumps(summary))

    study = Study(tmp_path, Slower())
    study.ensure(toy, study.seed_keys(b, found["B"], (2, 3, 4)))
    study.ensure(toy, study.seed_keys(a, found["A"], (2, 3, 4)))
    fast, length = study.equal_time_length(toy, found, (2, 3, 4))
    assert fast.name == "A" and length == 13  # 10 updates x 1.3
    command = found["A"].key(a, 2, length).command(toy, tmp_path)
    assert "trainer.max_steps=13" in command
    assert not any(c.startswith("trainer.max_epochs=") for c in command)
    # a model's own runs keep their length in epochs
    assert "trainer.max_epochs=1" in found["A"].key(a, 2).command(toy, tmp_path)
    # without equal_time_key, the same ratio rounds up to a whole second epoch (2x the time)
    epochs = spec("A", length=1)
    assert study.equal_time_length(claim(a=epochs, b=b), found, (2, 3, 4)) == (epochs, 2)


def test_the_plan_counts_runs_and_hours_before_anything_runs(tmp_path: Path) -> None:
    a = dataclasses.replace(tuned_spec("A"), estimate_minutes=3.0)
    b = dataclasses.replace(spec("B"), estimate_minutes=1.5)
    text = plan(tmp_path, [claim(a=a, b=b)])
    # A: 2 warm-ups x (3 to 5 rates) + dropout 2 to 3 + 3 to 5 seeds; B: 3 to 5 rates + 3 to 5
    # the next decision waits for the first grid (the short warm-up's three rates)
    assert "A: 11-18 x 3.0 min = 33-54; 0 finished; 3 due next" in text
    assert "B: 6-10 x 1.5 min = 9-15; 0 finished; 3 due next" in text
    assert "equal time: 0-5 x 3.0 min = 0-15" in text
    assert text.splitlines()[-1].startswith("total: 0.7-1.4 CPU-thread hours")
    # measured run times replace the estimates once runs have finished
    Study(tmp_path, FakeRunner()).run_claim(claim(a=spec("A"), b=spec("B")))
    measured = plan(tmp_path, [claim()])
    assert "A: 6-10 x 0.0 min" not in measured and "finished; 0 due next" in measured


def test_a_runs_recipe_comes_from_its_resolved_config(tmp_path: Path) -> None:
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(
        "task:\n  scheduler:\n    warmup_steps: 1080\n    warmup_init_lr: 1.0e-07\n"
        "model:\n  dropout: 0.08\n  attention_dropout: 0.03\n  shuffle: true\n"
        "callbacks:\n  early_stopping:\n    patience: 4\n"
    )
    assert recipe(tmp_path) == (
        "warm-up 1080; dropout 0.08, attention 0.03; early stopping (patience 4)"
    )
    assert recipe(tmp_path / "none") == "—"


def test_every_claim_config_loads_and_names_two_models_with_three_rates() -> None:
    claims = load_claims()
    assert claims, "conf/study/ has no claims"
    for found in claims:
        assert found.seeds == (2, 3, 4) and 1 not in found.extra_seeds
        assert found.kind != "not_worse" or (found.margin > 0 and found.margin_source)
        assert found.would_change, f"{found.name}: what would change its verdict?"
        for model in found.models:
            assert len(model.lrs) >= 3
            # a factor of two apart, as the grid grows
            assert all(b / a == pytest.approx(2.0) for a, b in zip(model.lrs, model.lrs[1:]))
            assert any(o.startswith("experiment=") for o in model.overrides)


def test_a_bad_claim_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "title: x\nstatement: y\nsource: z\nmetric: m\nhigher_is_better: true\n"
        "kind: maybe\nmodels: []\n"
    )
    with pytest.raises(ValueError, match="kind must be better, not_worse or report"):
        load_claim(path)
    with pytest.raises(SystemExit, match="unknown claim"):
        load_claims(["no_such_claim"])
    good = (
        "title: x\nstatement: y\nsource: z\nmetric: m\nhigher_is_better: true\n"
        "models:\n" + "  - {name: a, overrides: [experiment=a], lrs: [1, 2, 4], "
        "length_key: trainer.max_epochs, length: 3}\n" * 2
    )
    path.write_text(good + "kind: not_worse\n")
    with pytest.raises(ValueError, match="states its margin"):
        load_claim(path)
    path.write_text(good + "kind: better\nseeds: [1, 2, 3]\n")
    with pytest.raises(ValueError, match="fresh"):
        load_claim(path)
    path.write_text(good + "kind: better\n")
    assert load_claim(path).seeds == (2, 3, 4)
    path.write_text(
        good.replace("length: 3}", "length: 3, equal_time_key: seed}") + "kind: better\n"
    )
    with pytest.raises(ValueError, match="equal_time_key must be trainer.max_steps"):
        load_claim(path)


def test_a_real_run_through_the_study_command_line(tmp_path: Path) -> None:
    """The study's train.py command runs and its metrics.json has what the report reads."""
    model = tiny_charlm()
    toy = Claim(
        "tiny",
        "t",
        "s",
        "src",
        "test/bpc",
        False,
        "better",
        (model, model),
        (2, 3, 4),
        "task.optimizer.lr",
    )
    key = RunKey(model, 2e-3, 1, 8)
    run_dir = key.run_dir(tmp_path)
    env_threads = os.environ.get("OMP_NUM_THREADS")
    subprocess_runner(1)(toy, key, run_dir, ())
    assert os.environ.get("OMP_NUM_THREADS") == env_threads
    result = read_run(run_dir)
    assert result is not None
    assert result.updates == 8
    assert 0 < result.fit_time_s
    # the run's CPU seconds and threads are on record: its CPU share is known
    assert result.threads == 1 and result.fit_cpu_s is not None and 0 < result.fit_cpu_s
    assert result.cpu_share is not None and result.cpu_share > 0
    assert set(result.curve) == {4, 8}  # val/loss at steps 4 and 8
    assert math.isfinite(result.val_loss) and result.metrics["test/bpc"] > 0
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "lr: 0.002" in config and "seed: 1" in config


def test_the_study_help_lists_every_claim_and_explains_every_option() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "study.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listed = out.split("claims (conf/study/<name>.yaml):\n", 1)[1].splitlines()
    names = sorted(path.stem for path in (ROOT / "conf" / "study").glob("*.yaml"))
    assert [line.split()[0] for line in listed] == names
    assert "  charlm  " in out and "Group-Transformer G = 2 vs Transformer-XL (pydoc chars)" in out
    options = out.split("options:\n", 1)[1].split("\n\n", 1)[0]
    for option in ("--out OUT", "--jobs JOBS", "--threads THREADS", "--extend EXTEND", "--report",
                   "--multirun", "--doc DOC", "--plan", "--no-extra-seeds"):  # fmt: skip
        line = next(line for line in options.splitlines() if line.strip().startswith(option))
        assert len(line.split(option, 1)[1].strip()) > 10, f"{option} is not explained: {line!r}"


def test_claims_that_compare_the_same_model_share_its_runs(tmp_path: Path) -> None:
    runner = FakeRunner()
    experiment = Study(tmp_path, runner)
    experiment.run_claim(claim())
    a_runs = [c for c in runner.calls if c[0] == "A"]
    first = len(runner.calls)
    other = Claim(
        "toy2",
        "A vs C",
        "s",
        "test",
        "test/score",
        True,
        "better",
        (spec("A"), spec("C")),
        (2, 3, 4),
        "task.optimizer.lr",
    )
    experiment.run_claim(other)
    # A's grid and seeds ran once; only C's runs (and C's equal-time runs) are new
    assert [c for c in runner.calls if c[0] == "A"] == a_runs
    assert {c[0] for c in runner.calls[first:]} == {"C"}
    assert collect(experiment, other) is not None


def test_every_claims_models_compose_with_the_keys_the_study_sets() -> None:
    from omegaconf import OmegaConf

    from tests.conftest import compose_config

    for found in load_claims():
        for model in found.models:
            cfg = compose_config("train", model.overrides)
            assert (
                OmegaConf.select(cfg, found.lr_key) in model.lrs
                or OmegaConf.select(cfg, found.lr_key) > 0
            )
            assert OmegaConf.select(cfg, model.length_key) is not None, (found.name, model.name)
            # the claim's length is the experiment's own, unless the claim says why it differs
            assert model.length > 0
            # every tuned option and the equal-time overrides compose, and change what they say
            for stage in model.tune:
                for option, overrides in stage.options:
                    tuned = compose_config("train", [*model.overrides, *overrides])
                    for override in overrides:
                        key, value = override.split("=", 1)
                        assert str(OmegaConf.select(tuned, key)) == value, (stage.name, option)
            if model.early_stopping:
                assert OmegaConf.select(cfg, "callbacks.early_stopping") is not None
                longer = compose_config("train", [*model.overrides, *model.equal_time_overrides])
                assert OmegaConf.select(longer, "callbacks.early_stopping") is None


def test_a_rate_still_at_the_grids_edge_is_flagged(tmp_path: Path) -> None:
    runner = FakeRunner()
    toy = claim()
    experiment = Study(tmp_path, runner, extend=1)  # A's grid stops at 8e-3, its best
    experiment.run_claim(toy)
    section, _ = claim_section(toy, collect(experiment, toy), None)
    assert "| 0.008 (grid edge) |" in section
    assert "| 0.002 |" in section


def test_the_cost_from_scratch_replays_the_claims_decisions(tmp_path: Path) -> None:
    runner = FakeRunner()
    toy = claim()
    Study(tmp_path, runner).run_claim(toy)
    # a run outside the claim's decisions (an earlier, wider grid) is not counted
    write_run(RunKey(toy.b, 6.4e-2, 1, 10).run_dir(tmp_path), 9.0, 0.0, 1000.0, 100)
    keys = claim_runs(tmp_path, toy)
    assert keys is not None
    ran = {(n, lr, seed, length) for n, lr, seed, length in runner.calls}
    assert {(k.model.name, k.lr, k.seed, k.length) for k in keys} == ran
    runs, minutes = compute_minutes(tmp_path, keys)
    # A: 5 grid rates + 3 seeds, 200 s + 5 each;
    # B: 3 rates + 3 seeds at 100 s, 3 at equal time 200 s
    assert runs == len(ran) == 8 + 6 + 3
    assert minutes == pytest.approx((8 * 205 + 6 * 105 + 3 * 205) / 60)
    assert "17 runs" in cost_line(runs, minutes, 2)
    # a missing run: no cost yet, and nothing is run to find it
    (RunKey(toy.a, 8e-3, 2, 10).run_dir(tmp_path) / "metrics.json").unlink()
    assert claim_runs(tmp_path, toy) is None
    assert len(runner.calls) == len(ran)


def overlap_counting(fake: FakeRunner) -> tuple[Callable[..., None], list[int]]:
    """``fake`` as a runner taking 10 ms a run that counts the most runs at once (``most[0]``)."""
    lock, active, most = threading.Lock(), [0], [0]

    def runner(claim: Claim, key: RunKey, run_dir: Path, extra=()) -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.01)
        fake(claim, key, run_dir, extra)
        with lock:
            active[0] -= 1

    return runner, most


@pytest.mark.parametrize("jobs", [1, 2])
def test_both_models_chains_share_the_runs_slots(tmp_path: Path, jobs: int) -> None:
    """A's grid extensions run beside B's seeds, never more than ``jobs`` runs at once."""

    fake = FakeRunner()
    runner, most = overlap_counting(fake)
    Study(tmp_path, runner, jobs=jobs).run_claim(claim())
    assert most[0] == jobs
    # A: 5 rates + 3 seeds; B: 3 rates + 3 seeds + 3 at equal time, each once
    assert len(fake.calls) == len(set(fake.calls)) == 17


def test_one_chains_failure_lets_the_other_chain_finish(tmp_path: Path) -> None:
    """A replay stops a chain at its first missing run; the other chain must still be replayed
    (not cancelled before it starts), so the runs due are both models' on any machine."""

    done = []

    def work(claim: Claim, model: ModelSpec) -> str:
        if model.name == "A":
            raise LookupError("A's run is missing")
        time.sleep(0.05)
        done.append(model.name)
        return model.name

    with pytest.raises(LookupError, match="A's run"):
        Study(tmp_path, FakeRunner()).each_model(claim(), work)
    assert done == ["B"]


def test_seeds_curves_average_by_validation_index() -> None:
    """Seeds with different update counts (AWD's variable windows) still give one curve."""
    runs = [
        RunResult({}, 1, 1.0, 100, curve={50: 3.0, 100: 2.0}),
        RunResult({}, 1, 1.0, 104, curve={52: 3.2, 104: 2.2, 150: 1.0}),
    ]
    steps, stats = mean_curve(runs)
    assert steps == [51, 102]
    assert [m for m, _ in stats] == pytest.approx([3.1, 2.1])
    assert stats[0][1] == pytest.approx(0.1414, abs=1e-4)


def test_multirun_commands_name_the_runs_due_and_write_where_the_study_reads(
    tmp_path: Path,
) -> None:
    """--multirun: the grid first, then the seeds; a real multirun lands in the study's folders."""
    model = tiny_charlm()
    other = dataclasses.replace(model, name="other", overrides=(*model.overrides, "model.n_head=2"))
    toy = Claim(
        "tiny",
        "t",
        "s",
        "src",
        "test/bpc",
        False,
        "better",
        (model, other),
        (2, 3, 4),
        "task.optimizer.lr",
    )
    due = due_runs(tmp_path, toy)
    assert sorted((k.model.name, k.lr, k.seed) for k in due) == sorted(
        (m, lr, 1) for m in ("charlm", "other") for lr in (1e-3, 2e-3, 4e-3)
    )
    commands = multirun_commands(tmp_path, toy, due)
    # two data preparations, then one sweep over the three rates per model
    assert len(commands) == 4 and all("fast_dev_run=true" in c for c in commands[:2])
    sweep = commands[2]
    assert "task.optimizer.lr=0.001,0.002,0.004 seed=1 trainer.max_steps=8" in sweep
    assert "'hydra.sweep.subdir=lr${task.optimizer.lr}_s${seed}'" in sweep
    # run the first model's sweep for two of the rates: they land where the study looks
    args = shlex.split(sweep.replace("0.001,0.002,0.004", "0.001,0.002"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, *args[1:]], cwd=ROOT, env=env, check=True, capture_output=True)
    for lr in (1e-3, 2e-3):
        result = read_run(RunKey(model, lr, 1, 8).run_dir(tmp_path))
        assert result is not None and result.updates == 8
    left = due_runs(tmp_path, toy)
    assert sorted((k.model.name, k.lr) for k in left) == [("charlm", 4e-3)] + [
        ("other", lr) for lr in (1e-3, 2e-3, 4e-3)
    ]


def test_the_runs_due_come_in_the_claims_order_whichever_chain_records_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay's chains run in threads; the runs due (and so --multirun's commands) do not
    depend on which thread records first."""

    run = Study._run

    def late_a(self: Study, claim: Claim, key: RunKey) -> None:
        if key.model.name == "A":
            time.sleep(0.05)
        run(self, claim, key)

    monkeypatch.setattr(Study, "_run", late_a)
    due = due_runs(tmp_path, claim())
    assert [(k.model.name, k.lr, k.seed) for k in due] == [
        (name, lr, 1) for name in ("A", "B") for lr in (1e-3, 2e-3, 4e-3)
    ]


def test_equal_time_runs_that_retrace_the_shorter_ones_are_named() -> None:
    from types import SimpleNamespace

    from src.commands.study.report import same_best_note

    def run(score: float, curve: dict[int, float]) -> RunResult:
        return RunResult({"test/score": score}, 1, 1.0, max(curve), curve=curve)

    short = [run(10.0, {100: 3.0, 200: 2.5}), run(11.0, {100: 3.1, 200: 2.6})]
    # the longer runs retrace the shorter ones, then do worse on validation
    retraced = [run(10.0, {100: 3.0, 200: 2.5, 300: 2.7}), run(11.0, {100: 3.1, 200: 2.6})]
    note = same_best_note(SimpleNamespace(runs=short, equal_time=retraced), "test/score")
    assert "score exactly as the shorter ones" in note and "(update 200)" in note
    # a longer run that improves, or one on another path, is a comparison of its own
    improved = [run(10.5, {100: 3.0, 200: 2.5, 300: 2.4}), retraced[1]]
    assert same_best_note(SimpleNamespace(runs=short, equal_time=improved), "test/score") == ""
    other_path = [run(10.0, {100: 2.9, 200: 2.5}), retraced[1]]
    assert same_best_note(SimpleNamespace(runs=short, equal_time=other_path), "test/score") == ""


def test_claims_side_by_side_share_the_slots_and_run_a_shared_run_once(tmp_path: Path) -> None:
    """Two claims comparing A with B and with C run together in 2 slots: never more than 2 runs
    at once, A's runs once each, and the decisions equal those of the claims run one by one."""

    fake = FakeRunner()
    runner, most = overlap_counting(fake)
    other = dataclasses.replace(claim(), name="toy2", models=(spec("A"), spec("C")))
    decided = Study(tmp_path / "together", runner, jobs=2).run_claims([claim(), other])
    assert most[0] == 2
    assert len(fake.calls) == len(set(fake.calls))
    assert fake.prepared.count("A") == 1
    alone = FakeRunner()
    study = Study(tmp_path / "alone", alone, jobs=1)
    expected = {c.name: study.run_claim(c) for c in (claim(), other)}
    assert sorted(fake.calls) == sorted(alone.calls)
    for name in expected:
        assert decided[name].seeds == expected[name].seeds
        assert decided[name].equal == expected[name].equal
        assert {m: t.lr for m, t in decided[name].tuned.items()} == {
            m: t.lr for m, t in expected[name].tuned.items()
        }


def test_the_report_says_which_runs_stopped_early_and_how_far_capped_ones_still_fell() -> None:
    stopping = dataclasses.replace(
        spec("A", length=1600), length_key="trainer.max_steps", early_stopping=True
    )

    def run(updates: int, values: list[float]) -> RunResult:
        curve = {128 * (k + 1): v for k, v in enumerate(values)}
        return RunResult({"test/score": 1.0}, 1000, 100.0, updates, curve)

    runs = [
        run(1600, [4.0, 3.6, 3.50, 3.45, 3.42, 3.40]),  # fell 0.10 over its last 3 validations
        run(1600, [4.0, 3.6, 3.50, 3.49, 3.48, 3.47]),  # 0.03
        run(896, [4.0, 3.5, 3.3, 3.31, 3.32, 3.33]),  # early stopping, 3 validations past its best
    ]
    sides = [
        Side(stopping, Tuned(1e-3, (), ()), [], runs, [], [], [], None),
        Side(spec("B"), Tuned(1e-3, (), ()), [], runs, [], [], [], None),
    ]
    line = stopping_line(sides)
    assert line == (
        "Early stopping: A: 1 of 3 runs stopped early (3 validations without a new best), 2 at "
        "the cap of 1,600 updates "
        "(validation loss still falling by 0.030–0.100 over their last 3 validations)."
    )
    # B trains for a fixed length: no line for it, none at all without a model that stops early
    assert stopping_line(sides[1:]) is None


def test_early_stops_that_the_longer_runs_of_the_same_seed_pass_are_called_pauses() -> None:
    from src.commands.study.report import pause_note

    stopping = dataclasses.replace(
        spec("A", length=1600), length_key="trainer.max_steps", early_stopping=True
    )

    def run(values: list[float]) -> RunResult:
        curve = {128 * (k + 1): v for k, v in enumerate(values)}
        return RunResult({"test/score": 1.0}, 1000, 100.0, max(curve), curve)

    stopped = [run([4.0, 3.26, 3.30, 3.28, 3.27]), run([4.0, 3.30, 3.31, 3.32, 3.33])]
    # the equal-time runs of the same seeds retrace them (to within another CPU's rounding),
    # then the first passes its stop's best (3.26) at update 896; the second never does
    longer = [
        run([4.0, 3.2601, 3.30, 3.28, 3.27, 3.27, 3.25, 3.22]),
        run([4.0, 3.30, 3.31, 3.32, 3.33, 3.31, 3.30]),
    ]

    def side(model, runs, equal):
        return Side(model, Tuned(1e-3, (), ()), [], runs, [], equal, [], 2950)

    note = pause_note(side(stopping, stopped, longer))
    assert note == (
        " Early stopping ended 2 of A's runs before the cap; the equal-time runs retrace them and "
        "pass their best validation loss in 1 (first at update 896; best 3.260 → 3.220): those "
        "stops were pauses of more than 3 validations, not plateaus."
    )
    # none passed, a longer run on another path, or a model that trains for a fixed length
    assert pause_note(side(stopping, stopped, [longer[1], longer[1]])) == ""
    off_path = [run([4.0, 3.1, 3.0, 2.9, 2.8, 2.7]), longer[1]]
    assert pause_note(side(stopping, stopped, off_path)) == ""
    assert pause_note(side(spec("A", length=1600), stopped, longer)) == ""


@pytest.mark.parametrize("extra_seeds", [True, False])
def test_the_report_page_says_which_seeds_the_verdicts_use(
    tmp_path: Path, extra_seeds: bool
) -> None:
    toy = claim()
    study = Study(tmp_path / "runs", FakeRunner(), extra_seeds=extra_seeds)
    study.run_claim(toy)
    page = write_report(study, [toy], tmp_path / "docs" / "claims.md", "python study.py")
    assert (tmp_path / "docs" / "claims.md").read_text() == page
    assert (tmp_path / "docs" / "claims_toy.png").is_file()
    # the summary row: A 12.40 vs B 10.40, Welch's interval +2.00 [+1.77, +2.23], holds
    assert "| A vs B | A beats B | A 12.40 ± 0.10 vs B 10.40 ± 0.10 test/score (3 seeds) |" in page
    assert "| +2.00 [+1.77, +2.23] | — | holds | holds |" in page
    if extra_seeds:
        assert "2, 3, 4, and 5 and 6 as well where three leave it undecided." in page
    else:
        assert "2, 3 and 4 (run with `--no-extra-seeds`" in page
