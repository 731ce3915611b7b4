"""The study's runner: each run of a claim as a ``train.py`` process in its own folder, the
claim's decisions (grid, seeds, equal time) taken on the finished runs, and what is due next as
Hydra multirun commands for a cluster."""

from __future__ import annotations

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

from src.commands.study.claims import FIRST_SEED, ROOT, SELECT_KEY, Claim, ModelSpec
from src.commands.study.record import PREPARE, keep
from src.commands.study.stats import UNDECIDED, decide, welch

Options = tuple[tuple[str, str], ...]  # (stage, option) of a model's tuned stages


def effective(model: ModelSpec, options: Options) -> Options:
    """``options`` without those that override nothing (the experiment's own values), so that a
    run is named by what it changes and one setting reached twice is one run."""
    stages = {stage.name: stage for stage in model.tune}
    return tuple((name, option) for name, option in options if stages[name].overrides(option))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


@dataclass(frozen=True)
class RunKey:
    """One training run of a claim: a model at a learning rate, seed, length and tuned options
    (those that override something). A length other than the model's is an equal-time run."""

    model: ModelSpec
    lr: float
    seed: int
    length: int
    options: Options = ()

    @property
    def label(self) -> str:
        tag = f"lr{self.lr:g}_s{self.seed}"
        tag += "".join(f"_{slug(stage)}-{slug(option)}" for stage, option in self.options)
        return tag if self.length == self.model.length else f"{tag}_{self.length}"

    @property
    def equal_time(self) -> bool:
        return self.length != self.model.length

    @property
    def length_key(self) -> str:
        """The key its length is given in: an equal-time run's may be a number of updates."""
        return self.model.equal_key if self.equal_time else self.model.length_key

    def overrides(self) -> list[str]:
        """What the run adds to the model's overrides: its options, and for an equal-time run of
        a model that stops early, early stopping off."""
        stages = {stage.name: stage for stage in self.model.tune}
        added = [o for name, option in self.options for o in stages[name].overrides(option)]
        if self.equal_time:
            added += self.model.equal_time_overrides
        return added

    def run_dir(self, out: Path) -> Path:
        return self.model.folder(out) / self.label

    def command(self, claim: Claim, run_dir: Path) -> list[str]:
        return [
            sys.executable,
            str(ROOT / "train.py"),
            *self.model.overrides,
            *self.overrides(),
            f"{claim.lr_key}={self.lr:g}",
            f"seed={self.seed}",
            f"{self.length_key}={self.length}",
            f"task_name=study_{self.model.folder(Path()).name}",
            f"hydra.run.dir={run_dir}",
        ]


@dataclass(frozen=True)
class Tuned:
    """A model's tuning at seed 1: the chosen rate and options (every stage's, by name), and every
    run the choice looked at (the report's grid)."""

    lr: float
    options: Options
    tried: tuple[RunKey, ...]

    def key(self, model: ModelSpec, seed: int, length: int | None = None) -> RunKey:
        return RunKey(
            model, self.lr, seed, model.length if length is None else length,
            effective(model, self.options),
        )  # fmt: skip


