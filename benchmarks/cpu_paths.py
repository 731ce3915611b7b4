"""Training steps of DiCENet and ESPNetv2 on the CPU with the project's CPU paths against ATen's.

Three settings of ``LIGHTNETS_CPU_KERNELS`` (``src.kernels.environment.use_cpu_paths``), in one
process, interleaved round-robin in alternating order:

- ``auto``: what a user gets (the C++ kernels and row products, with BatchNorm's backward, DimConv
  and the point-wise convolutions choosing per shape between theirs and ATen's by measurement;
  the first steps here take those choices);
- ``1``: the project's paths wherever they apply, nothing measured;
- ``0``: ATen's (oneDNN's) paths everywhere.

A step is the task's: channels-last network and images, forward, cross-entropy, backward, SGD
with momentum. The table gives the median milliseconds of ``--repeats`` steps per network and
setting and each setting's speed relative to ATen's (above 1: faster); one JSON line per network
follows. To see an AVX2 CPU on an AVX-512 machine: ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/cpu_paths.py``.

    python benchmarks/cpu_paths.py [--threads 2] [--batch 4] [--size 224] [--repeats 11]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import print_json_lines, print_text_table
from src.kernels.choices import cpu_signature
from src.kernels.environment import use_cpu_paths
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.utils.memory_format import channels_last_network

MODES = ("auto", "1", "0")
NETWORKS = {"dicenet": DiCENet, "espnetv2": ESPNetv2}


def training_step(net: nn.Module, optimizer: torch.optim.Optimizer, images, labels) -> None:
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(net(images), labels).backward()
    optimizer.step()


def time_steps(net: nn.Module, images, labels, repeats: int, warmup: int) -> dict[str, float]:
    """Median milliseconds of a training step under each mode of :data:`MODES`."""
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    for mode in MODES:  # the measured choices, built kernels, allocator warm
        with use_cpu_paths(mode):
            for _ in range(warmup):
                training_step(net, optimizer, images, labels)
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_ in range(repeats):
        for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
            with use_cpu_paths(mode):
                start = time.perf_counter()
                training_step(net, optimizer, images, labels)
                samples[mode].append((time.perf_counter() - start) * 1e3)
    return {mode: statistics.median(values) for mode, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=224, help="image height = width")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    rows = []
    for name in args.networks:
        net = channels_last_network(NETWORKS[name](scale=args.scale, num_classes=1000)).train()
        images = torch.randn(args.batch, 3, args.size, args.size)
        images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (args.batch,))
        ms = time_steps(net, images, labels, args.repeats, args.warmup)
        rows.append(
            {
                "network": name,
                "scale": args.scale,
                "batch": args.batch,
                "size": args.size,
                "threads": args.threads,
                **{f"ms_{mode}": round(value, 2) for mode, value in ms.items()},
                "auto_vs_aten": round(ms["0"] / ms["auto"], 3),
                "kernels_vs_aten": round(ms["0"] / ms["1"], 3),
            }
        )

    print(f"# {cpu_signature()} | {args.threads} threads")
    header = (
        f"{'network':<10}{'auto ms':>10}{'1 ms':>10}{'0 (ATen) ms':>13}"
        f"{'auto/ATen':>11}{'1/ATen':>9}"
    )
    print_text_table(header, (
        f"{row['network']:<10}{row['ms_auto']:>10.1f}{row['ms_1']:>10.1f}{row['ms_0']:>13.1f}"
        f"{row['auto_vs_aten']:>10.2f}x{row['kernels_vs_aten']:>8.2f}x"
        for row in rows
    ))  # fmt: skip
    print_json_lines(rows)


if __name__ == "__main__":
    main()
