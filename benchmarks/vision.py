"""Inference latency of DiCENet and ESPNetv2 against torchvision ShuffleNetV2 x1.0 and MobileNetV2.

All networks run in one process at 224x224, eval mode, no grad, interleaved round-robin so that
machine drift affects all alike; the median of ``--repeats`` runs is reported per batch size,
next to the MACs of one image (the thesis's Table 3.5 on this machine) and the ratio to
ShuffleNetV2 x1.0's latency. DiCE units and EESP pyramids run the fused C++ kernels of
``src/kernels/cpu`` where they are built; ``dicenet_eager_folded`` and ``espnetv2_eager_folded`` are
the s=1.0 networks on the eager folded path, for comparison. Prints
a table, then one JSON line per measurement: ``{"model", "scale", "batch", "ms", "macs"}``.

    python benchmarks/vision.py [--threads 2] [--repeats 21] [--batches 1 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchvision
from torch import nn

from benchmarks.common import print_json_lines
from src.kernels.cpu import cpu_kernels
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.ops.dice import DiCE
from src.ops.eesp import EESP
from src.utils.complexity import measure

BASELINE = "shufflenet_v2_x1_0"


def without_cpu_kernel(net: nn.Module) -> nn.Module:
    """``net`` with every DiCE and EESP on its eager folded path instead of the fused C++
    kernels."""
    for module in net.modules():
        if isinstance(module, (DiCE, EESP)):
            module.cpu_kernel = False
    return net


def networks() -> list[tuple[str, float | None, nn.Module]]:
    """(name, scale, network) for every measured model; torchvision names as torchvision has
    them."""
    nets: list[tuple[str, float | None, nn.Module]] = []
    for name, build in (("dicenet", DiCENet), ("espnetv2", ESPNetv2)):
        nets += [(name, s, build(scale=s)) for s in (0.5, 1.0, 1.5)]
        if cpu_kernels():
            nets.append((f"{name}_eager_folded", 1.0, without_cpu_kernel(build(scale=1.0))))
    nets += [
        (name, None, torchvision.models.get_model(name))
        for name in ("shufflenet_v2_x1_0", "mobilenet_v2")
    ]
    return nets


def milliseconds(net: nn.Module, x: torch.Tensor) -> float:
    start = time.perf_counter()
    net(x)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    nets = networks()
    macs = {}
    for name, scale, net in nets:
        net.eval()
        macs[(name, scale)] = measure(net, torch.zeros(1, 3, 224, 224)).macs
    rows = []
    with torch.no_grad():
        for batch in args.batches:
            x = torch.randn(batch, 3, 224, 224)
            for _, _, net in nets:  # warm-up: allocations and oneDNN kernel builds
                for _ in range(3):
                    net(x)
            samples: dict[tuple[str, float | None], list[float]] = {(n, s): [] for n, s, _ in nets}
            for _ in range(args.repeats):
                for name, scale, net in nets:
                    samples[(name, scale)].append(milliseconds(net, x))
            for (name, scale), values in samples.items():
                rows.append(
                    {
                        "model": name,
                        "scale": scale,
                        "batch": batch,
                        "ms": round(statistics.median(values), 3),
                        "macs": macs[(name, scale)],
                    }
                )

    path = "the fused C++ kernels" if cpu_kernels() else "eager folded calls (kernels not built)"
    print(
        f"DiCE and EESP in CPU inference: {path}; {args.threads} threads, median of {args.repeats}"
    )
    baseline = {row["batch"]: row["ms"] for row in rows if row["model"] == BASELINE}
    print(f"{'model':<22}{'scale':>7}{'batch':>7}{'ms':>10}{'MMACs':>10}{'x ' + BASELINE:>26}")
    for row in rows:
        scale = "" if row["scale"] is None else f"{row['scale']:g}"
        ratio = row["ms"] / baseline[row["batch"]]
        print(
            f"{row['model']:<22}{scale:>7}{row['batch']:>7}{row['ms']:>10.2f}"
            f"{row['macs'] / 1e6:>10.1f}{ratio:>26.2f}"
        )
    print_json_lines(rows)


if __name__ == "__main__":
    main()
