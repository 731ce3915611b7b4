"""The papers' claims, tested fairly: two models at equal parameters, each learning rate tuned.

    python study.py                    # every claim of conf/study/, then docs/claims.md
    python study.py delight_mt pru_lm  # some of them
    python study.py --report           # only re-write docs/claims.md from the runs there are
    python study.py pru_lm --multirun  # print the Hydra multirun commands of the runs due next

Each claim (``conf/study/<name>.yaml``) names two models, each a list of ``train.py`` overrides
(its experiment: its own recipe, sized to within 1% of the other's parameters). For each model:

1. a learning-rate grid (at least three values a factor of two apart) at seed 1; the value with
   the lowest validation loss wins, and while the winner sits at an edge of the grid the grid grows
   by one more factor of two on that side (at most ``--extend`` times);
2. the winning rate at the other seeds (three seeds in all);
3. at equal wall time: the model whose training was faster runs again at the three seeds, its
   run (``length_key``: epochs or updates) lengthened by the ratio of the two models' mean
   training times, so it gets the slower one's time.

Runs go ``--jobs`` at a time (default 2), each with ``--threads`` PyTorch threads (default 1), as
``train.py`` processes in ``<out>/runs/<the model's overrides>/<run>/`` (default ``logs/study``; claims
that compare the same model share its runs). A run whose
``metrics.json`` says finished is never run again, so an interrupted study resumes where it stopped.
The report (``docs/claims.md`` and one curve plot per claim) gives per model the parameters, the
grid, test metric mean ± std over the seeds, validation loss, updates, training time and time per
update, and a verdict: **holds**, **does not hold** or **within noise** (the difference of the
means within two standard errors of the difference).

On a cluster, ``--multirun`` prints instead the ``python train.py -m`` commands of the runs that the
claim's next decision waits for (the grid, then the seeds, then the equal-time runs), writing into
the same folders; add a launcher (``hydra/launcher=submitit_slurm``), run them, and ask again.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from src.utils.extras import require

ROOT = Path(__file__).resolve().parents[2]
STUDY_CONF = ROOT / "conf" / "study"
SELECT_KEY = "val/loss"  # the learning rate is chosen on the validation loss, lower is better
FIRST_SEED = 1


@dataclass(frozen=True)
class ModelSpec:
    """One side of a claim: its name in the tables and its ``train.py`` overrides."""

    name: str
    overrides: tuple[str, ...]
    lrs: tuple[float, ...]
    length_key: str  # trainer.max_epochs or trainer.max_steps: what equal time lengthens
    length: int  # its value in the experiment

    def folder(self, out: Path) -> Path:
        """Where its runs live: named by its overrides, so claims that share a model share its
        runs (e.g. one DeLighT classifier against a Transformer and against its ablation)."""
        # a path Hydra's override grammar accepts ('=', '+' and ',' are its syntax)
        slug = re.sub(
            r"[^A-Za-z0-9_.-]", "_", "__".join(o.replace("=", "-") for o in self.overrides)
        )
        return out / "runs" / slug


@dataclass(frozen=True)
class Claim:
    """A claim of the papers and the comparison that tests it (``conf/study/<name>.yaml``)."""

    name: str
    title: str
    statement: str
    source: str
    metric: str  # the test metric reported, e.g. test/sacrebleu
    higher_is_better: bool
    kind: str  # better: A beats B | not_worse: A matches B (or beats it) | report: no direction
    models: tuple[ModelSpec, ModelSpec]
    seeds: tuple[int, ...]
    lr_key: str
    notes: str = ""  # Markdown under the verdict: e.g. what rules out an implementation error

    @property
    def a(self) -> ModelSpec:
        return self.models[0]

    @property
    def b(self) -> ModelSpec:
        return self.models[1]


def load_claim(path: Path) -> Claim:
    """A claim from its YAML; every missing or malformed field is named."""
    conf = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    missing = [
        key
        for key in ("title", "statement", "source", "metric", "higher_is_better", "kind", "models")
        if key not in conf
    ]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    if conf["kind"] not in ("better", "not_worse", "report"):
        raise ValueError(f"{path}: kind must be better, not_worse or report, got {conf['kind']!r}")
    models = []
    for spec in conf["models"]:
        lrs = tuple(sorted(float(lr) for lr in spec["lrs"]))
        if len(lrs) < 3:
            raise ValueError(
                f"{path}: model {spec['name']} needs at least 3 learning rates, got {lrs}"
            )
        models.append(
            ModelSpec(
                name=spec["name"],
                overrides=tuple(spec["overrides"]),
                lrs=lrs,
                length_key=spec["length_key"],
                length=int(spec["length"]),
            )
        )
    if len(models) != 2:
        raise ValueError(f"{path}: a claim compares two models, got {len(models)}")
    seeds = tuple(int(s) for s in conf.get("seeds", (1, 2, 3)))
    if seeds[0] != FIRST_SEED:
        raise ValueError(f"{path}: the seeds start with {FIRST_SEED} (the grid's), got {seeds}")
    return Claim(
        name=path.stem,
        title=conf["title"],
        statement=conf["statement"],
        source=conf["source"],
        metric=conf["metric"],
        higher_is_better=bool(conf["higher_is_better"]),
        kind=conf["kind"],
        models=(models[0], models[1]),
        seeds=seeds,
        lr_key=conf.get("lr_key", "task.optimizer.lr"),
        notes=str(conf.get("notes", "")).strip(),
    )


def load_claims(names: Sequence[str] | None = None, folder: Path = STUDY_CONF) -> list[Claim]:
    paths = sorted(folder.glob("*.yaml"))
    known = {p.stem: p for p in paths}
    if names:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(
                f"unknown claim(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}"
            )
        paths = [known[n] for n in names]
    return [load_claim(p) for p in paths]


# ---------------------------------------------------------------------------------------------
# runs


@dataclass(frozen=True)
class RunKey:
    """One training run of a claim: a model at a learning rate, seed and length."""

    model: ModelSpec
    lr: float
    seed: int
    length: int

    @property
    def label(self) -> str:
        tag = f"lr{self.lr:g}_s{self.seed}"
        return tag if self.length == self.model.length else f"{tag}_{self.length}"

    def run_dir(self, out: Path) -> Path:
        return self.model.folder(out) / self.label

    def command(self, claim: Claim, run_dir: Path) -> list[str]:
        return [
            sys.executable,
            str(ROOT / "train.py"),
            *self.model.overrides,
            f"{claim.lr_key}={self.lr:g}",
            f"seed={self.seed}",
            f"{self.model.length_key}={self.length}",
            f"task_name=study_{self.model.folder(Path()).name}",
            f"hydra.run.dir={run_dir}",
        ]


@dataclass
class RunResult:
    """What the report needs of one finished run."""

    metrics: dict[str, float]
    params: int
    fit_time_s: float
    updates: int
    curve: dict[int, float] = field(default_factory=dict)  # step -> val/loss
    wall_time_s: float = 0.0  # the whole train.py command: data, training, test

    @property
    def val_loss(self) -> float:
        """The best validation loss of the run (the lr criterion)."""
        values = list(self.curve.values())
        if SELECT_KEY in self.metrics:
            values.append(self.metrics[SELECT_KEY])
        return min(values) if values else math.inf


def read_curve(run_dir: Path, key: str = SELECT_KEY) -> dict[int, float]:
    """``key`` by update count from the run's CSV logs (Lightning logs a validation at the
    index of the last update, counted from 0)."""
    curve: dict[int, float] = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with path.open(newline="") as file:
            for row in csv.DictReader(file):
                if row.get(key):
                    curve[int(row["step"]) + 1] = float(row[key])
    return curve


def read_run(run_dir: Path) -> RunResult | None:
    """The finished run in ``run_dir``, or None (absent, failed or interrupted)."""
    path = run_dir / "metrics.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    if summary.get("status") != "finished":
        return None
    return RunResult(
        metrics={k: float(v) for k, v in summary["metrics"].items()},
        params=int(summary["params"]),
        fit_time_s=float(summary.get("fit_time_s", summary["wall_time_s"])),
        updates=int(summary.get("updates", 0)),
        curve=read_curve(run_dir),
        wall_time_s=float(summary["wall_time_s"]),
    )


# (claim, run, run directory, extra overrides) -> None; the run's metrics.json is in the directory
Runner = Callable[[Claim, RunKey, Path, Sequence[str]], None]


def subprocess_runner(threads: int) -> Runner:
    """Runs ``train.py`` for a run with ``threads`` PyTorch threads; its output goes to
    ``<run_dir>/study.log``; a failed run raises with the log's last lines."""

    def run(claim: Claim, key: RunKey, run_dir: Path, extra: Sequence[str] = ()) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        log_path = run_dir / "study.log"
        command = [*key.command(claim, run_dir), *extra]
        with log_path.open("w") as log:
            log.write(" ".join(command) + "\n")
            log.flush()
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        if code != 0:
            tail = "".join(log_path.read_text().splitlines(keepends=True)[-20:])
            raise RuntimeError(f"{claim.name}/{key.model.name}/{key.label} exited {code}:\n{tail}")

    return run


