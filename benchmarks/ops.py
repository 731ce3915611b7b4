"""Speed of every op against a step-by-step PyTorch implementation of what the paper describes.

Each family module in ``benchmarks/op_cases/`` lists its cases at the paper models' shapes. For
every case and pass (forward; forward+backward) the two implementations run in the same process,
interleaved, and the median of ``--repeats`` samples is reported (the best too, in the JSON; on a
shared 2-core machine the best sample of two identical paths differed by up to 12%, their medians
by 1-3%). Prints a table, then one JSON line
per op and pass: ``{"op", "pass", "shape", "ours_ms", "baseline_ms", "speedup"}`` (plus GFLOP/s
against a dense GEMM of equal FLOPs where a case defines one). ``--control`` times ours a second
time in the same rounds and adds the A/A ratio: a row's speedup means little closer to 1 than that.

    python benchmarks/ops.py [--device cpu|cuda] [--threads 2] [--repeats 21] [--only delight]
        [--control]

On the CPU, ``ours`` is what a user gets: with ``LIGHTNETS_CPU_KERNELS`` unset, the ops whose
faster path depends on the machine time theirs against ATen's on first use (in the warm-up here)
and run the winner. As an AVX2 CPU on an AVX-512 machine: ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/ops.py``.
"""

from __future__ import annotations

import argparse
import importlib
import math
import pkgutil
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks import op_cases
from benchmarks.common import print_json_lines, print_text_table, synchronize
from benchmarks.op_cases import OpCase
from src.kernels.choices import cpu_signature
from src.kernels.environment import cpu_path_mode

# A sample is at least this long: the forward of a small op takes ~20 us, where the timer's and
# the scheduler's jitter alone moved a row of two identical paths to 0.95x
MIN_SAMPLE_MS = 2.0


def one_run(
    fn: Callable[[], torch.Tensor], backward: bool, device: torch.device, calls: int = 1
) -> float:
    """Milliseconds of one forward (no grad) or forward+backward call: the mean of ``calls``
    back-to-back calls."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        if backward:
            out = fn()
            out.backward(torch.ones_like(out))
        else:
            with torch.no_grad():
                fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3 / calls


def time_interleaved(
    fns: dict[str, Callable], backward: bool, repeats: int, device: torch.device
) -> dict[str, tuple[float, float]]:
    """(best, median) milliseconds of each function, run round-robin so drift affects all alike (in
    alternating order); each sample repeats the call until it lasts :data:`MIN_SAMPLE_MS` (the
    same count for all)."""
    warm = {}
    for name, fn in fns.items():  # warm-up (allocations, kernel compilation, measured choices)
        warm[name] = min(one_run(fn, backward, device) for _ in range(3))
    calls = max(1, math.ceil(MIN_SAMPLE_MS / max(min(warm.values()), 1e-3)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for round_ in range(repeats):
        # every other round reversed: none always runs first (or right after another's call)
        for name, fn in order if round_ % 2 == 0 else order[::-1]:
            samples[name].append(one_run(fn, backward, device, calls))
    return {name: (min(values), statistics.median(values)) for name, values in samples.items()}


def load_cases(device: torch.device, only: list[str] | None) -> list[OpCase]:
    cases = []
    for module in pkgutil.iter_modules(op_cases.__path__):
        if only and module.name not in only:
            continue
        cases += importlib.import_module(f"benchmarks.op_cases.{module.name}").cases(device)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--only", nargs="*", help="family modules to run, e.g. delight dice")
    parser.add_argument(
        "--control",
        action="store_true",
        help="also time ours a second time, interleaved with the rest: the A/A ratio of each row "
        "is how far two identical paths drift apart on this machine in this run",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    rows = []
    for case in load_cases(device, args.only):
        for backward in (False, True):
            fns = {"ours": case.ours, "baseline": case.baseline}
            if case.dense is not None:
                fns["dense"] = case.dense
            if args.control:
                fns["ours_again"] = case.ours
            timings = time_interleaved(fns, backward, args.repeats, device)
            ms = {name: median for name, (_, median) in timings.items()}
            row = {
                "op": case.op,
                "pass": "fwd+bwd" if backward else "fwd",
                "shape": case.shape,
                "device": device.type,
                "ours_ms": round(ms["ours"], 3),
                "baseline_ms": round(ms["baseline"], 3),
                "speedup": round(ms["baseline"] / ms["ours"], 3),
                "ours_best_ms": round(timings["ours"][0], 3),
                "baseline_best_ms": round(timings["baseline"][0], 3),
            }
            if args.control:
                row["control"] = round(ms["ours_again"] / ms["ours"], 3)
            if case.flops is not None:
                flops = case.flops * (3 if backward else 1)  # backward: two GEMMs per forward GEMM
                row["ours_gflops"] = round(flops / ms["ours"] / 1e6, 2)
                if "dense" in ms:
                    row["dense_gflops"] = round(flops / ms["dense"] / 1e6, 2)
                    row["fraction_of_dense"] = round(ms["dense"] / ms["ours"], 3)
            rows.append(row)

    if device.type == "cpu":
        # which machine, and which CPU paths ran (LIGHTNETS_CPU_KERNELS: auto measures per shape)
        print(f"# {cpu_signature()} | {args.threads} threads | CPU paths {cpu_path_mode()}")
    header = (
        f"{'op':<34}{'pass':<9}{'shape':<40}{'ours ms':>10}{'base ms':>10}"
        f"{'speedup':>9}{'of dense':>10}"
    )
    if args.control:
        header += f"{'A/A':>7}"

    def line(row: dict) -> str:
        dense = f"{row['fraction_of_dense']:.2f}" if "fraction_of_dense" in row else ""
        return (
            f"{row['op']:<34}{row['pass']:<9}{row['shape']:<40}{row['ours_ms']:>10.3f}"
            f"{row['baseline_ms']:>10.3f}{row['speedup']:>9.2f}{dense:>10}"
            + (f"{row['control']:>7.2f}" if args.control else "")
        )

    print_text_table(header, map(line, rows))
    if args.control and rows:
        spread = [abs(row["control"] - 1) for row in rows]
        print(
            f"# A/A: two identical paths differed by up to {max(spread):.1%} "
            f"(median {statistics.median(spread):.1%}) in this run"
        )
    print_json_lines(rows)


if __name__ == "__main__":
    main()
