"""Everything worth measuring on a GPU, in one command that fits a short window on the machine.

GPU time comes in short windows, so one prepared command gathers all that the work without a GPU
needs afterwards. It runs in two phases, each part a child process with its own deadline (stopped
with SIGINT, then killed 20 s later; what it printed until then is kept):

1. Together, none of them timing anything (they share the GPU):
   - ``pytest``: the GPU-relevant tests on CUDA (kernels compiled for real, autocast bf16/fp16,
     models on CUDA, resume on CUDA), pytest-xdist over the machine's cores;
   - ``compile``: ``torch.compile`` of a training step of DiCENet, ESPNetv2, Group-Transformer
     (G=4, G=2), Transformer-XL and DeLighT MT (``gpu_profile.py compile``): compile seconds,
     graphs, graph breaks with their reasons, then the compiled step. These share the CPU with the
     other parts of this phase: the compile seconds are upper bounds;
   - ``train``: short ``trainer=gpu`` (bf16-mixed) runs of the default job, ``char_lm/demo``,
     ``delight_mt/demo``, ``pru_lm/demo``, ``delight_sentiment/delight`` and
     ``detection/ssd_demo``: first and last training loss from their CSV logs.
2. One at a time, each alone on the GPU:
   - ``vision``: DiCENet s=1.0 and ESPNetv2 s=1.0 beside ShuffleNetV2 x1.0 (``gpu_profile.py
     pairs``: bf16, channels-last, batch 256): training and inference images/s and the first
     training step's seconds (the committed choices table should leave nothing to time). First in
     the window: two visits lost these figures to the parts before them;
   - ``warm``: the first training step and inference of DiCENet, ESPNetv2 and ESPNetv2-SSD at the
     benchmarks' shapes (``gpu_profile.py warm``): they compile the kernels and time
     ``impl="auto"``'s candidates, which the on-disk caches (Triton's, ``src/kernels/choices.py``)
     then hand to every later part, and their seconds are the first-step cost;
   - ``bench``: ``benchmarks/gpu.py``, every part (DExTra, character LMs, vision, DiCE units, GLT
     weight gradients, mixed precision), and ``benchmarks/text.py`` (every text system beside its
     baseline, the PRU layers first; ``pru_lm.py`` in ``--dry``);
   - ``pairs``: ``gpu_profile.py pairs --graphed``, each text system's training step beside its
     baseline, each eager and replayed as a CUDA graph (capture seconds, peak memory, median of 20
     steps; the graphed system against the eager baseline and against the graphed one), then the
     top CUDA kernels of one profiled step of each (the step's wall time over its kernels' sum),
     and the Chrome trace of the slowest;
   - ``side_by_side``: the official yardsticks, when ``--side-by-side`` names the script;
   - ``tune``: ``benchmarks/gpu_tune.py``, every fused kernel's launch-configuration sweep.

It writes, refreshed after every part (so a run cut short still leaves its results):
``summary.md`` (every table), ``results.json`` (every row, by part), ``logs.tar.gz`` (each part's
full output), ``trace.json.gz`` and ``auto_choices.json`` (the choices ``impl="auto"`` measured,
for ``benchmarks/commit_choices.py`` to commit). ``--dry`` runs every part on the CPU at toy sizes
(about a minute on 2 cores; the tests run it), so that the command cannot rot between visits.

    python benchmarks/gpu_visit.py --out DIR [--dry] [--budget 480] [--parts ...]
        [--side-by-side PATH/side_by_side.py] [--workers N]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from src.utils.files import write_json

ROOT = Path(__file__).resolve().parents[1]

PYTHON = sys.executable

# the tests whose CUDA cases matter: kernels, autocast, models and resume on CUDA
GPU_TESTS = (
    "tests/ops/test_group_linear.py", "tests/ops/test_dextra.py", "tests/ops/test_dim_conv.py",
    "tests/ops/test_dice.py", "tests/kernels/test_dim_fuse_kernel.py",
    "tests/kernels/test_eesp_kernel.py", "tests/kernels/test_batch_norm_prelu_kernel.py",
    "tests/ops/test_per_group_layer_norm.py", "tests/kernels/test_relative_softmax_kernel.py",
    "tests/ops/test_relative_attention.py", "tests/kernels/test_kernel_autocast.py",
    "tests/kernels/test_gpu_configured_kernels.py", "tests/ops/test_awd_dropout.py",
    "tests/ops/test_autocast.py", "tests/ops/test_compile.py", "tests/models/test_autocast.py",
    "tests/tasks/test_mixed_precision_training.py", "tests/tasks/test_memory_format.py",
    "tests/test_gpu_ready_devices.py", "tests/test_train.py",
)  # fmt: skip
DRY_TESTS = ("tests/test_gpu_ready_devices.py",)

# short run -> its overrides besides trainer=gpu
TRAIN_RUNS = {
    "char_lm/demo": ("experiment=char_lm/demo",),
    "pru_lm/demo": ("experiment=pru_lm/demo",),
    "delight_mt/demo": ("experiment=delight_mt/demo",),
    "delight_sentiment/delight": ("experiment=delight_sentiment/delight",),
    # the vision runs last: their first steps time the fused kernels against PyTorch per shape
    "default": (),
    "detection/ssd_demo": ("experiment=detection/ssd_demo",),
}
COMPILED = ("dicenet", "espnetv2", "gt4", "txl", "gt2", "delight_mt")

PARTS = ("pytest", "compile", "train", "cpu_check", "vision", "warm", "bench", "pairs",
         "side_by_side", "tune")  # fmt: skip
SECTIONS = ("env", *PARTS[:8], "profile", *PARTS[8:])
CONCURRENT = ("pytest", "compile", "train", "cpu_check")
# A 15-minute window holds two calls: the first starts the machine, the second finds it warm
# (and the kernels that the first compiled, in Triton's cache under .visit/); the graphed pairs
# take the second call's window nearly whole: each text system and its baseline is captured
CALLS = {
    1: ("pytest", "compile", "train", "cpu_check", "vision", "warm", "bench"),
    2: ("pairs", "side_by_side", "tune"),
}
CALL_BUDGETS = {1: 470.0, 2: 280.0}


@dataclass
class Budget:
    """Seconds each part may take (phase 1's parts share one window)."""

    phase1: float
    vision: float
    warm: float
    bench: float
    pairs: float
    side_by_side: float
    tune: float


# phase 1 holds the CUDA tests: about 500 on a GPU, 399 of them in 120 s on an H200 (docs/gpu.md).
# Visit 3 (H200, 470 s) cut every part: DiCENet's first step alone took 59 s, gpu.py's vision part
# and the official yardsticks' vision part need its kernels compiled, and the yardsticks ran
# 170 s without reaching their vision figures (docs/gpu.md)
FULL_BUDGET = Budget(phase1=170, vision=80, warm=60, bench=160, pairs=200, side_by_side=60,
                     tune=20)  # fmt: skip
DRY_BUDGET = Budget(phase1=240, vision=120, warm=120, bench=120, pairs=180, side_by_side=120,
                    tune=120)  # fmt: skip


@dataclass
class Run:
    """One child process's outcome."""

    name: str
    command: list[str]
    seconds: float = 0.0
    returncode: int | None = None
    stopped: bool = False  # reached its deadline
    output: str = ""


@dataclass
class Visit:
    out: Path
    dry: bool
    # what the parts write besides the results (run folders, tables read back)
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu_visit_")))
    started: float = field(default_factory=time.monotonic)
    runs: list[Run] = field(default_factory=list)
    rows: dict[str, list[dict]] = field(default_factory=dict)
    sections: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(
        self, name: str, command: Sequence[str], deadline: float, env: dict | None = None
    ) -> Run:
        """Run ``command`` from the project root until it exits or ``deadline`` (monotonic) passes:
        then SIGINT to its process group, and SIGKILL 20 s later."""
        run = Run(name, [str(c) for c in command])
        budget = deadline - time.monotonic()
        if budget <= 1:
            run.stopped, run.output = True, "not started: no time left\n"
            return self.keep(run)
        started = time.monotonic()
        # a parent pytest-xdist worker's variables would make a child pytest share its folders
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        child = subprocess.Popen(
            run.command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**inherited, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True,
        )  # fmt: skip
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.extend(child.stdout), daemon=True)
        reader.start()
        try:
            child.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            run.stopped = True
            stop(child)
        reader.join(5)
        run.seconds = time.monotonic() - started
        run.returncode = child.returncode
        run.output = "".join(chunks)
        print(
            f"[{time.monotonic() - self.started:6.0f} s] {name}: exit {run.returncode}"
            f"{' (deadline)' if run.stopped else ''} after {run.seconds:.0f} s",
            flush=True,
        )
        return self.keep(run)

    def keep(self, run: Run) -> Run:
        with self.lock:
            self.runs.append(run)
        return run

    def add_rows(self, part: str, rows: list[dict]) -> None:
        with self.lock:
            self.rows.setdefault(part, []).extend(rows)

    def write(self) -> None:
        """summary.md, results.json and logs.tar.gz, rewritten whole (each write is atomic)."""
        with self.lock:
            rows = {part: list(r) for part, r in self.rows.items()}
            sections = dict(self.sections)
            runs = list(self.runs)
        summary = "\n\n".join(sections[p] for p in SECTIONS if p in sections) + "\n"
        atomic_write(self.out / "summary.md", summary.encode())
        choices = Path(os.environ.get("LIGHTNETS_CHOICES", ""))
        if choices.is_file():
            atomic_write(self.out / "auto_choices.json", choices.read_bytes())
        write_json(self.out / "results.json", rows)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for i, run in enumerate(runs):
                head = f"$ {' '.join(run.command)}\n# exit {run.returncode}, {run.seconds:.1f} s"
                head += ", stopped at its deadline\n" if run.stopped else "\n"
                data = (head + run.output).encode()
                info = tarfile.TarInfo(f"logs/{i:02d}_{safe(run.name)}.log")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        atomic_write(self.out / "logs.tar.gz", buffer.getvalue())