class Study:
    """Runs (or reuses) the runs of claims and remembers their results."""

    def __init__(
        self, out: Path, runner: Runner, jobs: int = 2, extend: int = 2, verbose: bool = True
    ) -> None:
        self.out = out
        self.verbose = verbose
        # the runs of both models' chains share the slots: at most ``jobs`` at a time in all
        self.slots = threading.Semaphore(jobs)
        self.runner = runner
        self.jobs = jobs
        self.extend = extend
        self.used: dict[str, list[RunKey]] = {}  # claim -> the runs its decisions needed

    def result(self, claim: Claim, key: RunKey) -> RunResult | None:
        return read_run(key.run_dir(self.out))

    def _run(self, claim: Claim, key: RunKey) -> None:
        with self.slots:
            if self.verbose:  # one write per line: the two chains print at once
                sys.stdout.write(
                    f"[{time.strftime('%H:%M:%S')}] {claim.name}: {key.model.name} {key.label}\n"
                )
                sys.stdout.flush()
            self.runner(claim, key, key.run_dir(self.out), ())

    def ensure(self, claim: Claim, keys: Iterable[RunKey]) -> None:
        """Runs those of ``keys`` that have not finished, ``jobs`` at a time."""
        keys = list(dict.fromkeys(keys))
        used = self.used.setdefault(claim.name, [])
        used += [k for k in keys if k not in used]
        todo = [k for k in keys if self.result(claim, k) is None]
        if not todo:
            return
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = [pool.submit(self._run, claim, k) for k in todo]
            for future in futures:
                future.result()
        missing = [k.label for k in todo if self.result(claim, k) is None]
        if missing:
            raise RuntimeError(f"{claim.name}: runs finished without metrics.json: {missing}")

    def grid(self, claim: Claim, model: ModelSpec, lrs: Iterable[float]) -> list[RunKey]:
        return [RunKey(model, lr, FIRST_SEED, model.length) for lr in lrs]

    def chosen_lr(self, claim: Claim, model: ModelSpec, lrs: Sequence[float]) -> float:
        results = {
            lr: self.result(claim, RunKey(model, lr, FIRST_SEED, model.length)) for lr in lrs
        }
        return min(lrs, key=lambda lr: results[lr].val_loss if results[lr] else math.inf)

    def tune_model(self, claim: Claim, model: ModelSpec) -> list[float]:
        """The model's grid at seed 1, grown while its best value is at an edge."""
        lrs = sorted(model.lrs)
        self.ensure(claim, self.grid(claim, model, lrs))
        for _ in range(self.extend):
            best = self.chosen_lr(claim, model, lrs)
            if best == lrs[0]:
                lrs.insert(0, lrs[0] / 2)
            elif best == lrs[-1]:
                lrs.append(lrs[-1] * 2)
            else:
                break
            self.ensure(claim, self.grid(claim, model, lrs))
        return lrs

    def each_model(self, claim: Claim, work: Callable[[Claim, ModelSpec], Any]) -> dict[str, Any]:
        """``work`` for both models at once, so that one model's grid extension runs beside the
        other's seeds instead of leaving a core idle."""
        with ThreadPoolExecutor(max_workers=len(claim.models)) as chains:
            futures = [chains.submit(work, claim, model) for model in claim.models]
            # every chain goes as far as it can before a failure is raised: ``map`` would cancel
            # a chain not yet started when the other fails first (a replay's missing run)
            wait(futures)
        return {model.name: future.result() for model, future in zip(claim.models, futures)}

    def tune(self, claim: Claim) -> dict[str, list[float]]:
        """Each model's grid: the rates tried at seed 1."""
        return self.each_model(claim, self.tune_model)

    def seeds(
        self, claim: Claim, model: ModelSpec, lr: float, length: int | None = None
    ) -> list[RunKey]:
        return [RunKey(model, lr, seed, length or model.length) for seed in claim.seeds]

    def equal_time_length(
        self, claim: Claim, lrs: dict[str, float]
    ) -> tuple[ModelSpec, int] | None:
        """The faster model and its lengthened run, from the mean training times at the
        chosen rates; None when their times are within 5% (equal time is the main comparison)."""
        times = {}
        for model in claim.models:
            runs = [self.result(claim, k) for k in self.seeds(claim, model, lrs[model.name])]
            times[model.name] = statistics.mean(r.fit_time_s for r in runs if r is not None)
        fast, slow = sorted(claim.models, key=lambda m: times[m.name])
        ratio = times[slow.name] / times[fast.name]
        if ratio < 1.05:
            return None
        return fast, max(fast.length + 1, round(fast.length * ratio))

    def prepare(self, claim: Claim) -> None:
        """Prepares each model's data once, alone (one-batch runs), before runs go in parallel:
        two runs must not write a corpus's caches at the same time."""
        for model in claim.models:
            marker = model.folder(self.out) / "prepared"
            if marker.is_file():
                continue
            key = RunKey(model, model.lrs[0], FIRST_SEED, model.length)
            extra = ("trainer.fast_dev_run=true", "test=false")
            self.runner(claim, key, model.folder(self.out) / "prepare", extra)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("the data is prepared\n")

    def tune_and_seed(self, claim: Claim, model: ModelSpec) -> float:
        """The chosen rate, after its runs at every seed."""
        lr = self.chosen_lr(claim, model, self.tune_model(claim, model))
        self.ensure(claim, self.seeds(claim, model, lr))
        return lr

    def run_claim(self, claim: Claim, prepare: bool = True) -> None:
        if prepare:
            self.prepare(claim)
        lrs = self.each_model(claim, self.tune_and_seed)
        equal = self.equal_time_length(claim, lrs)
        if equal is not None:
            fast, length = equal
            self.ensure(claim, self.seeds(claim, fast, lrs[fast.name], length))


