"""GPU resources of every Triton kernel launch of the models' steps, cross-compiled without a GPU.

The training step (forward and backward) and the inference forward of each model below run on the
CPU with every kernel switch on ``impl="triton"``; their Triton launches are recorded with the
GPU's launch configuration instead of running (``benchmarks/cross_compile.py``), and each
distinct launch is compiled for the GPU by Triton down to a cubin. Per kernel, dtype and tile
sizes the table gives the warps, registers per thread, spilled bytes, shared memory per block and
the occupancy (resident warps over the SM's 64) that registers and shared memory allow; the
programs are those of the recorded batch. Static figures: what a launch will get on the GPU, not
how fast it runs (``benchmarks/gpu.py`` measures that where there is one).

Models: DExTra (d_m=512, w_m=2, N=8, g_max=16) at 4,096 tokens; Group-Transformer G=2 and G=4
(enwik8 sizes: 9 layers, d_model 256, d_inner 1024) on 4 x 512 characters with a 512 memory;
DiCENet s=1.0 and ESPNetv2 s=1.0 on 2 images of 224 x 224, channels-last. Each in float32 and
under bfloat16 autocast (``--precisions``), for the A100 and the H100 (``--gpus``).

    python benchmarks/kernel_builds.py [--gpus A100 H100] [--precisions fp32 bf16 fp16]
        [--models dextra gt2 gt4 dicenet espnetv2] [--json PATH]
"""

from __future__ import annotations

import os

# kernels read this when they are defined: before anything imports them
os.environ["TRITON_INTERPRET"] = "1"

import argparse
import contextlib
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from benchmarks.common import (
    VOCAB,
    dextra_input_shape,
    dextra_unit,
    enwik8_lm,
    vision_network,
    with_impl,
)
from benchmarks.cross_compile import (
    GPUS,
    Build,
    cross_compile,
    recorded_launches,
    toolchain_missing,
    train_and_infer,
)

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
LM_BATCH, LM_LEN = 4, 512
IMAGES, IMAGE_SIZE = 2, 224


def _dextra() -> None:
    unit = with_impl(dextra_unit(), "triton")
    x = torch.randn(dextra_input_shape(4096))
    train_and_infer(unit, lambda net: net(x))


def _group_transformer(groups: int) -> Callable[[], None]:
    def run() -> None:
        net = with_impl(enwik8_lm(groups, LM_LEN), "triton")
        tokens = torch.randint(VOCAB, (LM_BATCH, LM_LEN))
        memories = [torch.zeros(LM_BATCH, LM_LEN, net.d_model) for _ in range(net.n_layer + 1)]

        def forward(net: torch.nn.Module) -> torch.Tensor:
            logits, _ = net(tokens, memories)
            return F.cross_entropy(logits.reshape(-1, VOCAB), tokens.reshape(-1))

        train_and_infer(net, forward)

    return run


def _vision(build: Callable[[], torch.nn.Module]) -> Callable[[], None]:
    def run() -> None:
        net = with_impl(build(), "triton").to(memory_format=torch.channels_last)
        x = torch.randn(IMAGES, 3, IMAGE_SIZE, IMAGE_SIZE).to(memory_format=torch.channels_last)
        train_and_infer(net, lambda net: net(x))

    return run


MODELS: dict[str, Callable[[], None]] = {
    "dextra": _dextra,
    "gt2": _group_transformer(2),
    "gt4": _group_transformer(4),
    "dicenet": _vision(lambda: vision_network("dicenet", IMAGE_SIZE)),
    "espnetv2": _vision(lambda: vision_network("espnetv2", IMAGE_SIZE)),
}


def _row(build: Build, model: str, precision: str) -> dict:
    tiles = {k: v for k, v in build.constants.items() if k.startswith("BLOCK")}
    return {
        "part": "kernel_build", "gpu": build.gpu, "model": model, "precision": precision,
        "kernel": build.name, "dtype": build.dtypes[0], "tiles": tiles,
        "programs": build.programs, "error": build.error, "num_warps": build.num_warps,
        "registers": build.registers, "spill_bytes": build.spill_bytes,
        "shared_bytes": build.shared_bytes, "occupancy": round(build.occupancy, 3),
    }  # fmt: skip


def _print_table(rows: list[dict]) -> None:
    """One line per GPU, model, precision, kernel, dtype and tiles: the worst of its builds (they
    differ in the other constants: kernel sizes, dilations, bias...), with how many there are."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        tiles = "x".join(str(v) for v in r["tiles"].values())
        key = (r["gpu"], r["model"], r["precision"], r["kernel"], r["dtype"], tiles)
        groups.setdefault(key, []).append(r)
    header = (
        f"{'gpu':5} {'model':8} {'prec':4} {'kernel':28} {'dtype':8} {'tiles':10} {'n':>2} "
        f"{'progs':>5} {'warps':>5} {'regs':>4} {'spill':>5} {'smem':>6} {'occ':>5}"
    )
    print(header)
    print("-" * len(header))
    for (gpu, model, precision, kernel, dtype, tiles), group in groups.items():
        errors = [r["error"] for r in group if r["error"]]
        if errors:
            print(f"{gpu:5} {model:8} {precision:4} {kernel:28} ERROR {errors[0]}")
            continue
        print(
            f"{gpu:5} {model:8} {precision:4} {kernel:28} {dtype:8} {tiles:10} {len(group):2d} "
            f"{max(r['programs'] for r in group):5d} {group[0]['num_warps']:5d} "
            f"{max(r['registers'] for r in group):4d} {max(r['spill_bytes'] for r in group):5d} "
            f"{max(r['shared_bytes'] for r in group):6d} {min(r['occupancy'] for r in group):5.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", nargs="+", choices=sorted(GPUS), default=["A100", "H100"])
    parser.add_argument(
        "--precisions", nargs="+", choices=list(PRECISIONS), default=["fp32", "bf16"]
    )
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--json", type=Path, help="also write the JSON lines to this file")
    args = parser.parse_args()
    missing = toolchain_missing()
    if missing:
        sys.exit(f"cannot cross-compile here: {missing}")
    torch.manual_seed(0)
    rows = []
    for gpu_name in args.gpus:
        gpu = GPUS[gpu_name]
        for model in args.models:
            for precision in args.precisions:
                dtype = PRECISIONS[precision]
                print(f"... {gpu.name}: {model}, {precision}", file=sys.stderr, flush=True)
                autocast = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
                with recorded_launches(gpu) as launches, autocast:
                    MODELS[model]()
                # one row per kernel, dtype and tiles in a model: the largest grid of its launches
                distinct: dict[str, dict] = {}
                for build in cross_compile(launches, gpu):
                    row = _row(build, model, precision)
                    key = json.dumps(
                        {k: v for k, v in row.items() if k != "programs"}, sort_keys=True
                    )
                    if key not in distinct or row["programs"] > distinct[key]["programs"]:
                        distinct[key] = row
                rows += distinct.values()
    _print_table(rows)
    failed = [r for r in rows if r["error"] or r["spill_bytes"]]
    lines = [json.dumps(r) for r in rows]
    lines.append(
        json.dumps(
            {
                "part": "environment", "torch": torch.__version__, "triton": triton.__version__,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "builds": len(rows), "failed_or_spilling": len(failed),
            }
        )
    )  # fmt: skip
    print("\n".join(lines))
    if args.json:
        args.json.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
