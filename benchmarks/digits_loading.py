"""Does data loading in worker processes help the embedded default job?

Times, side by side in one run, one training epoch of the digits datamodule with 0, 1 and 2
worker processes: the loader alone, and the loader feeding the default network's forward and
backward pass. Prints a table, then one JSON line with times and ratios to 0 workers.

    python benchmarks/digits_loading.py [--epochs 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from src.datamodules.digits import DigitsDataModule
from src.models.hub import timm_model


def epoch_seconds(workers: int, train_step: bool, epochs: int) -> float:
    """Median wall time of one training epoch over ``epochs`` repetitions."""
    datamodule = DigitsDataModule(num_workers=workers)
    datamodule.setup("fit")
    net = timm_model("resnet10t", num_classes=10, in_chans=1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        for images, labels in datamodule.train_dataloader():
            if train_step:
                loss = torch.nn.functional.cross_entropy(net(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for train_step in (False, True):
        base = None
        for workers in (0, 1, 2):
            seconds = epoch_seconds(workers, train_step, args.epochs)
            base = base or seconds
            rows.append(
                {
                    "what": "loader + train step" if train_step else "loader only",
                    "workers": workers,
                    "epoch_s": round(seconds, 3),
                    "ratio_to_0_workers": round(seconds / base, 3),
                }
            )
    print(f"{'what':<22}{'workers':>8}{'epoch s':>10}{'vs 0':>8}")
    for row in rows:
        print(
            f"{row['what']:<22}{row['workers']:>8}{row['epoch_s']:>10.3f}{row['ratio_to_0_workers']:>8.3f}"
        )
    print(json.dumps({"threads": args.threads, "results": rows}))


if __name__ == "__main__":
    main()