@dataclass
class RunResult:
    """What the report needs of one finished run."""

    metrics: dict[str, float]
    params: int
    fit_time_s: float
    updates: int
    curve: dict[int, float] = field(default_factory=dict)  # step -> val/loss
    wall_time_s: float = 0.0  # the whole train.py command: data, training, test
    fit_cpu_s: float | None = None  # the process's CPU seconds over fit_time_s (None: unknown)
    threads: int | None = None  # PyTorch's threads in the run

    @property
    def cpu_share(self) -> float | None:
        """The share of its threads' time the run had the CPU for: about 1 on a quiet machine,
        under 1 when other work took cores (its times inflated, its metrics unaffected)."""
        if self.fit_cpu_s is None or not self.threads or self.fit_time_s <= 0:
            return None
        return self.fit_cpu_s / (self.fit_time_s * self.threads)

    @property
    def training_s(self) -> float:
        """The training time: CPU seconds per thread where on record (other work on the machine
        inflates wall seconds, hardly a lone thread's CPU time), else wall seconds."""
        if self.fit_cpu_s is not None and self.threads:
            return self.fit_cpu_s / self.threads
        return self.fit_time_s

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
        fit_cpu_s=float(summary["fit_cpu_s"]) if "fit_cpu_s" in summary else None,
        threads=int(summary["threads"]) if "threads" in summary else None,
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
        self,
        out: Path,
        runner: Runner,
        jobs: int = 2,
        extend: int = 2,
        verbose: bool = True,
        extra_seeds: bool = True,
        record: Path | None = None,
    ) -> None:
        self.out = out
        # where each finished run is kept for a fresh clone (:mod:`src.commands.study.record`)
        self.record = record
        self.extra_seeds = extra_seeds
        self.verbose = verbose
        # the runs of both models' chains share the slots: at most ``jobs`` at a time in all
        self.slots = threading.Semaphore(jobs)
        # claims run side by side (:meth:`run_claims`): a run two claims share goes once, and
        # data is prepared by one claim at a time
        self.run_locks: dict[Path, threading.Lock] = {}
        self.locks_lock = threading.Lock()
        self.prepare_lock = threading.Lock()
        self.runner = runner
        self.jobs = jobs
        self.extend = extend
        self.used: dict[str, list[RunKey]] = {}  # claim -> the runs its decisions needed

    def result(self, claim: Claim, key: RunKey) -> RunResult | None:
        return read_run(key.run_dir(self.out))

    def _run(self, claim: Claim, key: RunKey) -> None:
        run_dir = key.run_dir(self.out)
        with self.locks_lock:
            run_lock = self.run_locks.setdefault(run_dir, threading.Lock())
        with run_lock, self.slots:
            if self.result(claim, key) is not None:  # another claim ran it meanwhile
                return
            if self.verbose:  # one write per line: the two chains print at once
                sys.stdout.write(
                    f"[{time.strftime('%H:%M:%S')}] {claim.name}: {key.model.name} {key.label}\n"
                )
                sys.stdout.flush()
            self.runner(claim, key, run_dir, ())
            if self.record is not None:
                keep(run_dir, self.out, self.record)

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

    def val_loss(self, claim: Claim, key: RunKey) -> float:
        result = self.result(claim, key)
        return result.val_loss if result else math.inf

    def grid(self, model: ModelSpec, lrs: Iterable[float], options: Options = ()) -> list[RunKey]:
        options = effective(model, options)
        return [RunKey(model, lr, FIRST_SEED, model.length, options) for lr in lrs]

    def tune_lr(self, claim: Claim, model: ModelSpec, options: Options = ()) -> list[RunKey]:
        """The learning-rate grid at seed 1 with ``options``, grown by a factor of two while its
        best value is at an edge (at most ``extend`` times)."""
        lrs = sorted(model.lrs)
        self.ensure(claim, self.grid(model, lrs, options))
        for _ in range(self.extend):
            best = min(self.grid(model, lrs, options), key=lambda k: self.val_loss(claim, k)).lr
            if best == lrs[0]:
                lrs.insert(0, lrs[0] / 2)
            elif best == lrs[-1]:
                lrs.append(lrs[-1] * 2)
            else:
                break
            self.ensure(claim, self.grid(model, lrs, options))
        return self.grid(model, lrs, options)

    def tune_model(self, claim: Claim, model: ModelSpec) -> Tuned:
        """The model's settings at seed 1: the learning-rate grid crossed with the first tuned
        stage's options, then each later stage's options at the best settings so far
        (coordinate-wise); lowest validation loss wins."""
        first = model.tune[0] if model.tune else None
        starts: list[Options] = [((first.name, o),) for o, _ in first.options] if first else [()]
        tried: list[RunKey] = []
        named: dict[RunKey, Options] = {}  # a run -> every stage's option by name
        for options in starts:
            for key in self.tune_lr(claim, model, options):
                tried.append(key)
                named.setdefault(key, options)
        best = min(tried, key=lambda k: self.val_loss(claim, k))
        lr, options = best.lr, named[best]
        for stage in model.tune[1:]:
            candidates = [(*options, (stage.name, option)) for option, _ in stage.options]
            keys = [
                RunKey(model, lr, FIRST_SEED, model.length, effective(model, c)) for c in candidates
            ]
            self.ensure(claim, keys)
            tried += keys
            scores = [self.val_loss(claim, k) for k in keys]
            options = candidates[scores.index(min(scores))]
        return Tuned(lr, options, tuple(dict.fromkeys(tried)))

    def each_model(self, claim: Claim, work: Callable[[Claim, ModelSpec], Any]) -> dict[str, Any]:
        """``work`` for both models at once, so that one model's grid extension runs beside the
        other's seeds instead of leaving a core idle."""
        with ThreadPoolExecutor(max_workers=len(claim.models)) as chains:
            futures = [chains.submit(work, claim, model) for model in claim.models]
            # every chain goes as far as it can before a failure is raised: ``map`` would cancel
            # a chain not yet started when the other fails first (a replay's missing run)
            wait(futures)
        return {model.name: future.result() for model, future in zip(claim.models, futures)}

    def tune(self, claim: Claim) -> dict[str, Tuned]:
        """Each model's tuning at seed 1."""
        return self.each_model(claim, self.tune_model)

    def seed_keys(
        self, model: ModelSpec, tuned: Tuned, seeds: Sequence[int], length: int | None = None
    ) -> list[RunKey]:
        return [tuned.key(model, seed, length) for seed in seeds]

    def metric_values(
        self, claim: Claim, tuned: dict[str, Tuned], seeds: Sequence[int], model: ModelSpec
    ) -> list[float]:
        runs = [self.result(claim, k) for k in self.seed_keys(model, tuned[model.name], seeds)]
        return [r.metrics[claim.metric] for r in runs if r is not None]

    def verdict_seeds(self, claim: Claim, tuned: dict[str, Tuned]) -> tuple[int, ...]:
        """The verdict's seeds: the claim's (fresh: not the tuning seed), and its extra seeds
        where those leave the verdict undecided (and the study runs extra seeds)."""
        if not (self.extra_seeds and claim.extra_seeds) or claim.kind == "report":
            return claim.seeds
        a, b = (self.metric_values(claim, tuned, claim.seeds, m) for m in claim.models)
        interval = welch(a, b, higher_is_better=claim.higher_is_better)
        if decide(claim.kind, interval, claim.margin).word == UNDECIDED:
            return claim.seeds + claim.extra_seeds
        return claim.seeds

    def equal_time_length(
        self, claim: Claim, tuned: dict[str, Tuned], seeds: Sequence[int]
    ) -> tuple[ModelSpec, int] | None:
        """The faster model and its equal-time run's length, from the mean training times at the
        chosen settings (CPU seconds where every run is one thread and has them); None when their
        times are within 5% (equal time is the main comparison). A model that stops early gets
        the updates it makes in the slower one's time; another its length times the ratio of the
        times."""
        done = {
            model.name: [
                r
                for k in self.seed_keys(model, tuned[model.name], seeds)
                if (r := self.result(claim, k)) is not None
            ]
            for model in claim.models
        }
        runs = [r for rs in done.values() for r in rs]
        # one-thread runs' CPU seconds when every run has them: other work on the machine
        # inflates wall times (and could flip the choice), hardly a lone thread's CPU time
        cpu = all(r.fit_cpu_s is not None and r.threads == 1 for r in runs)
        times = {
            name: statistics.mean(r.fit_cpu_s if cpu else r.fit_time_s for r in rs)
            for name, rs in done.items()
        }
        updates = {name: statistics.mean(r.updates for r in rs) for name, rs in done.items()}
        fast, slow = sorted(claim.models, key=lambda m: times[m.name])
        ratio = times[slow.name] / times[fast.name]
        if ratio < 1.05:
            return None
        if fast.equal_in_updates:
            return fast, round(updates[fast.name] * ratio)
        return fast, max(fast.length + 1, round(fast.length * ratio))

    def prepare(self, claim: Claim) -> None:
        """Prepares each model's data once, alone (one-batch runs), before runs go in parallel:
        two runs must not write a corpus's caches at the same time."""
        for model in claim.models:
            marker = model.folder(self.out) / "prepared"
            with self.prepare_lock:
                if marker.is_file():
                    continue
                key = RunKey(model, model.lrs[0], FIRST_SEED, model.length)
                extra = ("trainer.fast_dev_run=true", "test=false")
                with self.slots:  # a slot, like every run: another claim may be training
                    self.runner(claim, key, model.folder(self.out) / PREPARE, extra)
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text("the data is prepared\n")

    def tune_and_seed(self, claim: Claim, model: ModelSpec) -> Tuned:
        """The model's tuning, then its runs at the verdict's first seeds."""
        tuned = self.tune_model(claim, model)
        self.ensure(claim, self.seed_keys(model, tuned, claim.seeds))
        return tuned

    def run_claim(self, claim: Claim, prepare: bool = True) -> Decisions:
        """Every run of the claim: tuning, the verdict's seeds, the equal-time runs."""
        if prepare:
            self.prepare(claim)
        tuned = self.each_model(claim, self.tune_and_seed)
        seeds = self.verdict_seeds(claim, tuned)
        self.ensure(
            claim, [k for m in claim.models for k in self.seed_keys(m, tuned[m.name], seeds)]
        )
        equal = self.equal_time_length(claim, tuned, seeds)
        if equal is not None:
            fast, length = equal
            self.ensure(claim, self.seed_keys(fast, tuned[fast.name], seeds, length))
        return Decisions(tuned, seeds, equal)

    def run_claims(self, claims: Sequence[Claim]) -> dict[str, Decisions]:
        """Every claim's runs, the claims side by side in the same ``jobs`` slots: a claim
        waiting on its last run (a grid's edge, the last seed) leaves its slot to the next claim
        instead of idling a core. A run shared by two claims goes once."""
        with ThreadPoolExecutor(max_workers=max(1, len(claims))) as pool:
            futures = {claim.name: pool.submit(self.timed_claim, claim) for claim in claims}
            wait(futures.values())
        return {name: future.result() for name, future in futures.items()}

    def timed_claim(self, claim: Claim) -> Decisions:
        start = time.perf_counter()
        decided = self.run_claim(claim)
        if self.verbose:
            minutes = (time.perf_counter() - start) / 60
            sys.stdout.write(
                f"[{time.strftime('%H:%M:%S')}] {claim.name}: done, {minutes:.1f} min\n"
            )
            sys.stdout.flush()
        return decided