def stop(child: subprocess.Popen) -> None:
    """SIGINT to the child's process group (pytest then prints its summary), SIGKILL 20 s later."""
    for sig, grace in ((signal.SIGINT, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
        except OSError:
            return
        try:
            child.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def atomic_write(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def json_rows(text: str) -> list[dict]:
    """The JSON objects printed one per line in ``text``."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def status(run: Run) -> str:
    if run.stopped:
        return f"stopped at its deadline after {run.seconds:.0f} s"
    return f"exit {run.returncode}, {run.seconds:.0f} s"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --- the parts ----------------------------------------------------------------------------------


def env_part(visit: Visit) -> None:
    import torch

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "cpus": os.cpu_count(), "dry": visit.dry,
    }  # fmt: skip
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        info["gpu"] = gpu.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True)  # fmt: skip
    info["commit"] = commit.stdout.strip() or None
    visit.add_rows("env", [info])
    visit.sections["env"] = "## Machine\n\n" + markdown_table(
        ("key", "value"), [(k, v) for k, v in info.items()]
    )


def cpu_check_part(visit: Visit, deadline: float) -> None:
    """The PRU recurrence's C++ kernel in each of its GEMM modes, each in a child process
    (``benchmarks/pru_gemm_check.py``), and the processor's instruction sets: the
    packed mode died of SIGSEGV on visit 3's Intel Xeon (docs/gpu.md)."""
    flags: set[str] = set()
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
    rows = []
    for mode in ("plain", "packed"):
        run = visit.run(f"cpu_check_{mode}", [PYTHON, "benchmarks/pru_gemm_check.py", "--check",
                                              mode, "--threads", "4"], deadline,
                        env={"LIGHTNETS_PRU_GEMM": mode})  # fmt: skip
        code = run.returncode
        verdict = (f"died of {signal.Signals(-code).name}" if code is not None and code < 0
                   else status(run))  # fmt: skip
        last = run.output.strip().splitlines()[-1] if run.output.strip() else ""
        rows.append({"mode": mode, "ok": code == 0, "verdict": verdict, "last_line": last[-300:],
                     "cpu": model, "flags": [f for f in wanted if f in flags]})  # fmt: skip
    visit.add_rows("cpu_check", rows)
    table = markdown_table(("GEMM mode", "verdict", "last line"),
                           [(r["mode"], r["verdict"], r["last_line"]) for r in rows])  # fmt: skip
    found = " ".join(rows[0]["flags"]) or "none of " + " ".join(wanted)
    visit.sections["cpu_check"] = (
        f"## The PRU recurrence's C++ kernel on this CPU ({model}; {found})\n\n{table}"
    )


def pytest_part(visit: Visit, deadline: float, workers: int) -> None:
    tests = DRY_TESTS if visit.dry else GPU_TESTS
    failures = visit.scratch / "pytest_failures.txt"
    run = visit.run(
        "pytest",
        [PYTHON, "-m", "pytest", "-n", str(workers), "-q", "-rfE", "--tb=short",
         "-p", "no:cacheprovider", "-p", "benchmarks.pytest_failures", *tests],
        deadline, env={"PYTEST_FAILURES_FILE": str(failures)},
    )  # fmt: skip
    lines = run.output.rstrip().splitlines()
    summary = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed)", ln)), "")
    summary = summary.strip("= ") or f"no summary ({status(run)})"
    reports = failures.read_text() if failures.exists() else ""
    failed = re.findall(r"^FAILED (\S+) \((\w+)\)$", reports, flags=re.M)
    # progress dots: tests run before a stop, when pytest printed no summary
    dots = r"[.FsExX]+( *\[ *\d+%\])?"
    done = sum(ln.count(".") + ln.count("F") + ln.count("s") + ln.count("E")
               for ln in lines if re.fullmatch(dots, ln.strip()))  # fmt: skip
    visit.add_rows(
        "pytest",
        [
            {
                "summary": summary,
                "status": status(run),
                "tests_reported": done,
                "failed": [f"{node} ({when})" for node, when in failed],
            }
        ],
    )
    text = [
        f"## pytest on {'the CPU (dry)' if visit.dry else 'CUDA'}",
        "",
        f"{len(tests)} files, {status(run)}: **{summary}**",
    ]
    if failed:
        text += ["", f"Failures ({len(failed)}):", "",
                 *[f"- `{node}` ({when})" for node, when in failed[:80]],
                 "", "```", tail(reports, 400), "```"]  # fmt: skip
    visit.sections["pytest"] = "\n".join(text)


def in_lanes(items: Sequence, lanes: int, work) -> None:
    """``work(item)`` for every item, ``lanes`` at a time, in the items' order."""
    queue = list(items)
    lock = threading.Lock()

    def lane() -> None:
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop(0)
            work(item)

    threads = [threading.Thread(target=lane) for _ in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def compile_part(visit: Visit, deadline: float, lanes: int) -> None:
    names = ("gt4",) if visit.dry else COMPILED
    extra = ["--dry", "--backend", "eager"] if visit.dry else []

    def probe(name: str) -> None:
        run = visit.run(
            f"compile_{name}",
            [PYTHON, "benchmarks/gpu_profile.py", "compile", name, "--repeats", "5", *extra],
            deadline,
        )
        rows = json_rows(run.output) or [
            {"part": "compile", "name": name, "error": status(run) + ": " + tail(run.output, 1)}
        ]
        visit.add_rows("compile", rows)

    in_lanes(names, lanes, probe)
    rows = sorted(visit.rows.get("compile", []), key=lambda r: names.index(r.get("name", names[0])))
    table = markdown_table(
        ("model", "compile s", "graphs", "graph breaks", "compiled step ms", "per s", "error"),
        [(r.get("name"), r.get("compile_s"), r.get("graphs"), r.get("graph_breaks"),
          r.get("compiled_ms"), r.get("per_s"), r.get("error")) for r in rows],
    )  # fmt: skip
    reasons = [f"- {r['name']}: {reason} (x{n})" for r in rows
               for reason, n in (r.get("break_reasons") or {}).items()]  # fmt: skip
    visit.sections["compile"] = "\n".join(
        [
            "## torch.compile of a training step"
            " (phase 1: the CPU shared with pytest and the runs)",
            "",
            table,
        ]
        + (["", "Graph breaks:", "", *reasons] if reasons else [])
    )


def read_losses(run_dir: Path) -> tuple[int, float | None, float | None]:
    """(logged training steps, first loss, last loss) from the run's CSV log."""
    losses: list[float] = []
    for path in sorted(run_dir.rglob("metrics.csv")):
        with open(path, newline="") as file:
            for record in csv.DictReader(file):
                key = next((k for k in record if "loss" in k and "train" in k and record[k]), None)
                if key is None:
                    key = next((k for k in record if k.endswith("loss") and record[k]), None)
                if key is not None:
                    losses.append(float(record[key]))
    return len(losses), (losses[0] if losses else None), (losses[-1] if losses else None)


def train_part(visit: Visit, deadline: float, lanes: int, steps: int) -> None:
    runs_dir = visit.scratch / "runs"
    queue = [("default", TRAIN_RUNS["default"])] if visit.dry else list(TRAIN_RUNS.items())
    trainer = "trainer=cpu" if visit.dry else "trainer=gpu"
    per_run = 80.0

    def train(item: tuple[str, tuple[str, ...]]) -> None:
        name, overrides = item
        run_dir = runs_dir / name
        command = [PYTHON, "train.py", trainer, *overrides, f"trainer.max_steps={steps}",
                   "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0",
                   "test=false", f"hydra.run.dir={run_dir}"]  # fmt: skip
        run = visit.run(f"train_{name}", command, min(deadline, time.monotonic() + per_run))
        logged, first, last = read_losses(run_dir)
        error = tail(run.output, 1)[:200] if run.returncode != 0 else None
        visit.add_rows(
            "train",
            [
                {
                    "run": name,
                    "status": status(run),
                    "logged_steps": logged,
                    "loss_first": first,
                    "loss_last": last,
                    "error": error,
                }
            ],
        )

    in_lanes(queue, lanes, train)
    order = list(TRAIN_RUNS)
    rows = sorted(visit.rows.get("train", []), key=lambda r: order.index(r["run"]))
    visit.sections["train"] = (
        f"## Short `{trainer}` runs, `trainer.max_steps={steps}`\n\n"
        + markdown_table(
            ("run", "status", "logged steps", "loss first", "loss last", "error"),
            [
                (
                    r["run"],
                    r["status"],
                    r["logged_steps"],
                    fmt(r["loss_first"]),
                    fmt(r["loss_last"]),
                    r["error"],
                )
                for r in rows
            ],
        )  # fmt: skip
    )


def fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def vision_part(visit: Visit, deadline: float) -> None:
    """DiCENet and ESPNetv2 beside ShuffleNetV2 x1.0 (``gpu_profile.py pairs``), alone on the GPU:
    training and inference images/s and the first training step."""
    extra = ["--dry", "--repeats", "1"] if visit.dry else ["--repeats", "20"]
    run = visit.run("vision", [PYTHON, "benchmarks/gpu_profile.py", "pairs", "--only", "dicenet",
                               "espnetv2", *extra], deadline)  # fmt: skip
    rows = [r for r in json_rows(run.output) if r.get("part") == "pairs"]
    visit.add_rows("vision", rows)
    visit.sections["vision"] = (
        f"## Vision beside ShuffleNetV2 x1.0 ({status(run)})\n\n"
        + markdown_table(
            (
                "model",
                "train img/s",
                "vs ShuffleNetV2",
                "inference img/s",
                "1st step s",
                "choices timed in it",
                "peak MiB",
                "error",
            ),
            [
                (
                    r.get("name"),
                    r.get("per_s"),
                    r.get("speedup"),
                    r.get("infer_per_s"),
                    r.get("first_step_s"),
                    r.get("timed_choices"),
                    r.get("peak_mib"),
                    r.get("error"),
                )
                for r in rows
            ],
        )  # fmt: skip
    )


def warm_part(visit: Visit, deadline: float) -> None:
    """The vision networks' first steps at the benchmarks' shapes, alone on the GPU: they compile
    the kernels and time ``impl="auto"``'s candidates once, and the on-disk caches hand both to
    every later part (``gpu_profile.py warm``)."""
    names = ["dicenet", "espnetv2", "ssd"]
    run = visit.run("warm", [PYTHON, "benchmarks/gpu_profile.py", "warm", "--only", *names,
                             *(["--dry"] if visit.dry else [])], deadline)  # fmt: skip
    rows = json_rows(run.output)
    visit.add_rows("warm", rows)
    visit.sections["warm"] = f"## First steps (compile and `auto` timing; {status(run)})\n\n" + (
        markdown_table(
            ("model", "1st train step s", "2nd", "1st inference s", "2nd", "error"),
            [
                (
                    r.get("name"),
                    r.get("first_train_step_s"),
                    r.get("second_train_step_s"),
                    r.get("first_inference_s"),
                    r.get("second_inference_s"),
                    r.get("error"),
                )
                for r in rows
            ],
        )  # fmt: skip
    )


def bench_part(visit: Visit, deadline: float, parts: Sequence[str] | None) -> None:
    if visit.dry:
        gpu = [PYTHON, "benchmarks/gpu.py", "--device", "cpu", "--parts", "dextra", "wgrad",
               "--repeats", "1"]  # fmt: skip
        pru = [PYTHON, "benchmarks/pru_lm.py", "--device", "cpu", "--repeats", "1", "--bptt", "4",
               "--batch", "2"]  # fmt: skip
    else:
        gpu = [PYTHON, "benchmarks/gpu.py", "--device", "cuda", "--no-compile", "--repeats", "11"]
        gpu += ["--parts", *parts] if parts else []
        # every text system beside its baseline (PRU layers first); each group's JSON lines
        # print as it ends, so a stop at the deadline keeps the groups done
        pru = [PYTHON, "benchmarks/text.py", "--device", "cuda", "--repeats", "7",
               "--dyn-segments", "5"]  # fmt: skip
    # the text pairs first (the PRU layers take seconds), gpu.py may take its whole window
    pru_run = visit.run("text", pru, min(deadline, time.monotonic() + (40 if visit.dry else 60)))
    run = visit.run("gpu.py", gpu, deadline)
    visit.add_rows("bench", json_rows(run.output))
    visit.add_rows("pru_lm", json_rows(pru_run.output))
    summary = run.output.split("== summary", 1)
    text = [f"## benchmarks/gpu.py ({status(run)})", ""]
    if len(summary) > 1:
        text += [
            "```",
            "== summary"
            + "\n".join(ln for ln in summary[1].splitlines() if not ln.startswith("{")),
            "```",
        ]
    text += [
        "",
        "Tables:",
        "",
        "```",
        "\n".join(ln for ln in summary[0].splitlines() if not ln.startswith("{"))[-12000:],
        "```",
    ]
    script = "pru_lm.py" if visit.dry else "text.py"
    text += [
        "",
        f"### benchmarks/{script} ({status(pru_run)})",
        "",
        "```",
        tail(pru_run.output, 30),
        "```",
    ]
    visit.sections["bench"] = "\n".join(text)


def pairs_part(visit: Visit, deadline: float) -> None:
    """Each system beside its baseline, then one profiled step of each (one process)."""
    md = visit.scratch / "profile.md"
    # the text systems (the image networks are the vision part's)
    only = ["gt4"] if visit.dry else ["delight_mt", "awd_pru", "gt4", "gt2"]
    extra = ["--dry", "--repeats", "1"] if visit.dry else ["--repeats", "20"]
    command = [PYTHON, "benchmarks/gpu_profile.py", "pairs", "--graphed", "--only", *only,
               "--profile", md, "--trace", visit.out / "trace.json.gz", *extra]  # fmt: skip
    run = visit.run("pairs", command, deadline)
    rows = json_rows(run.output)
    pairs = [r for r in rows if r.get("part") == "pairs"]
    visit.add_rows("pairs", pairs)
    visit.add_rows("profile", [r for r in rows if r.get("part") == "profile"])
    visit.sections["pairs"] = f"## Training steps beside their baselines ({status(run)})\n\n" + (
        markdown_table(
            (
                "model",
                "baseline",
                "ms",
                "per s",
                "unit",
                "params",
                "vs baseline eager",
                "vs baseline graphed",
                "capture s",
                "peak MiB",
                "error",
            ),
            [
                (
                    r.get("name"),
                    r.get("baseline"),
                    r.get("ms"),
                    r.get("per_s"),
                    r.get("unit"),
                    r.get("params"),
                    r.get("speedup"),
                    r.get("speedup_same_way"),
                    r.get("capture_s"),
                    r.get("peak_mib"),
                    r.get("error"),
                )
                for r in pairs
            ],
        )  # fmt: skip
    )
    tables = md.read_text() if md.exists() else "(none written)"
    visit.sections["profile"] = f"## Profiles, one training step each\n\n{tables}"


def side_by_side_part(visit: Visit, deadline: float, script: Path | None) -> None:
    if script is None:
        visit.sections["side_by_side"] = "## Official yardsticks\n\nnot run: no --side-by-side"
        return
    extra = ["--device", "cpu", "--parts", "amp"] if visit.dry else ["--device", "cuda"]
    run = visit.run("side_by_side", [PYTHON, script, "--project", ROOT, *extra], deadline)
    visit.add_rows("side_by_side", json_rows(run.output))
    text = "\n".join(ln for ln in run.output.splitlines() if not ln.startswith("{"))
    visit.sections["side_by_side"] = (
        f"## Official yardsticks: {script.name} ({status(run)})\n\n```\n{tail(text, 80)}\n```"
    )


def tune_part(visit: Visit, deadline: float) -> None:
    md, js = visit.scratch / "tune.md", visit.scratch / "tune.json"
    budget = max(5, int(deadline - time.monotonic() - 15))
    # bf16 alone on the GPU: the models train under bf16 autocast, and the window is short
    extra = ["--dry"] if visit.dry else ["--precisions", "bf16"]
    run = visit.run(
        "tune",
        [
            PYTHON,
            "benchmarks/gpu_tune.py",
            "--budget",
            str(budget),
            "--md",
            md,
            "--json",
            js,
            *extra,
        ],
        deadline,
    )
    if js.exists():
        visit.add_rows("tune", [json.loads(js.read_text())])
    else:
        visit.add_rows("tune", json_rows(run.output))
    tables = md.read_text() if md.exists() else tail(run.output, 40)
    visit.sections["tune"] = f"## Launch-configuration sweeps ({status(run)})\n\n{tables}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--dry", action="store_true", help="every part on the CPU, toy sizes")
    parser.add_argument("--parts", nargs="+", choices=PARTS, help="default: every part")
    parser.add_argument(
        "--call",
        type=int,
        choices=sorted(CALLS),
        help="the parts of the window's first or second call, and its budget",
    )
    parser.add_argument("--budget", type=float, help="seconds for the whole visit (default 480)")
    parser.add_argument("--side-by-side", type=Path, help="the official yardsticks' script")
    parser.add_argument(
        "--workers", type=int, help="pytest-xdist workers (default: cores / 2, dry 0: none)"
    )
    parser.add_argument("--train-steps", type=int, help="steps per short run (default 30, dry 3)")
    parser.add_argument("--bench-parts", nargs="+", help="benchmarks/gpu.py's parts (default all)")
    args = parser.parse_args(argv)
    if args.parts is None:
        args.parts = list(CALLS[args.call] if args.call else PARTS)
    if args.call and args.budget is None and not args.dry:
        args.budget = CALL_BUDGETS[args.call]
    # compiled kernels kept in the checkout (ignored), where a second call on the warm machine
    # finds them
    os.environ.setdefault("TRITON_CACHE_DIR", str(ROOT / ".visit" / "triton"))
    # and the choices impl="auto" measured, which the results carry back for the committed
    # table (benchmarks/commit_choices.py)
    os.environ.setdefault("LIGHTNETS_CHOICES", str(ROOT / ".visit" / "auto_choices.json"))
    if not args.dry:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device here: --dry runs every part on the CPU")
    args.out.mkdir(parents=True, exist_ok=True)
    visit = Visit(args.out.resolve(), args.dry)
    budget = DRY_BUDGET if args.dry else FULL_BUDGET
    if args.budget is not None:  # the windows of the parts to run, scaled to fit
        windows = {"phase1": any(p in args.parts for p in CONCURRENT)}
        windows |= {p: p in args.parts for p in PARTS if p not in CONCURRENT}
        planned = sum(v for k, v in vars(budget).items() if windows[k])
        scale = args.budget / planned
        budget = Budget(**{k: v * scale for k, v in vars(budget).items()})
    cores = os.cpu_count() or 2
    workers = (
        args.workers
        if args.workers is not None
        else (0 if args.dry else max(1, min(12, cores // 2)))
    )
    steps = args.train_steps or (3 if args.dry else 30)
    env_part(visit)
    visit.write()

    # phase 1: together
    phase1_end = time.monotonic() + budget.phase1
    jobs = {
        "pytest": lambda: pytest_part(visit, phase1_end, workers),
        "compile": lambda: compile_part(visit, phase1_end, 1 if args.dry else 3),
        "train": lambda: train_part(visit, phase1_end, 1 if args.dry else 3, steps),
        "cpu_check": lambda: cpu_check_part(visit, phase1_end),
    }
    threads = [threading.Thread(target=guarded(visit, part, job)) for part, job in jobs.items()
               if part in args.parts]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    visit.write()

    # phase 2: one at a time
    sequential = {
        "vision": lambda end: vision_part(visit, end),
        "warm": lambda end: warm_part(visit, end),
        "bench": lambda end: bench_part(visit, end, args.bench_parts),
        "pairs": lambda end: pairs_part(visit, end),
        "side_by_side": lambda end: side_by_side_part(visit, end, args.side_by_side),
        "tune": lambda end: tune_part(visit, end),
    }
    for part, job in sequential.items():
        if part in args.parts:
            end = time.monotonic() + getattr(budget, part)
            guarded(visit, part, lambda job=job, end=end: job(end))()
            visit.write()
    shutil.rmtree(visit.scratch, ignore_errors=True)
    print(f"visit done in {time.monotonic() - visit.started:.0f} s: {visit.out}", flush=True)
    return 0


def guarded(visit: Visit, part: str, job):
    """``job`` with an exception recorded as the part's section, so the other parts still run."""

    def call() -> None:
        try:
            job()
        except Exception as error:  # reported in the summary; the visit goes on
            visit.sections[part] = f"## {part}\n\nthe part failed: {type(error).__name__}: {error}"
            visit.add_rows(part, [{"error": f"{type(error).__name__}: {error}"}])

    return call


if __name__ == "__main__":
    sys.exit(main())
