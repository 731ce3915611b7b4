"""int8 with PReLU in a quantisable form, against int8 with PReLU in float, side by side.

Neither onnxruntime nor XNNPACK has an int8 PReLU, so every convolution of DiCENet feeds a float
PReLU bracketed by a dequantise and a quantise. For slopes up to 1 PReLU is exactly
``x + Relu((slope - 1) x)``: a product and its ReLU (XNNPACK's quantizer annotates the pair as one
``mul_relu``; onnxruntime quantises ``Mul``, ``Relu`` and ``Add``) and a sum, all int8. This
script exports DiCENet s=1.0 (random weights, batch 1, 224x224) three ways per runtime: fp32,
int8 with float PReLU (as ``benchmarks/deploy.py``), and int8 with the quantisable form, and
times them in one interleaved round-robin. Prints the medians and minimums (ms) and the ratios to
fp32, then one JSON object.

- onnxruntime: the dense products quantised as ``export.py`` does, plus, in the third file, each
  PReLU's ``Mul``, ``Relu`` and ``Add`` (static QDQ, per-channel int8 weights, uint8
  activations, calibrated on random images).
- ExecuTorch (``--executorch``, with executorch installed): PT2E with the XNNPACK quantizer, one
  delegate each. The stem's PReLU stays in float there: the padded max pool after it becomes a
  ``-inf`` padding that XNNPACK cannot build in int8.

    python benchmarks/int8_prelu.py [--threads 2] [--repeats 41] [--executorch]
        [--out DIR [--reuse]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.deploy import export, header, quantize, round_robin, session
from src.export.quantize import dense_nodes
from src.models.dicenet import DiCENet
from src.utils.extras import require

SHAPE = (1, 3, 224, 224)
CALIBRATION = 8


@contextlib.contextmanager
def quantisable_prelu(keep_float: Callable[[Tensor], bool] = lambda x: False) -> Iterator[None]:
    """Within the block, ``F.prelu(x, slope)`` computes ``x + relu((slope - 1) x)`` (the same map
    for slopes up to 1), except where ``keep_float(x)``."""
    plain = F.prelu

    def prelu(x: Tensor, weight: Tensor) -> Tensor:
        if keep_float(x):
            return plain(x, weight)
        shape = (1, -1, *([1] * (x.dim() - 2))) if weight.numel() > 1 else ()
        return x + torch.relu(x * (weight - 1).reshape(shape))

    F.prelu = prelu
    try:
        yield
    finally:
        F.prelu = plain


def check_slopes(net: nn.Module) -> None:
    slopes = [m.weight for m in net.modules() if isinstance(m, nn.PReLU)]
    if any(bool((s > 1).any()) for s in slopes):
        raise ValueError("a PReLU slope above 1: x + relu((slope - 1) x) is not that PReLU")


def prelu_nodes(model) -> list[str]:
    """The names of each ``Mul(x, constant) -> Relu -> Add`` of an ONNX model (the quantisable
    PReLU)."""
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = {t.name for t in model.graph.initializer}
    constants |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}

    def only(name: str, op: str):
        nodes = consumers.get(name, [])
        return nodes[0] if len(nodes) == 1 and nodes[0].op_type == op else None

    names = []
    for node in model.graph.node:
        if node.op_type == "Mul" and any(i in constants for i in node.input):
            relu = only(node.output[0], "Relu")
            add = relu and only(relu.output[0], "Add")
            if add:
                names += [node.name, relu.name, add.name]
    return names


def variant_files(folder: Path, suffix: str) -> dict[str, Path]:
    """The three files of a runtime (variant -> path)."""
    return {
        "fp32": folder / f"dicenet.{suffix}",
        "int8": folder / f"dicenet.int8.{suffix}",
        "int8_quantisable_prelu": folder / f"dicenet_q.int8.{suffix}",
    }


def onnx_files(net: nn.Module, x: Tensor, folder: Path, reuse: bool) -> dict[str, Path]:
    import onnx
    from onnxruntime.quantization import quant_pre_process

    files = variant_files(folder, "onnx")
    if reuse and all(p.is_file() for p in files.values()):
        return files
    export(net, x, files["fp32"])
    quantize(files["fp32"], SHAPE, CALIBRATION, files["int8"])
    with quantisable_prelu():
        plain = export(net, x, folder / "dicenet_q.onnx", project_prelu=False, rewrite=False)
    prepared = folder / "dicenet_q.prep.onnx"
    quant_pre_process(str(plain), str(prepared))
    model = onnx.load(str(prepared))
    extra = prelu_nodes(model)
    print(f"onnxruntime: {len(extra) // 3} PReLUs in the quantisable form")
    nodes = dense_nodes(model) + extra
    quantize(plain, SHAPE, CALIBRATION, files["int8_quantisable_prelu"], nodes=nodes)
    return files


def executorch_files(net: nn.Module, x: Tensor, folder: Path, reuse: bool) -> dict[str, Path]:
    from src.export.executorch import export_executorch
    from src.export.spec import ExportSpec

    files = variant_files(folder, "pte")
    if reuse and all(p.is_file() for p in files.values()):
        return files
    spec = ExportSpec("network", net, (x,), ["image"], ["logits"])
    images = [(torch.randn_like(x),) for _ in range(CALIBRATION)]
    export_executorch(spec, files["fp32"])
    export_executorch(spec, files["int8"], calibration=images)
    stem = x.shape[-1] // 2  # the stem's map, which the padded max pool reads
    with quantisable_prelu(keep_float=lambda t: t.shape[-1] == stem):
        export_executorch(spec, files["int8_quantisable_prelu"], calibration=images)
    return files


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--executorch", action="store_true", help="time ExecuTorch programs too")
    parser.add_argument("--out", type=Path, help="keep the files here (default: a temporary one)")
    parser.add_argument(
        "--reuse", action="store_true", help="time the files already in --out (no export)"
    )
    args = parser.parse_args(argv)
    require("onnxruntime", "export", "benchmarks/int8_prelu.py")
    torch.manual_seed(0)
    net = DiCENet(scale=1.0).eval()
    check_slopes(net)
    x = torch.randn(SHAPE)
    with contextlib.ExitStack() as stack:
        folder = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        folder.mkdir(parents=True, exist_ok=True)
        runners = {}
        feeds = {"image": x.numpy()}
        for variant, path in onnx_files(net, x, folder, args.reuse).items():
            loaded = session(path, args.threads)
            runners[("onnxruntime", variant)] = lambda s=loaded: s.run(None, feeds)
        if args.executorch:
            from src.export.executorch import load_program

            torch.set_num_threads(args.threads)
            for variant, path in executorch_files(net, x, folder, args.reuse).items():
                program = load_program(path)
                runners[("executorch", variant)] = lambda p=program: p([x])
        times = round_robin(runners, 3, args.repeats)
    rows = []
    for (runtime, variant), values in times.items():
        fp32 = statistics.median(times[(runtime, "fp32")])
        median = statistics.median(values)
        rows.append(
            {
                "runtime": runtime,
                "variant": variant,
                "median_ms": round(median, 3),
                "min_ms": round(min(values), 3),
                "fp32_over": round(fp32 / median, 3),
            }
        )
    print(f"{'runtime':12s} {'variant':24s} {'ms':>8s} {'min':>8s} {'fp32 / this':>12s}")
    for r in rows:
        print(f"{r['runtime']:12s} {r['variant']:24s} {r['median_ms']:8.2f} {r['min_ms']:8.2f} "
              f"{r['fp32_over']:12.2f}")  # fmt: skip
    result = {**header(args.threads, args.repeats), "rows": rows}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