@dataclass(frozen=True)
class Decisions:
    """A claim's decisions: each model's tuning, the verdict's seeds, and the faster model with
    its equal-time length (None: times within 5%)."""

    tuned: dict[str, Tuned]
    seeds: tuple[int, ...]
    equal: tuple[ModelSpec, int] | None


class _Missing(LookupError):
    pass


def replay(
    out: Path, claim: Claim, extend: int = 2, extra_seeds: bool = True
) -> tuple[list[RunKey], list[RunKey]]:
    """The claim's decisions replayed on its finished runs, running nothing: (the runs they
    used, the unfinished runs the next decisions wait for, [] when the claim is complete)."""
    due: list[RunKey] = []

    def record(claim: Claim, key: RunKey, run_dir: Path, extra: Sequence[str] = ()) -> None:
        due.append(key)
        raise _Missing(key.label)

    study = Study(out, record, extend=extend, verbose=False, extra_seeds=extra_seeds)
    try:
        study.run_claim(claim, prepare=False)
    except _Missing:
        pass
    # the models' chains, and the runs of one decision, record at once: order them as the claim
    # does (model, length, rate, seed), not as the threads happened to
    due = sorted(
        dict.fromkeys(due),
        key=lambda k: (claim.models.index(k.model), k.length, k.options, k.lr, k.seed),
    )
    return study.used.get(claim.name, []), due