class _Missing(LookupError):
    pass


def replay(out: Path, claim: Claim, extend: int = 2) -> tuple[list[RunKey], list[RunKey]]:
    """The claim's decisions replayed on its finished runs, running nothing: (the runs they
    used, the unfinished runs the next decisions wait for, [] when the claim is complete)."""
    due: list[RunKey] = []

    def record(claim: Claim, key: RunKey, run_dir: Path, extra: Sequence[str] = ()) -> None:
        due.append(key)
        raise _Missing(key.label)

    study = Study(out, record, extend=extend, verbose=False)
    try:
        study.run_claim(claim, prepare=False)
    except _Missing:
        pass
    return study.used.get(claim.name, []), list(dict.fromkeys(due))


def claim_runs(out: Path, claim: Claim, extend: int = 2) -> list[RunKey] | None:
    """The runs that ``python study.py <claim>`` needs from scratch with the claim's grids as
    configured, None while one of them is missing."""
    used, due = replay(out, claim, extend)
    return None if due else used


def due_runs(out: Path, claim: Claim, extend: int = 2) -> list[RunKey]:
    """The unfinished runs that the claim's next decisions wait for; [] when it is complete."""
    return replay(out, claim, extend)[1]


def multirun_commands(out: Path, claim: Claim, keys: Sequence[RunKey]) -> list[str]:
    """``python train.py -m`` commands that run ``keys`` into the folders the study reads: one
    per model, length and seed, sweeping the rates (or per rate, sweeping the seeds)."""
    groups: dict[tuple[ModelSpec, int], list[RunKey]] = {}
    for key in keys:
        groups.setdefault((key.model, key.length), []).append(key)
    commands = []
    for model in dict.fromkeys(k.model for k in keys):
        if not (model.folder(out) / "prepared").is_file():
            # the data caches are written once, before runs go in parallel
            args = ["python", "train.py", *model.overrides, "trainer.fast_dev_run=true", "test=false",
                    f"hydra.run.dir={shown(model.folder(out) / 'prepare')}"]  # fmt: skip
            commands.append(" ".join(shlex.quote(a) for a in args))
    for (model, length), group in groups.items():
        by_lr = len({k.lr for k in group}) == 1
        sweeps: dict[object, list[RunKey]] = {}
        for key in group:
            sweeps.setdefault(key.lr if by_lr else key.seed, []).append(key)
        for runs in sweeps.values():
            lrs = ",".join(dict.fromkeys(f"{k.lr:g}" for k in runs))
            seeds = ",".join(dict.fromkeys(str(k.seed) for k in runs))
            # the sub-folder names RunKey.label gives: lr<lr>_s<seed>[_<length>]
            subdir = f"lr${{{claim.lr_key}}}_s${{seed}}" + (
                "" if length == model.length else f"_{length}"
            )
            args = [
                "python", "train.py", "-m", *model.overrides,
                f"{claim.lr_key}={lrs}", f"seed={seeds}", f"{model.length_key}={length}",
                f"task_name=study_{model.folder(Path()).name}",
                f"hydra.sweep.dir={shown(model.folder(out))}", f"hydra.sweep.subdir={subdir}",
            ]  # fmt: skip
            commands.append(" ".join(shlex.quote(a) for a in args))
    return commands


