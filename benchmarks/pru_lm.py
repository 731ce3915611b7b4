"""Tokens per second of a PRU layer against ``nn.LSTM`` layers, at the PTB language model's sizes.

Thesis Table 4.1 compares the PRU (g = 4, K = 2, M = 1400) with LSTMs of about the same total
size. Here, one recurrent layer of that model (N = 400 -> M = 1400, the first layer), against
(a) ``nn.LSTM`` 400 -> M' with M' chosen so that the parameters are equal (the thesis's comparison)
and (b) ``nn.LSTM`` 400 -> 1400 (same hidden size, 2.6x the parameters). All run in one process,
interleaved round-robin, on a (T, B) = (bptt, batch) window; median of ``--repeats``. Reported:
training tokens/s (forward + backward) and inference tokens/s (no grad), and the ratio to the
equal-parameter LSTM.

``nn.LSTM`` runs one fused kernel per layer (cuDNN on the GPU, a fused MKL/oneDNN path on the CPU);
the PRU runs its pyramidal transformation once over all steps and then a Python loop of a grouped
matrix product and the cell's element-wise update per step. ``--compile`` also times the PRU under
``torch.compile``, which fuses the per-step element-wise work (the loop itself remains).

    python benchmarks/pru_lm.py [--device cpu|cuda] [--threads 2] [--repeats 7] [--bptt 70]
        [--batch 20] [--compile]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.common import (
    lstm_hidden_for,
    parameter_count,
    print_json_lines,
    print_text_table,
    run_once,
)
from src.ops.pru import PRU

INPUT, HIDDEN, GROUPS, LEVELS = 400, 1400, 4, 2  # thesis Table 4.1 row 20, layer 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile(PRU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)

    pru = PRU(INPUT, HIDDEN, groups=GROUPS, levels=LEVELS)
    equal = lstm_hidden_for(parameter_count(pru), INPUT)
    layers: dict[str, nn.Module] = {
        f"PRU(g={GROUPS}, K={LEVELS}, M={HIDDEN})": pru,
        f"nn.LSTM(M={equal}, equal params)": nn.LSTM(INPUT, equal),
        f"nn.LSTM(M={HIDDEN})": nn.LSTM(INPUT, HIDDEN),
    }
    if args.compile:
        layers[f"compiled PRU(g={GROUPS}, K={LEVELS}, M={HIDDEN})"] = torch.compile(pru)
    for layer in layers.values():
        layer.to(device)
    x = torch.randn(args.bptt, args.batch, INPUT, device=device)
    tokens = args.bptt * args.batch

    def train(layer: nn.Module) -> Callable[[], None]:
        def step() -> None:
            layer.zero_grad(set_to_none=True)
            out, _ = layer(x)
            out.float().pow(2).mean().backward()

        return step

    def infer(layer: nn.Module) -> Callable[[], None]:
        def step() -> None:
            with torch.no_grad():
                layer(x)

        return step

    times: dict[str, dict[str, list[float]]] = {name: {"train": [], "infer": []} for name in layers}
    for layer in layers.values():  # warm-up (and compilation)
        train(layer)()
        infer(layer)()
    for _ in range(args.repeats):
        for name, layer in layers.items():
            times[name]["train"].append(run_once(train(layer), device))
            times[name]["infer"].append(run_once(infer(layer), device))

    reference = f"nn.LSTM(M={equal}, equal params)"
    rows = []
    for name, layer in layers.items():
        train_tps = tokens / statistics.median(times[name]["train"])
        infer_tps = tokens / statistics.median(times[name]["infer"])
        rows.append(
            {
                "layer": name,
                "params": parameter_count(layer),
                "train_tokens_s": round(train_tps),
                "infer_tokens_s": round(infer_tps),
            }
        )
    base = next(row for row in rows if row["layer"] == reference)
    for row in rows:
        row["train_vs_equal_lstm"] = round(row["train_tokens_s"] / base["train_tokens_s"], 3)
        row["infer_vs_equal_lstm"] = round(row["infer_tokens_s"] / base["infer_tokens_s"], 3)
        row.update(device=str(device), threads=args.threads, bptt=args.bptt, batch=args.batch)

    print(f"one recurrent layer, {INPUT} -> M, (T, B) = ({args.bptt}, {args.batch}), {device}")
    header = (
        f"{'layer':<40} {'params':>10} {'train tok/s':>12} {'x':>6} {'infer tok/s':>12} {'x':>6}"
    )
    print_text_table(header, (
        f"{row['layer']:<40} {row['params']:>10,} {row['train_tokens_s']:>12,} "
        f"{row['train_vs_equal_lstm']:>6.2f} {row['infer_tokens_s']:>12,} "
        f"{row['infer_vs_equal_lstm']:>6.2f}"
        for row in rows
    ))  # fmt: skip
    print_json_lines(rows)


if __name__ == "__main__":
    main()