def decisions(
    out: Path, claim: Claim, extend: int = 2, extra_seeds: bool = True
) -> Decisions | None:
    """The claim's decisions replayed on its finished runs; None while a run they need is
    missing."""

    def refuse(claim: Claim, key: RunKey, run_dir: Path, extra: Sequence[str] = ()) -> None:
        raise _Missing(key.label)

    study = Study(out, refuse, extend=extend, verbose=False, extra_seeds=extra_seeds)
    try:
        return study.run_claim(claim, prepare=False)
    except _Missing:
        return None


def claim_runs(
    out: Path, claim: Claim, extend: int = 2, extra_seeds: bool = True
) -> list[RunKey] | None:
    """The runs that ``python study.py <claim>`` needs from scratch with the claim's grids as
    configured, None while one of them is missing."""
    used, due = replay(out, claim, extend, extra_seeds)
    return None if due else used


def due_runs(out: Path, claim: Claim, extend: int = 2, extra_seeds: bool = True) -> list[RunKey]:
    """The unfinished runs that the claim's next decisions wait for; [] when it is complete."""
    return replay(out, claim, extend, extra_seeds)[1]


def multirun_commands(out: Path, claim: Claim, keys: Sequence[RunKey]) -> list[str]:
    """``python train.py -m`` commands that run ``keys`` into the folders the study reads: one
    per model, length and seed, sweeping the rates (or per rate, sweeping the seeds)."""
    groups: dict[tuple[ModelSpec, int, Options], list[RunKey]] = {}
    for key in keys:
        groups.setdefault((key.model, key.length, key.options), []).append(key)
    commands = []
    for model in dict.fromkeys(k.model for k in keys):
        if not (model.folder(out) / "prepared").is_file():
            # the data caches are written once, before runs go in parallel
            run_dir = shown(model.folder(out) / "prepare")
            args = ["python", "train.py", *model.overrides, "trainer.fast_dev_run=true",
                    "test=false", f"hydra.run.dir={run_dir}"]  # fmt: skip
            commands.append(" ".join(shlex.quote(a) for a in args))
    for (model, length, options), group in groups.items():
        by_lr = len({k.lr for k in group}) == 1
        sweeps: dict[object, list[RunKey]] = {}
        for key in group:
            sweeps.setdefault(key.lr if by_lr else key.seed, []).append(key)
        for runs in sweeps.values():
            lrs = ",".join(dict.fromkeys(f"{k.lr:g}" for k in runs))
            seeds = ",".join(dict.fromkeys(str(k.seed) for k in runs))
            # the sub-folder names RunKey.label gives: lr<lr>_s<seed>[_<options>][_<length>]
            tags = "".join(f"_{slug(stage)}-{slug(option)}" for stage, option in options)
            subdir = f"lr${{{claim.lr_key}}}_s${{seed}}{tags}" + (
                "" if length == model.length else f"_{length}"
            )
            args = [
                "python", "train.py", "-m", *model.overrides, *group[0].overrides(),
                f"{claim.lr_key}={lrs}", f"seed={seeds}", f"{group[0].length_key}={length}",
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


def shown(path: Path) -> str:
    """``path`` relative to the project where it lies inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
