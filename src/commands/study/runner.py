"""The study's runner: each run of a claim as a ``train.py`` process in its own folder, the
claim's decisions (grid, seeds, equal time) taken on the finished runs, and what is due next as
Hydra multirun commands for a cluster."""

from __future__ import annotations

import csv
import json
import math
import os
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
    # the models' chains, and the runs of one decision, record at once: order them as the claim
    # does (model, length, rate, seed), not as the threads happened to
    due = sorted(
        dict.fromkeys(due), key=lambda k: (claim.models.index(k.model), k.length, k.lr, k.seed)
    )
    return study.used.get(claim.name, []), due


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
            run_dir = shown(model.folder(out) / "prepare")
            args = ["python", "train.py", *model.overrides, "trainer.fast_dev_run=true",
                    "test=false", f"hydra.run.dir={run_dir}"]  # fmt: skip
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


def shown(path: Path) -> str:
    """``path`` relative to the project where it lies inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
