"""Each ONNX rewrite of :mod:`src.export.rewrites` measured alone and together, side by side.

DiCENet, ESPNetv2 (s = 1.0) and torchvision's ShuffleNetV2 x1.0 are exported once at batch 1,
224x224 (static shapes, as ``benchmarks/deploy.py`` exports them, so DiCE units take the
build-size graph of :func:`src.kernels.dim_conv.dim_conv_exported`), with PReLU as
``Max(x, slope x)`` (:func:`~src.export.rewrites.prelu_as_max`, the base here). Each further
rewrite is then applied to a copy of the file (``prelu_blocked``; add one to ``VARIANTS``),
and every file of every network is timed by onnxruntime (``--threads`` intra-op threads,
``ORT_ENABLE_ALL``) in one interleaved round-robin, so that drift of a shared machine affects
all alike. Prints, per network and variant, the median and minimum milliseconds, the ratio to the
network's base and to ShuffleNetV2's file of the same variant, the rewritten node count and the
largest difference from the base file's output; then one JSON object.

    python benchmarks/deploy_rewrites.py [--threads 2] [--repeats 41] [--out DIR [--reuse]]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
import torchvision

from benchmarks.deploy import export, header, round_robin, session
from src.export.rewrites import prelu_as_max, prelu_blocked
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.utils.extras import require

BASELINE = "shufflenet_v2_x1_0"
SHAPE = (1, 3, 224, 224)
# variant -> the rewrites applied after prelu_as_max
VARIANTS = {
    "base": (),
    "prelu_blocked": (prelu_blocked,),
}


def networks() -> dict[str, torch.nn.Module]:
    return {
        "dicenet": DiCENet(scale=1.0),
        "espnetv2": ESPNetv2(scale=1.0),
        BASELINE: torchvision.models.get_model(BASELINE),
    }


def variants(plain: Path, folder: Path, name: str, reuse: bool) -> dict[str, tuple[Path, int]]:
    """The variant files of the network exported to ``plain`` (no rewrite), each with how many
    nodes its rewrites replaced."""
    import onnx

    files = {}
    for variant, rewrites in VARIANTS.items():
        path = folder / f"{name}.{variant}.onnx"
        model = onnx.load(str(plain))
        prelu_as_max(model)
        count = sum(rewrite(model) for rewrite in rewrites)
        if not (reuse and path.is_file()):
            onnx.save(model, str(path))
        files[variant] = (path, count)
    return files


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, help="keep the .onnx files here")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --out: take the files already there (export on a busy machine, time on a "
        "quiet one)",
    )
    args = parser.parse_args(argv)
    require("onnxruntime", "export", "benchmarks/deploy_rewrites.py")
    torch.manual_seed(0)
    folder = args.out or Path(tempfile.mkdtemp(prefix="deploy_rewrites_"))
    folder.mkdir(parents=True, exist_ok=True)
    x = torch.randn(SHAPE)
    feeds = {"image": x.numpy()}
    runners, facts, outputs = {}, {}, {}
    for name, net in networks().items():
        plain = folder / f"{name}.plain.onnx"
        if not (args.reuse and plain.is_file()):
            export(net.eval(), x, plain, rewrite=False)
        for variant, (path, count) in variants(plain, folder, name, args.reuse).items():
            runner = session(path, args.threads)
            outputs[(name, variant)] = runner.run(None, feeds)[0]
            facts[(name, variant)] = {"rewritten": count}
            runners[(name, variant)] = lambda runner=runner: runner.run(None, feeds)
    times = round_robin(runners, args.warmup, args.repeats)
    rows = []
    for (name, variant), values in times.items():
        median, least = statistics.median(values), min(values)
        base = statistics.median(times[(name, "base")])
        peer = statistics.median(times[(BASELINE, variant)])
        difference = np.abs(outputs[(name, variant)] - outputs[(name, "base")]).max()
        rows.append(
            {
                "model": name,
                "variant": variant,
                **facts[(name, variant)],
                "ms": round(median, 3),
                "min_ms": round(least, 3),
                "vs_base": round(median / base, 3),
                f"vs_{BASELINE}": round(median / peer, 3),
                "max_abs_difference": float(difference),
            }
        )
    print(
        f"{'model':<20}{'variant':<19}{'nodes':>6}{'ms':>9}{'min ms':>9}{'/ base':>8}"
        f"{'/ SNv2':>8}{'max |diff|':>12}"
    )
    for row in rows:
        print(
            f"{row['model']:<20}{row['variant']:<19}{row['rewritten']:>6}{row['ms']:>9.2f}"
            f"{row['min_ms']:>9.2f}{row['vs_base']:>8.2f}{row[f'vs_{BASELINE}']:>8.2f}"
            f"{row['max_abs_difference']:>12.1e}"
        )
    result = {**header(args.threads, args.repeats), "rows": rows}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