def compute_minutes(out: Path, keys: Iterable[RunKey]) -> tuple[int, float]:
    """(runs, their summed wall time in minutes): the train.py commands, one thread each;
    a run that two claims share counts once."""
    folders = dict.fromkeys(k.run_dir(out) for k in keys)
    results = [read_run(folder) for folder in folders]
    return len(folders), sum(r.wall_time_s for r in results if r is not None) / 60


def cost_line(runs: int, minutes: float, jobs: int) -> str:
    return (
        f"{runs} runs, {minutes:.0f} CPU-thread minutes: about {minutes / jobs:.0f} min "
        f"at {jobs} runs at a time"
    )


# ---------------------------------------------------------------------------------------------
# report


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


def claim_section(
    claim: Claim, sides: list[Side], plot: str | None, cost: str | None = None
) -> tuple[str, str]:
    """The claim's Markdown section and its row of the summary table; ``cost`` is what the
    claim's runs take from scratch."""
    metric = claim.metric
    lines = [f"## {claim.title}", "", f"**Claim** ({claim.source}): {claim.statement}", ""]
    lines.append(
        f"| model | params | lr grid at seed 1: best {SELECT_KEY} | lr | {metric} (mean ± std, "
        f"{len(claim.seeds)} seeds) | best {SELECT_KEY} | updates | training time (with validation) | ms / update |"
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
                f"{side.lr:g}{edge} | {fmt(*test)} | {fmt(*val, 3)} | {updates:,.0f} | {fit:,.0f} s | {per:.0f} |"
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
            f"**Verdict: {found}.** {a.model.name} − {b.model.name} = {sign * diff:+.{d}f} {metric}, {better} "
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
            f"{a.model.name} − {b.model.name} = {sign * eq_diff:+.{d}f} (two standard errors {eq_noise:.{d}f}): "
            f"{eq_found}."
        )
    if claim.notes:
        lines += ["", claim.notes]
    if cost:
        lines += ["", f"Cost from scratch (`python study.py {claim.name}`): {cost}."]
    if plot:
        lines += ["", f"![{claim.title}: {SELECT_KEY} by update]({plot})"]
    lines.append("")
    per_update = " vs ".join(
        f"{1e3 * statistics.mean(r.fit_time_s for r in s.runs) / max(1, statistics.mean(r.updates for r in s.runs)):.0f}"
        for s in sides
    )
    row = (
        f"| {claim.title} | {claim.statement} | {a.model.name} {fmt(*mean_std([r.metrics[metric] for r in a.runs]))} vs "
        f"{b.model.name} {fmt(*mean_std([r.metrics[metric] for r in b.runs]))} {metric} | {found} | {per_update} |"
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
    axes.set_title(f"{claim.title}\nmean ± std over {len(claim.seeds)} seeds", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def shown(path: Path) -> str:
    """``path`` relative to the project where it lies inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def report(study: Study, claims: Sequence[Claim], path: Path, command: str) -> str:
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
        f" All of it from scratch: {cost_line(*compute_minutes(study.out, everything), study.jobs)}."
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
        "hand). Each model runs its own recipe at equal parameters (within 1%); its learning rate is "
        f"chosen on {SELECT_KEY} at seed 1 from a grid of factors of two (grown while the best is at "
        "an edge); the chosen rate runs at three seeds; the faster model runs again at equal training "
        "time. Verdict: the difference of the means against two standard errors of it. Times are "
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


def claims_epilog() -> str:
    """The claims of ``conf/study/`` with their titles, for ``--help``."""
    claims = load_claims()
    width = max(len(claim.name) for claim in claims)
    lines = [f"  {claim.name:<{width}}  {claim.title}" for claim in claims]
    return "claims (conf/study/<name>.yaml):\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=claims_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's lines as written
    )
    parser.add_argument(
        "claims", nargs="*", help="names of the claims to run (listed below); all of them when none"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "logs" / "study",
        help="the study's folder: each run of train.py in <out>/runs/<the model's overrides>/<run>/; "
        "a finished run there is never run again, so a study resumes where it stopped "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--jobs", type=int, default=2, help="train.py runs at a time (default: %(default)s)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="PyTorch threads per run (default: %(default)s)"
    )
    parser.add_argument(
        "--extend",
        type=int,
        default=2,
        help="how many times at most a learning-rate grid grows by a factor of two past its edge "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="run nothing: only write the report from the runs in --out",
    )
    parser.add_argument(
        "--multirun",
        action="store_true",
        help="run nothing: print the Hydra multirun commands (python train.py -m ...) of the runs "
        "due next, writing into --out (for a cluster launcher)",
    )
    parser.add_argument(
        "--doc",
        type=Path,
        default=ROOT / "docs" / "claims.md",
        help="the report written at the end: a table of every claim's verdict, a section per "
        "claim, and its curve plot claims_<name>.png beside it (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    claims = load_claims(args.claims)
    study = Study(args.out, subprocess_runner(args.threads), jobs=args.jobs, extend=args.extend)
    if args.multirun:
        for claim in claims:
            due = due_runs(args.out, claim, args.extend)
            print(
                f"# {claim.name}: "
                + (f"{len(due)} runs due" if due else "complete (python study.py --report)")
            )
            for command in multirun_commands(args.out, claim, due):
                print(command)
        return
    if not args.report:
        for claim in claims:
            start = time.perf_counter()
            study.run_claim(claim)
            print(f"{claim.name}: {(time.perf_counter() - start) / 60:.1f} min", flush=True)
    report(study, load_claims(), args.doc, "python study.py")
    print(f"wrote {args.doc}")
