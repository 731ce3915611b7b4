"""study.py: the learning-rate grid grows at its edges, the chosen rate runs at three seeds, the
faster model runs again at equal time, and the report's verdicts follow the numbers.

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
from pathlib import Path

import pytest

from src.commands.study.claims import Claim, ModelSpec, load_claim, load_claims
from src.commands.study.report import claim_section, collect, cost_line, fmt
from src.commands.study.runner import (
    RunKey,
    RunResult,
    Study,
    claim_runs,
    compute_minutes,
    due_runs,
    multirun_commands,
    read_run,
    subprocess_runner,
)
from src.commands.study.stats import mean_curve, verdict

ROOT = Path(__file__).resolve().parents[1]


def spec(name: str, lrs=(1e-3, 2e-3, 4e-3), length: int = 10) -> ModelSpec:
    return ModelSpec(name, (f"experiment={name}",), tuple(lrs), "trainer.max_epochs", length)


def claim(kind: str = "better", higher: bool = True, a=None, b=None) -> Claim:
    return Claim(
        name="toy",
        title="A vs B",
        statement="A beats B",
        source="test",
        metric="test/score",
        higher_is_better=higher,
        kind=kind,
        models=(a or spec("A"), b or spec("B")),
        seeds=(1, 2, 3),
        lr_key="task.optimizer.lr",
    )


def write_run(run_dir: Path, val_loss: float, score: float, fit_time: float, updates: int) -> None:
    """What train.py leaves in a finished run directory."""
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
    }
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
    scores 2 points higher; A takes twice B's time per update."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int, int]] = []
        self.prepared: list[str] = []

    def __call__(self, claim: Claim, key: RunKey, run_dir: Path, extra=()) -> None:
        if extra:  # the data preparation
            self.prepared.append(key.model.name)
            return
        self.calls.append((key.model.name, key.lr, key.seed, key.length))
        best = 8e-3 if key.model.name == "A" else 2e-3
        val = 1.0 + abs(math.log2(key.lr / best)) * 0.1
        score = (12.0 if key.model.name == "A" else 10.0) + 0.1 * key.seed + 0.01 * key.length
        per_update = 2.0 if key.model.name == "A" else 1.0
        write_run(run_dir, val, score, per_update * 10 * key.length, 10 * key.length)


def test_the_grid_grows_until_the_best_rate_is_inside(tmp_path: Path) -> None:
    runner = FakeRunner()
    toy = claim()
    grids = Study(tmp_path, runner).tune(toy)
    # A's best (8e-3) was beyond the edge: the grid grew to 8e-3 and then to 1.6e-2
    assert grids["A"] == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    assert grids["B"] == [1e-3, 2e-3, 4e-3]
    assert Study(tmp_path, runner).chosen_lr(toy, toy.a, grids["A"]) == 8e-3
    # only seed 1 in the grid, each run once
    assert {c[2] for c in runner.calls} == {1}
    assert len(runner.calls) == len(set(runner.calls)) == 8


def test_the_grid_stops_after_its_extensions(tmp_path: Path) -> None:
    runner = FakeRunner()
    grids = Study(tmp_path, runner, extend=1).tune(claim())
    assert grids["A"] == [1e-3, 2e-3, 4e-3, 8e-3]


def test_a_claim_runs_seeds_at_the_chosen_rate_and_the_faster_model_at_equal_time(
    tmp_path: Path,
) -> None:
    runner = FakeRunner()
    toy = claim()
    Study(tmp_path, runner).run_claim(toy)
    seeds = {(name, lr, seed) for name, lr, seed, length in runner.calls if length == 10}
    assert {("A", 8e-3, s) for s in (1, 2, 3)} <= seeds
    assert {("B", 2e-3, s) for s in (1, 2, 3)} <= seeds
    # B trains twice as fast per update: it runs again, twice as long, at its rate and every seed
    longer = sorted(
        (name, lr, seed, length) for name, lr, seed, length in runner.calls if length != 10
    )
    assert longer == [("B", 2e-3, 1, 20), ("B", 2e-3, 2, 20), ("B", 2e-3, 3, 20)]
    # each model's data was prepared once, first; resuming runs nothing again
    assert runner.prepared == ["A", "B"]
    before = len(runner.calls)
    Study(tmp_path, runner).run_claim(toy)
    assert len(runner.calls) == before and runner.prepared == ["A", "B"]


def test_the_report_has_the_numbers_and_the_verdicts(tmp_path: Path) -> None:
    runner = FakeRunner()
    toy = claim()
    experiment = Study(tmp_path / "runs", runner)
    experiment.run_claim(toy)
    sides = collect(experiment, toy)
    assert sides is not None
    a, b = sides
    assert (a.lr, b.lr) == (8e-3, 2e-3)
    assert [r.metrics["test/score"] for r in a.runs] == pytest.approx([12.2, 12.3, 12.4])
    assert b.equal_length == 20 and len(b.equal_time) == 3
    section, row = claim_section(toy, sides, None)
    # A - B = 2.0 with a std of 0.1 each: far beyond two standard errors (0.16)
    assert (
        "**Verdict: holds.** A − B = +2.00 test/score, higher is better (two standard errors: 0.16)"
        in section
    )
    assert "12.30 ± 0.10" in section and "10.30 ± 0.10" in section
    # small metrics (bpc, accuracy) keep a third decimal: their differences are hundredths
    assert fmt(1.6789, 0.0123) == "1.679 ± 0.012" and fmt(87.704, 1.13) == "87.70 ± 1.13"
    # B at equal time scores 0.1 more (10 more epochs x 0.01): A - B = +1.90
    assert "A − B = +1.90 (two standard errors 0.16): holds." in section
    assert "| 0.008 |" in section and "| 0.002 |" in section  # both inside their grids
    assert "grid edge" not in section
    assert (
        "| 2000 |" in section and "| 1000 |" in section
    )  # ms per update: A 2 s, B 1 s in the fake
    assert row.startswith("| A vs B |") and "| holds |" in row
    noted, _ = claim_section(dataclasses.replace(toy, notes="**Checked.** Parity."), sides, None)
    assert "**Checked.** Parity." in noted
    assert "**Checked.** Parity." not in section


@pytest.mark.parametrize(
    ("kind", "higher", "a", "b", "expected"),
    [
        ("better", True, [10.0, 10.2, 10.4], [10.1, 10.3, 10.2], "within noise"),
        ("not_worse", True, [10.0, 10.2, 10.4], [10.1, 10.3, 10.2], "holds"),
        ("better", True, [9.0, 9.1, 9.2], [10.0, 10.1, 10.2], "does not hold"),
        ("not_worse", True, [9.0, 9.1, 9.2], [10.0, 10.1, 10.2], "does not hold"),
        # lower is better (perplexity): A's lower values win
        ("better", False, [50.0, 50.5, 51.0], [60.0, 60.5, 61.0], "holds"),
        ("better", False, [60.0, 60.5, 61.0], [50.0, 50.5, 51.0], "does not hold"),
    ],
)
def test_verdict(kind: str, higher: bool, a: list[float], b: list[float], expected: str) -> None:
    found, diff, noise = verdict(claim(kind, higher), a, b)
    assert found == expected
    sign = 1 if higher else -1
    assert diff == pytest.approx(sign * (sum(a) - sum(b)) / 3)
    assert noise > 0


def test_every_claim_config_loads_and_names_two_models_with_three_rates() -> None:
    claims = load_claims()
    assert claims, "conf/study/ has no claims"
    for found in claims:
        assert found.seeds == (1, 2, 3)
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
        (1, 2, 3),
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
                   "--multirun", "--doc DOC"):  # fmt: skip
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
        (1, 2, 3),
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
    # A: 5 grid rates + 2 seeds, 200 s + 5 each;
    # B: 3 rates + 2 seeds at 100 s, 3 at equal time 200 s
    assert runs == len(ran) == 7 + 5 + 3
    assert minutes == pytest.approx((7 * 205 + 5 * 105 + 3 * 205) / 60)
    assert "15 runs" in cost_line(runs, minutes, 2)
    # a missing run: no cost yet, and nothing is run to find it
    (RunKey(toy.a, 8e-3, 2, 10).run_dir(tmp_path) / "metrics.json").unlink()
    assert claim_runs(tmp_path, toy) is None
    assert len(runner.calls) == len(ran)


@pytest.mark.parametrize("jobs", [1, 2])
def test_both_models_chains_share_the_runs_slots(tmp_path: Path, jobs: int) -> None:
    """A's grid extensions run beside B's seeds, never more than ``jobs`` runs at once."""
    import threading
    import time

    fake = FakeRunner()
    lock, active, most = threading.Lock(), [0], [0]

    def runner(claim: Claim, key: RunKey, run_dir: Path, extra=()) -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.01)
        fake(claim, key, run_dir, extra)
        with lock:
            active[0] -= 1

    Study(tmp_path, runner, jobs=jobs).run_claim(claim())
    assert most[0] == jobs
    # A: 5 rates + 2 seeds; B: 3 rates + 2 seeds + 3 at equal time, each once
    assert len(fake.calls) == len(set(fake.calls)) == 15


def test_one_chains_failure_lets_the_other_chain_finish(tmp_path: Path) -> None:
    """A replay stops a chain at its first missing run; the other chain must still be replayed
    (not cancelled before it starts), so the runs due are both models' on any machine."""
    import time

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
        (1, 2, 3),
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
    import time

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
