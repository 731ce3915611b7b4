"""Batch-1 latency of the deployed networks: eager PyTorch against onnxruntime fp32 and int8.

DiCENet and ESPNetv2 (s = 1.0) and torchvision's ShuffleNetV2 x1.0 and MobileNetV2 classify one
224x224 image (variants: ``_plain`` without the rewrites of :mod:`src.export.rewrites`, as exported
before them; ``dicenet_prelu_node`` also with ONNX's own ``PRelu`` node instead of the Max/Min
form); the ESPNetv2 and DiCENet segmentation networks label one 512x256 (W x H) image; SSD300
with the DiCENet s = 1.0 and ESPNetv2 s = 2.0 backbones (VOC's 21 classes) gives its priors'
offsets and logits for one 300x300 image (decoding and NMS are not timed: they are the caller's,
as ``export.py`` exports SSD). Each
network is exported the same way (``torch.onnx.export``, dynamo exporter, opset 18, static
batch-1 shapes, eval mode, the rewrites of :mod:`src.export.rewrites` as ``export.py`` applies
them) and run by onnxruntime on the CPU with ``--threads`` intra-op threads (``ORT_ENABLE_ALL``;
the ``ext`` column: ``ORT_ENABLE_EXTENDED``, without the NCHWc layout); int8 is onnxruntime's
static QDQ quantisation (per-channel weights) of the dense products
(:func:`src.export.quantize.dense_nodes`, as ``export.py`` does; the ``int8 all`` column: of every
operator, as before) calibrated on ``--calibration`` random images: enough to time it, not to
judge its accuracy (export.py calibrates on the training split and measures the metric). Eager
PyTorch runs our CPU inference path (fused kernels and folded BatchNorm where built). All
measurements are interleaved round-robin so that machine drift affects all alike; each is the
median of ``--repeats`` runs after ``--warmup`` (and the minimum, less disturbed by other jobs on
shared cores). Prints a table with the ratios the deployment targets name (DiCENet's fp32 latency
over ShuffleNetV2's, each int8 speed-up over its fp32), then one JSON object.

With ``--executorch`` (the ``[executorch]`` extra) the networks are also lowered to XNNPACK
ExecuTorch programs, fp32 and, for the classifiers and SSD, int8 (PT2E with the XNNPACK
quantizer, as ``export.py format=executorch`` does), and timed through the Python runtime in a
round-robin of their own after the others (XNNPACK's thread pool stays busy after a call and
slowed the next runner).

    python benchmarks/deploy.py [--threads 2] [--repeats 21] [--out /tmp/deploy] [--executorch]
    python benchmarks/deploy.py --out /tmp/deploy --reuse   # measure the files written before
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch import nn

from src.export.onnx import custom_translations
from src.export.quantize import dense_nodes
from src.export.rewrites import prelu_as_max, prelu_blocked
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.models.segmentation import dicenet_segmentation, espnetv2_segmentation
from src.models.ssd import SSD
from src.utils.complexity import measure
from src.utils.extras import require

BASELINE = "shufflenet_v2_x1_0"
CLASSIFICATION = (1, 3, 224, 224)
SEGMENTATION = (1, 3, 256, 512)  # 512x256 (W x H), the Cityscapes stage-1 size
DETECTION = (1, 3, 300, 300)  # SSD300


def networks() -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    """(name, network in eval mode, input shape) of every measured network."""
    nets = [
        ("dicenet", DiCENet(scale=1.0), CLASSIFICATION),
        ("dicenet_plain", DiCENet(scale=1.0), CLASSIFICATION),
        ("dicenet_prelu_node", DiCENet(scale=1.0), CLASSIFICATION),
        ("espnetv2", ESPNetv2(scale=1.0), CLASSIFICATION),
        ("espnetv2_plain", ESPNetv2(scale=1.0), CLASSIFICATION),
        *(
            (name, torchvision.models.get_model(name), CLASSIFICATION)
            for name in (BASELINE, "mobilenet_v2")
        ),
        ("dicenet_seg", dicenet_segmentation(scale=1.0, num_classes=20), SEGMENTATION),
        ("espnetv2_seg", espnetv2_segmentation(scale=1.0, num_classes=20), SEGMENTATION),
        ("ssd_dicenet", SSD(21, backbone="dicenet", scale=1.0), DETECTION),
        ("ssd_espnetv2", SSD(21, backbone="espnetv2", scale=2.0), DETECTION),
    ]
    return [(name, net.eval(), shape) for name, net, shape in nets]


def export(
    net: nn.Module, x: torch.Tensor, path: Path, project_prelu: bool = True, rewrite: bool = True
) -> Path:
    """``net`` at ``x``'s shape as ONNX; ``project_prelu``: PReLU as Max/Min/Mul/Add
    (:func:`src.export.onnx.prelu_as_min_max`) instead of onnxruntime's slow ``PRelu`` node;
    ``rewrite``: with the rewrites of :mod:`src.export.rewrites`."""
    import onnx

    with torch.no_grad():
        program = torch.onnx.export(
            net,
            (x,),
            dynamo=True,
            opset_version=18,
            input_names=["image"],
            custom_translation_table=custom_translations() if project_prelu else None,
        )
    program.save(str(path))
    if rewrite:
        model = onnx.load(str(path))
        prelu_as_max(model)
        prelu_blocked(model)
        onnx.save(model, str(path))
    return path


def quantize(
    fp32: Path,
    shape: tuple[int, ...],
    count: int,
    path: Path,
    every_op: bool = False,
    nodes: list[str] | None = None,
) -> Path:
    """The int8 QDQ file of ``fp32``: its dense products, ``every_op`` the quantizer takes, or the
    named ``nodes`` (of the pre-processed graph)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    class RandomImages(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.batches = iter(
                [{"image": rng.standard_normal(shape, dtype=np.float32)} for _ in range(count)]
            )

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    prepared = path.with_suffix(".prep.onnx")
    quant_pre_process(str(fp32), str(prepared))
    quantize_static(
        str(prepared),
        str(path),
        RandomImages(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_quantize=None if every_op else nodes or dense_nodes(onnx.load(str(prepared))),
    )
    return path


def session(path: Path, threads: int, extended: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # onnxruntime's workers spin-wait after a run by default, taking the cores from the runner
    # timed next in the round-robin (eager DiCENet's median was twice its minimum): off
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        if extended
        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def profile(path: Path, feeds: dict, threads: int, runs: int = 10, top: int = 6) -> list[dict]:
    """Where onnxruntime spends a run of ``path``: the ``top`` node types by share of kernel time
    (its ``enable_profiling`` trace over ``runs`` runs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(path.with_suffix(""))
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        sess.run(None, feeds)
    trace = json.loads(Path(sess.end_profiling()).read_text())
    by_type: dict[str, float] = {}
    for event in trace:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            op = event.get("args", {}).get("op_name", "?")
            by_type[op] = by_type.get(op, 0.0) + event["dur"]
    total = sum(by_type.values()) or 1.0
    ranked = sorted(by_type.items(), key=lambda item: -item[1])[:top]
    return [
        {"op": op, "share": round(us / total, 3), "ms_per_run": round(us / runs / 1e3, 3)}
        for op, us in ranked
    ]


def executorch_runs(
    net: nn.Module,
    x: torch.Tensor,
    stem: Path,
    calibration: int,
    runs: dict,
    reuse: bool = False,
    int8: bool = True,
) -> dict[str, float]:
    """Lower ``net`` to XNNPACK ExecuTorch programs, fp32 and (``int8``) int8 (PT2E, XNNPACK
    quantizer, calibrated on random images) as ``export.py format=executorch`` does (``reuse``:
    take the programs already at ``stem``); adds their loaded programs to ``runs`` and returns
    their sizes and the fp32 program's error against eager."""
    from src.export.executorch import export_executorch, load_program
    from src.export.spec import ExportSpec

    with torch.no_grad():
        expected = net(x)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    names = ["locations", "scores"] if len(expected) == 2 else ["logits"]
    spec = ExportSpec("network", net, (x,), ["image"], names)
    fp32 = stem.with_suffix(".pte")
    if not (reuse and fp32.is_file()):
        export_executorch(spec, fp32)
    runs["executorch_fp32"] = load_program(fp32)
    got = runs["executorch_fp32"]([x])
    error = max((a - b).abs().max().item() for a, b in zip(got, expected))
    info = {"executorch_fp32_max_abs_error": error, "pte_mb": round(fp32.stat().st_size / 2**20, 2)}
    if int8:
        quantized = stem.with_suffix(".int8.pte")
        if not (reuse and quantized.is_file()):
            images = [(torch.randn_like(x),) for _ in range(calibration)]
            export_executorch(spec, quantized, calibration=images)
        runs["executorch_int8"] = load_program(quantized)
        info["pte_int8_mb"] = round(quantized.stat().st_size / 2**20, 2)
    return info


def header(threads: int, repeats: int) -> dict:
    """What a deployment timing ran with, for the head of its JSON."""
    import onnxruntime

    return {
        "threads": threads,
        "repeats": repeats,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def round_robin(
    runners: dict[tuple[str, str], Callable[[], object]], warmup: int, repeats: int
) -> dict[tuple[str, str], list[float]]:
    """Milliseconds of each of ``repeats`` calls of every runner, the runners called in turn
    (after ``warmup`` rounds) so that machine drift affects all alike."""
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runners}
    with torch.no_grad():
        for _ in range(warmup):
            for run in runners.values():
                run()
        for _ in range(repeats):
            for key, run in runners.items():
                start = time.perf_counter()
                run()
                times[key].append(1e3 * (time.perf_counter() - start))
    return times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--calibration", type=int, default=8, help="random images for int8 calibration"
    )
    parser.add_argument("--only", nargs="*", help="network names to measure (default: all)")
    parser.add_argument(
        "--out", type=Path, help="keep the .onnx files here (default: a temporary folder)"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --out: take the .onnx (and .pte) files already there instead of exporting "
        "again (export on a busy machine, then measure on a quiet one)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="add onnxruntime's per-op-type time shares"
    )
    parser.add_argument(
        "--executorch",
        action="store_true",
        help="add ExecuTorch XNNPACK programs: fp32, int8 of the classifiers and SSD "
        "(minutes to lower)",
    )
    args = parser.parse_args(argv)
    require("onnxruntime", "export", "benchmarks/deploy.py")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder = args.out or Path(tempfile.mkdtemp(prefix="deploy_"))
    folder.mkdir(parents=True, exist_ok=True)

    runners: dict[tuple[str, str], object] = {}
    info: dict[str, dict] = {}
    for name, net, shape in networks():
        if args.only and name not in args.only:
            continue
        x = torch.randn(shape)
        plain = name.endswith(("_plain", "_prelu_node"))
        reuse = args.reuse and args.out is not None
        fp32, int8 = folder / f"{name}.onnx", folder / f"{name}.int8.onnx"
        if not (reuse and fp32.is_file()):
            export(net, x, fp32, project_prelu=not name.endswith("_prelu_node"), rewrite=not plain)
        if not (reuse and int8.is_file()):
            quantize(fp32, shape, args.calibration, int8)
        classifier = list(shape) == list(CLASSIFICATION)
        with torch.no_grad():
            reference = net(x)
            reference = reference[0] if isinstance(reference, (tuple, list)) else reference
        feeds = {"image": x.numpy()}
        runs = {
            "onnxruntime_fp32": session(fp32, args.threads),
            "onnxruntime_int8": session(int8, args.threads),
        }
        if classifier:  # the variants: without the NCHWc layout, int8 of every operator
            runs["onnxruntime_fp32_extended"] = session(fp32, args.threads, extended=True)
            every_op = folder / f"{name}.int8_every_op.onnx"
            if not (reuse and every_op.is_file()):
                quantize(fp32, shape, args.calibration, every_op, every_op=True)
            runs["onnxruntime_int8_every_op"] = session(every_op, args.threads)
        exported = runs["onnxruntime_fp32"].run(None, feeds)[0]
        info[name] = {
            "input": list(shape),
            "macs": measure(net, x).macs,
            "fp32_max_abs_error": float(np.abs(exported - reference.numpy()).max()),
            "onnx_mb": round(fp32.stat().st_size / 2**20, 2),
            "int8_mb": round(int8.stat().st_size / 2**20, 2),
        }
        if args.profile:
            info[name]["fp32_profile"] = profile(fp32, feeds, args.threads)
            info[name]["int8_profile"] = profile(int8, feeds, args.threads)
        if args.executorch and not plain:  # the segmentation networks in fp32 only
            int8_too = list(shape) != list(SEGMENTATION)
            info[name].update(
                executorch_runs(net, x, folder / name, args.calibration, runs, reuse, int8_too)
            )
        runners[(name, "eager")] = lambda net=net, x=x: net(x)
        for runtime, sess in runs.items():
            if runtime.startswith("executorch"):  # a loaded program: inputs -> outputs
                runners[(name, runtime)] = lambda run=sess, x=x: run([x])
            else:
                runners[(name, runtime)] = lambda sess=sess, feeds=feeds: sess.run(None, feeds)

    # ExecuTorch's XNNPACK thread pool keeps its workers busy a while after a call, which slowed
    # whatever ran next in one round-robin (eager DiCENet 3x its time alone): its programs are
    # timed in a round-robin of their own, after the others
    times: dict[tuple[str, str], list[float]] = {}
    for phase in (False, True):
        chosen = {k: run for k, run in runners.items() if k[1].startswith("executorch") == phase}
        times.update(round_robin(chosen, args.warmup, args.repeats))
    ms = {key: statistics.median(values) for key, values in times.items()}
    least = {key: min(values) for key, values in times.items()}

    rows = []
    for name, facts in info.items():
        row = {"model": name, **facts}
        for (model, runtime), value in ms.items():
            if model == name:
                row[f"{runtime}_ms"] = round(value, 3)
                row[f"{runtime}_min_ms"] = round(least[(model, runtime)], 3)
        row["int8_speedup"] = round(row["onnxruntime_fp32_ms"] / row["onnxruntime_int8_ms"], 2)
        if "executorch_int8_ms" in row:
            row["executorch_int8_speedup"] = round(
                row["executorch_fp32_ms"] / row["executorch_int8_ms"], 2
            )
        if "onnxruntime_int8_every_op_ms" in row:
            row["int8_every_op_speedup"] = round(
                row["onnxruntime_fp32_ms"] / row["onnxruntime_int8_every_op_ms"], 2
            )
            row["extended_over_all"] = round(
                row["onnxruntime_fp32_extended_ms"] / row["onnxruntime_fp32_ms"], 2
            )
        if (BASELINE, "onnxruntime_fp32") in ms and facts["input"] == list(CLASSIFICATION):
            for runtime in ("onnxruntime_fp32", "onnxruntime_int8"):
                row[f"{runtime}_vs_{BASELINE}"] = round(
                    ms[(name, runtime)] / ms[(BASELINE, runtime)], 2
                )
            row[f"onnxruntime_fp32_min_vs_{BASELINE}"] = round(
                least[(name, "onnxruntime_fp32")] / least[(BASELINE, "onnxruntime_fp32")], 2
            )
        rows.append(row)

    def cell(row: dict, key: str, width: int, digits: int = 2) -> str:
        return f"{'' if key not in row else f'{row[key]:.{digits}f}':>{width}}"

    columns = (
        f"{'model':<20}{'input':>12}{'MMACs':>8}{'eager ms':>10}{'ort fp32':>10}{'fp32 min':>10}"
    )
    columns += f"{'ext':>8}{'ort int8':>10}{'int8 x':>8}{'int8 all':>10}{'all x':>7}"
    columns += f"{'fp32 / SNv2':>13}{'min / SNv2':>12}{'max |err|':>11}"
    columns += f"{'et fp32':>9}{'et int8':>9}{'et x':>6}" if args.executorch else ""
    print(columns)
    for row in rows:
        print(
            f"{row['model']:<20}{'x'.join(map(str, row['input'][1:])):>12}{row['macs'] / 1e6:>8.1f}"
            + cell(row, "eager_ms", 10)
            + cell(row, "onnxruntime_fp32_ms", 10)
            + cell(row, "onnxruntime_fp32_min_ms", 10)
            + cell(row, "onnxruntime_fp32_extended_ms", 8)
            + cell(row, "onnxruntime_int8_ms", 10)
            + cell(row, "int8_speedup", 8)
            + cell(row, "onnxruntime_int8_every_op_ms", 10)
            + cell(row, "int8_every_op_speedup", 7)
            + cell(row, f"onnxruntime_fp32_vs_{BASELINE}", 13)
            + cell(row, f"onnxruntime_fp32_min_vs_{BASELINE}", 12)
            + f"{row['fp32_max_abs_error']:>11.1e}"
            + (
                cell(row, "executorch_fp32_ms", 9)
                + cell(row, "executorch_int8_ms", 9)
                + cell(row, "executorch_int8_speedup", 6)
                if args.executorch
                else ""
            )
        )
    result = {
        **header(args.threads, args.repeats),
        "calibration": f"{args.calibration} random images (latency only)",
        "rows": rows,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
