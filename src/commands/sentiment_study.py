"""Tables and curves of the DeLighT Scale x Shift sentiment study from its runs' directories.

``python sentiment_study.py RUN_DIR [RUN_DIR ...] [--out docs]`` finds every finished run under
the given folders (``metrics.json`` beside ``.hydra/config.yaml``, as ``train.py`` writes them,
e.g. the multirun of ``sweeps/delight_sentiment_scale_shift.yaml``), names each by its network
and flags (the student report's names: DeLighT Scale+Shift, Scale, Shift, DeLighT, Transformer),
and prints, in Markdown:

- the report's two tables, parameters and execution time (training + test wall time, mean over
  seeds), with the report's numbers beside;
- test accuracy and macro F1, mean +- sample standard deviation over seeds.

With ``--out`` it also writes ``<out>/delight_sentiment_accuracy.png``: the test accuracy after
each epoch (``test_epoch/acc``, logged when ``data.test_each_epoch`` is on), mean over seeds with
a band of +- one standard deviation.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from src.utils.extras import require

# The report's tables ("execution times for different models", "number of parameters for
# different models"); it gives one parameter count per scaling setting (the shuffle has none).
VARIANTS = ("DeLighT Scale+Shift", "DeLighT Scale", "DeLighT Shift", "DeLighT", "Transformer")
REPORT_TIME_S = {
    "DeLighT Scale+Shift": 2220,
    "DeLighT Scale": 2204,
    "DeLighT Shift": 2206,
    "DeLighT": 2198,
    "Transformer": 2230,
}
REPORT_PARAMS = {
    "DeLighT Scale+Shift": 268_325,
    "DeLighT Scale": 268_325,
    "DeLighT Shift": 224_701,
    "DeLighT": 224_701,
    "Transformer": 222_337,
}
CURVE_KEY = "test_epoch/acc"


@dataclass
class Run:
    """One finished run: its variant, seed, size, time, test metrics and per-epoch test curve."""

    variant: str
    flags: str
    seed: int
    params: int
    wall_time_s: float
    test_acc: float
    test_f1: float
    curve: dict[int, float] = field(default_factory=dict)


def variant_of(model: dict) -> tuple[str, str]:
    """The report's name of a model config, and its explicit flags."""
    target = model["_target_"]
    if target.endswith("TransformerClassifier"):
        return "Transformer", f"nn.TransformerEncoder, FFN {model['dim_feedforward']}"
    if not target.endswith("DeLighTClassifier"):
        raise ValueError(f"not a model of the study: {target}")
    scale, shift = bool(model["block_scaling"]), bool(model["glt_shuffle"])
    name = {(True, True): "DeLighT Scale+Shift", (True, False): "DeLighT Scale",
            (False, True): "DeLighT Shift", (False, False): "DeLighT"}[(scale, shift)]  # fmt: skip
    return name, f"block_scaling={str(scale).lower()} glt_shuffle={str(shift).lower()}"


def read_curve(run_dir: Path) -> dict[int, float]:
    """``test_epoch/acc`` by epoch from the run's CSV logs (empty when it was not logged)."""
    curve: dict[int, float] = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with path.open(newline="") as file:
            for row in csv.DictReader(file):
                if row.get(CURVE_KEY):
                    curve[int(row["epoch"])] = float(row[CURVE_KEY])
    return curve


def load_runs(folders: list[Path]) -> list[Run]:
    """Every finished run of the study under ``folders``."""
    runs = []
    for metrics_path in sorted(p for folder in folders for p in folder.rglob("metrics.json")):
        run_dir = metrics_path.parent
        summary = json.loads(metrics_path.read_text())
        config_path = run_dir / ".hydra" / "config.yaml"
        if summary.get("status") != "finished" or not config_path.is_file():
            continue
        config = OmegaConf.to_container(OmegaConf.load(config_path), resolve=False)
        variant, flags = variant_of(config["model"])
        metrics = summary["metrics"]
        runs.append(
            Run(
                variant=variant,
                flags=flags,
                seed=int(config["seed"]),
                params=int(summary["params"]),
                wall_time_s=float(summary["wall_time_s"]),
                test_acc=float(metrics["test/acc"]),
                test_f1=float(metrics["test/f1"]),
                curve=read_curve(run_dir),
            )
        )
    return runs


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def by_variant(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs grouped by variant, in the report's order."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.variant].append(run)
    return {name: sorted(groups[name], key=lambda r: r.seed) for name in VARIANTS if name in groups}


def tables(runs: list[Run]) -> str:
    """The study's Markdown tables (see the module docstring)."""
    groups = by_variant(runs)
    lines = [
        "| Variant | Flags | Params (here) | Params (report) "
        "| Time, s (here, mean) | Time (report, s) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, group in groups.items():
        params = sorted({r.params for r in group})
        time_mean, time_std = mean_std([r.wall_time_s for r in group])
        lines.append(
            f"| {name} | {group[0].flags} | {', '.join(f'{p:,}' for p in params)} | "
            f"{REPORT_PARAMS[name]:,} | {time_mean:.1f} ± {time_std:.1f} | "
            f"{REPORT_TIME_S[name]:,} |"
        )
    lines += [
        "",
        "| Variant | Seeds | Test accuracy (%) | Test macro F1 (%) | Per seed (acc %) |",
        "|---|---:|---:|---:|---|",
    ]
    for name, group in groups.items():
        acc, acc_std = mean_std([100 * r.test_acc for r in group])
        f1, f1_std = mean_std([100 * r.test_f1 for r in group])
        seeds = ", ".join(f"{r.seed}: {100 * r.test_acc:.2f}" for r in group)
        lines.append(
            f"| {name} | {len(group)} | {acc:.2f} ± {acc_std:.2f} | "
            f"{f1:.2f} ± {f1_std:.2f} | {seeds} |"
        )
    return "\n".join(lines)


def plot_curves(runs: list[Run], path: Path) -> Path:
    """Test accuracy per epoch, mean over seeds with a +- one standard deviation band."""
    require("matplotlib", "demos", "the accuracy plot (--out)")
    import matplotlib  # an extra: imported where used

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for name, group in by_variant(runs).items():
        epochs = sorted(set.intersection(*(set(r.curve) for r in group)))
        if not epochs:
            continue
        stats = [mean_std([100 * r.curve[e] for r in group]) for e in epochs]
        means = [m for m, _ in stats]
        x = [e + 1 for e in epochs]
        axes.plot(x, means, marker="o", label=name)
        axes.fill_between(x, [m - s for m, s in stats], [m + s for m, s in stats], alpha=0.2)
    axes.set_xlabel("epoch")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    axes.set_ylabel("test accuracy (%)")
    axes.set_title("Tweets sentiment (3 classes): mean ± std over seeds")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="run or multirun directories")
    parser.add_argument("--out", type=Path, help="write delight_sentiment_accuracy.png here")
    args = parser.parse_args(argv)
    runs = load_runs(args.folders)
    if not runs:
        parser.error(f"no finished run (metrics.json + .hydra/config.yaml) under {args.folders}")
    text = tables(runs)
    if args.out is not None:
        plot = plot_curves(runs, args.out / "delight_sentiment_accuracy.png")
        text += f"\n\nplot: {plot}"
    print(text)
    return text
