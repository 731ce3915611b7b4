"""Where int8 loses the official PASCAL segmentation networks' masks: simulated quantisation of
the fp32 ONNX graph, item by item.

For every ``edgenets/seg_pascal/<family>_s_<s>_pascal_<W>x<H>.npz`` fixture under the reference
folder (the official EdgeNets weights, the fixture's images read as ``predict.py`` reads them),
the network is exported to ONNX (:func:`src.export.onnx.export_onnx`) and quantised in
simulation, the way :func:`src.export.quantize.quantize_int8` quantises it in onnxruntime: the
dense products' weights int8, symmetric, one scale per output channel; the activations they read
and write uint8, one scale per tensor from the min/max (0 included) over the calibration images
(the fixture's images and their mirror images, as in ``tests/export/test_segmentation_int8.py``).
A simulated item is a ``QuantizeLinear``/``DequantizeLinear`` pair after a tensor, or a weight
replaced by its rounded values; the rest of the graph stays in float, so any subset of the items
can be measured. The full set reproduces onnxruntime's int8 file (``--check-ort`` prints both).

Reported per network, as the share of pixels whose argmax class agrees with fp32 (lowest image /
mean; the target is >= 99% on every image) and the logits' signal-to-quantisation-noise ratio:

- every item (W8A8), the weights only (float activations), the weights with bias correction
  (each output channel's mean shift, (W_q - W) times its input channels' calibration means,
  taken off its bias; Nagel et al. 2019; dense convolutions with a bias, as every one of these
  networks has once BatchNorm is folded), the activations only;
- the images' margins: the share of pixels whose fp32 top-2 logits lie within 0.1 of each other,
  and within the int8 weights' RMS logit error: pixels the smallest perturbation flips;
- with ``--sensitivity``: each item alone (the logits' SQNR with only that item quantised), then
  the most harmful K items left in float (``--keep``), greedily by that ranking.

With ``--executorch``, ExecuTorch's int8 as ``export.py format=executorch quantize=int8`` makes it
(PT2E, the XNNPACK quantizer) on the same calibration images, its converted module run in PyTorch.

    python benchmarks/seg_int8_analysis.py [--reference DIR] [--only SUBSTRING] [--sensitivity]
        [--keep 2,4,8,16,32,64] [--check-ort] [--executorch] [--work DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import ROOT, cpu_name

FIXTURE_NAME = re.compile(r"(dicenet|espnetv2)_s_(\d+(?:\.\d+)?)_pascal_(\d+)x(\d+)")
PASCAL_CLASSES = 21
TIE = 0.1  # logits: a pixel whose top two classes are this close is all but a tie


@dataclass
class Network:
    """One fixture's network, its images (each (1, 3, H, W)) and its fp32 ONNX file."""

    name: str
    images: list[torch.Tensor]
    names: list[str]
    onnx_path: Path
    module: torch.nn.Module | None = None


def official_segmentation(
    fixture: Path, reference: Path
) -> tuple[torch.nn.Module, tuple[int, int]]:
    """The network a ``<family>_s_<s>_pascal_<W>x<H>`` fixture names, with the official weights of
    the same name under ``reference``, in eval mode, and its (W, H)."""
    from src.compat import load_official
    from src.models.segmentation import dicenet_segmentation, espnetv2_segmentation

    match = FIXTURE_NAME.fullmatch(fixture.stem)
    if match is None:
        raise ValueError(f"{fixture.name} is not named <family>_s_<s>_pascal_<W>x<H>.npz")
    builder = {"dicenet": dicenet_segmentation, "espnetv2": espnetv2_segmentation}[match[1]]
    net = builder(float(match[2]), PASCAL_CLASSES)
    weights = reference / "edgenets" / "weights" / f"{fixture.stem}.pth"
    if not weights.is_file():
        raise FileNotFoundError(f"{fixture.name} needs the official weights at {weights}")
    load_official(net, torch.load(weights, map_location="cpu", weights_only=True))
    return net.eval(), (int(match[3]), int(match[4]))


def load_network(fixture: Path, reference: Path, work: Path) -> Network:
    """The fixture's network with its official weights, exported once into ``work``."""
    from src.commands.predict import preprocess, read_image
    from src.datamodules.voc_seg import VOCSegmentationDataModule
    from src.export.onnx import export_onnx
    from src.export.vision import vision_spec

    net, size = official_segmentation(fixture, reference)
    folder = work / fixture.stem
    datamodule = VOCSegmentationDataModule(root=str(folder / "voc"))  # its normalisation only
    names = [str(n) for n in np.load(fixture)["images"]]
    images = [
        preprocess(read_image(reference / "edgenets" / "images" / n), datamodule, size)
        for n in names
    ]
    path = folder / "fp32.onnx"
    if not path.is_file():
        export_onnx(vision_spec(net, images[0]), path)
    return Network(fixture.stem, images, names, path, net)


class Simulation:
    """The fp32 graph of ``network`` with any subset of its int8 items quantised in simulation."""

    def __init__(self, network: Network, threads: int) -> None:
        import onnx
        import onnxruntime as ort
        from onnx import numpy_helper

        from src.export.quantize import dense_nodes

        self.network = network
        self.model = onnx.load(str(network.onnx_path))
        self.options = ort.SessionOptions()
        self.options.intra_op_num_threads = threads
        # unoptimised: onnxruntime's graph optimiser rewrites the simulated QDQ pairs around
        # float operators (its outputs then differ from the int8 file's by about one step);
        # unoptimised, the simulation gives the int8 file's outputs within its int32 biases'
        # rounding
        self.options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.nodes = {n.name: n for n in self.model.graph.node}
        self.dense = dense_nodes(self.model)
        self.weights = {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer}
        # the activations quantize_int8 quantises: each dense product's input and output
        self.tensors = list(
            dict.fromkeys(
                t for n in self.dense for t in (self.nodes[n].input[0], self.nodes[n].output[0])
            )
        )
        self.feeds = [{"image": x.numpy()} for x in network.images]
        self.calibration = self.feeds + [{"image": x.flip(-1).numpy()} for x in network.images]
        self.ranges, self.means = self._calibrate()
        self.reference = self.run(self.model)

    def session(self, model: Any) -> Any:
        import onnxruntime as ort

        return ort.InferenceSession(
            model.SerializeToString(), self.options, providers=["CPUExecutionProvider"]
        )

    def run(self, model: Any) -> list[np.ndarray]:
        session = self.session(model)
        return [session.run(None, feed)[0] for feed in self.feeds]

    def _with_outputs(self, names: list[str]) -> tuple[Any, list[str]]:
        """The graph with ``names`` among its outputs, and those of them it can output."""
        import onnx

        model = copy.deepcopy(self.model)
        outputs = {o.name for o in model.graph.output}
        infos = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
        model.graph.output.extend(infos[n] for n in names if n in infos and n not in outputs)
        return model, [n for n in names if n in infos or n in outputs]

    def _calibrate(self) -> tuple[dict[str, tuple[float, float]], dict[str, np.ndarray]]:
        """In one pass over the calibration images: each tensor's (min, max), 0 included, and the
        channel means of each dense product's (B, C, H, W) input (a subset of the tensors)."""
        model, names = self._with_outputs([t for t in self.tensors if t != "image"])
        session = self.session(model)
        inputs = set(self.nodes[n].input[0] for n in self.dense)
        low = {t: 0.0 for t in self.tensors}
        high = {t: 0.0 for t in self.tensors}
        sums: dict[str, np.ndarray] = {}
        for feed in self.calibration:
            outputs = dict(zip(names, session.run(names, feed)))
            outputs.setdefault("image", feed["image"])
            for t in self.tensors:
                low[t] = min(low[t], float(outputs[t].min()))
                high[t] = max(high[t], float(outputs[t].max()))
                if t in inputs and outputs[t].ndim == 4:
                    sums[t] = sums.get(t, 0) + outputs[t].mean(axis=(0, 2, 3))
        ranges = {t: (low[t], high[t]) for t in self.tensors}
        return ranges, {t: total / len(self.calibration) for t, total in sums.items()}

    def rounded(self, node: str) -> np.ndarray:
        """The node's weight at int8, one symmetric scale per output channel."""
        w = self.weights[self.nodes[node].input[1]]
        if self.nodes[node].op_type == "Conv":  # (O, I/g, kh, kw): output channels on axis 0
            scale = np.abs(w).reshape(w.shape[0], -1).max(1).reshape(-1, *[1] * (w.ndim - 1))
        else:  # MatMul (K, N): output columns
            scale = np.abs(w).max(0, keepdims=True)
        scale = np.where(scale == 0, 1.0, scale) / 127
        return (np.clip(np.round(w / scale), -127, 127) * scale).astype(np.float32)

    def quantised(self, tensors: list[str], nodes: list[str], bias_correction: bool = False) -> Any:
        """The graph with ``tensors`` behind uint8 QDQ pairs and ``nodes``' weights rounded."""
        from onnx import helper, numpy_helper

        model = copy.deepcopy(self.model)
        graph = model.graph
        replaced: dict[str, np.ndarray] = {}
        for node in nodes:
            conv = self.nodes[node]
            weight = self.rounded(node)
            replaced[conv.input[1]] = weight
            groups = next((a.i for a in conv.attribute if a.name == "group"), 1)
            mean = self.means.get(conv.input[0])
            has_bias = len(conv.input) > 2 and conv.input[2]
            if (
                bias_correction
                and conv.op_type == "Conv"
                and groups == 1
                and mean is not None
                and has_bias
            ):
                shift = ((weight - self.weights[conv.input[1]]).sum(axis=(2, 3)) * mean).sum(1)
                replaced[conv.input[2]] = (self.weights[conv.input[2]] - shift).astype(np.float32)
        for t in graph.initializer:
            if t.name in replaced:
                t.CopyFrom(numpy_helper.from_array(replaced[t.name], t.name))
        nodes_out = list(graph.node)
        for t in tensors:
            low, high = self.ranges[t]
            scale = (high - low) / 255 if high > low else 1.0
            zero = int(round(-low / scale))
            graph.initializer.extend([
                numpy_helper.from_array(np.array(scale, np.float32), f"{t}__scale"),
                numpy_helper.from_array(np.array(zero, np.uint8), f"{t}__zero"),
            ])  # fmt: skip
            producer = next((n for n in nodes_out if t in n.output), None)
            if producer is None:  # the graph's input: its readers read the pair's output
                raw, quantised = t, f"{t}__dq"
                for node in nodes_out:
                    for i, name in enumerate(node.input):
                        if name == t:
                            node.input[i] = quantised
            else:  # the producer writes t__raw, and the pair writes t (a graph output too)
                raw, quantised = f"{t}__raw", t
                producer.output[list(producer.output).index(t)] = raw
            nodes_out.append(
                helper.make_node("QuantizeLinear", [raw, f"{t}__scale", f"{t}__zero"], [f"{t}__q"])
            )
            nodes_out.append(
                helper.make_node(
                    "DequantizeLinear", [f"{t}__q", f"{t}__scale", f"{t}__zero"], [quantised]
                )
            )
        # a QDQ pair of the graph's input goes first; the rest keep a producer-first order
        known = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        ordered, pending = [], nodes_out
        while pending:
            ready = [n for n in pending if all(not x or x in known for x in n.input)]
            if not ready:
                raise RuntimeError("the simulated graph has a cycle")
            for n in ready:
                known.update(n.output)
            ordered += ready
            pending = [n for n in pending if n not in ready]
        del graph.node[:]
        graph.node.extend(ordered)
        return model

    def measure(self, model: Any) -> dict[str, Any]:
        """Pixel agreement with fp32 per image, and the logits' SQNR (dB)."""
        outputs = self.run(model)
        agreement = [
            float((o.argmax(1) == r.argmax(1)).mean()) for o, r in zip(outputs, self.reference)
        ]
        noise = sum(float(((o - r) ** 2).sum()) for o, r in zip(outputs, self.reference))
        signal = sum(float((r**2).sum()) for r in self.reference)
        return {
            "lowest": min(agreement),
            "mean": float(np.mean(agreement)),
            "sqnr_db": 10 * np.log10(signal / max(noise, 1e-30)),
            "per_image": dict(zip(self.network.names, agreement)),
            "rms_error": [
                float(np.sqrt(((o - r) ** 2).mean())) for o, r in zip(outputs, self.reference)
            ],
        }

    def margins(self, rms_errors: list[float]) -> dict[str, dict[str, float]]:
        """Per image: the share of pixels within TIE, and within the given RMS error, of a tie."""
        found = {}
        for name, logits, error in zip(self.network.names, self.reference, rms_errors):
            top = np.sort(logits[0], axis=0)
            margin = top[-1] - top[-2]
            found[name] = {
                "within_tie": float((margin < TIE).mean()),
                "within_error": float((margin < error).mean()),
            }
        return found


def ort_agreement(simulation: Simulation, work: Path) -> dict[str, float]:
    """onnxruntime's own int8 file (quantize_int8), for the simulation to be checked against."""
    import onnx

    from src.export.quantize import quantize_int8

    path = quantize_int8(
        simulation.network.onnx_path,
        work / simulation.network.name / "int8.onnx",
        simulation.calibration,
    )
    result = simulation.measure(onnx.load(str(path)))
    return {"lowest": result["lowest"], "mean": result["mean"], "sqnr_db": result["sqnr_db"]}


def executorch_agreement(network: Network) -> dict[str, float]:
    """ExecuTorch's int8 (PT2E, XNNPACK's quantizer: every operator it annotates, not only the
    dense products) on the same calibration images, its converted module run in PyTorch, against
    eager fp32."""
    from src.export.executorch import quantized_module
    from src.export.vision import vision_spec

    assert network.module is not None
    spec = vision_spec(network.module, network.images[0])
    calibration = [(x,) for x in network.images] + [(x.flip(-1),) for x in network.images]
    quantised = quantized_module(spec, calibration)
    agreement = []
    with torch.no_grad():
        for image in network.images:
            reference, found = network.module(image), quantised(image)
            agreement.append(float((found.argmax(1) == reference.argmax(1)).double().mean()))
    return {"lowest": min(agreement), "mean": float(np.mean(agreement))}


def analyse(simulation: Simulation, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    sim = simulation
    rows = {
        "W8A8 (every item)": sim.measure(sim.quantised(sim.tensors, sim.dense)),
        "weights only": sim.measure(sim.quantised([], sim.dense)),
        "weights only, bias corrected": sim.measure(
            sim.quantised([], sim.dense, bias_correction=True)
        ),
        "activations only": sim.measure(sim.quantised(sim.tensors, [])),
    }
    result: dict[str, Any] = {
        "items": {"tensors": len(sim.tensors), "weights": len(sim.dense)},
        "rows": rows,
        "margins": sim.margins(rows["weights only"]["rms_error"]),
    }
    if args.check_ort:
        result["onnxruntime_int8"] = ort_agreement(sim, work)
    if args.executorch:
        result["executorch_int8"] = executorch_agreement(sim.network)
    if args.sensitivity:
        items = [("tensor", t) for t in sim.tensors] + [("weight", n) for n in sim.dense]
        alone = {}
        for kind, item in items:
            model = sim.quantised(
                [item] if kind == "tensor" else [], [item] if kind == "weight" else []
            )
            alone[f"{kind}:{item}"] = sim.measure(model)["sqnr_db"]
        ranked = sorted(alone, key=alone.get)
        result["most_harmful"] = [(k, round(alone[k], 1)) for k in ranked[:15]]
        kept_rows = {}
        for k in args.keep:
            kept = set(ranked[:k])
            model = sim.quantised(
                [t for t in sim.tensors if f"tensor:{t}" not in kept],
                [n for n in sim.dense if f"weight:{n}" not in kept],
            )
            kept_rows[k] = sim.measure(model)
            if kept_rows[k]["lowest"] >= 0.99:
                break
        result["kept_in_float"] = kept_rows
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = os.environ.get("REFERENCE_DIR", str(ROOT.parent / "shared" / "reference"))
    parser.add_argument("--reference", default=default)
    parser.add_argument("--only", default="", help="fixtures whose name contains this")
    parser.add_argument("--sensitivity", action="store_true")
    parser.add_argument("--keep", default="2,4,8,16,32,64")
    parser.add_argument("--check-ort", action="store_true")
    parser.add_argument("--executorch", action="store_true", help="ExecuTorch's int8 as well")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default=str(ROOT / "logs" / "seg_int8_analysis"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.keep = [int(k) for k in args.keep.split(",")]
    torch.set_num_threads(args.threads)
    reference = Path(args.reference)
    folder = reference / "edgenets" / "seg_pascal"
    fixtures = sorted(p for p in folder.glob("*_pascal_*.npz") if FIXTURE_NAME.fullmatch(p.stem))
    fixtures = [p for p in fixtures if args.only in p.stem]
    if not fixtures:
        raise SystemExit(
            f"no edgenets/seg_pascal/<family>_s_<s>_pascal_<W>x<H>.npz under {reference}"
        )
    work = Path(args.work)
    results = {}
    for fixture in fixtures:
        simulation = Simulation(load_network(fixture, reference, work), args.threads)
        results[fixture.stem] = analyse(simulation, args, work)
        print(
            json.dumps({"network": fixture.stem, **results[fixture.stem]}, default=float),
            flush=True,
        )
    print()
    ort = any("onnxruntime_int8" in r for r in results.values())
    print(
        "| network | W8A8 | weights only | weights, bias corrected | activations only | "
        + ("onnxruntime int8 | " if ort else "")
        + "pixels within 0.1 of a tie (worst image) |"
    )
    print("|---|" + "---:|" * (6 if ort else 5))
    for name, r in results.items():
        cells = [f"{r['rows'][k]['lowest']:.1%} / {r['rows'][k]['mean']:.1%}" for k in r["rows"]]
        if ort:
            o = r.get("onnxruntime_int8")
            cells.append(f"{o['lowest']:.1%} / {o['mean']:.1%}" if o else "")
        worst = max(r["margins"].items(), key=lambda kv: kv[1]["within_tie"])
        print(
            f"| {name} | " + " | ".join(cells) + f" | {worst[1]['within_tie']:.1%} ({worst[0]}) |"
        )
    for name, r in results.items():
        if "executorch_int8" in r:
            e = r["executorch_int8"]
            print(f"{name}: ExecuTorch int8 (XNNPACK quantizer): lowest {e['lowest']:.1%}, "
                  f"mean {e['mean']:.1%}")  # fmt: skip
        for k, row in r.get("kept_in_float", {}).items():
            print(f"{name}: the {k} most harmful items in float: lowest {row['lowest']:.1%}, "
                  f"mean {row['mean']:.1%}, SQNR {row['sqnr_db']:.1f} dB")  # fmt: skip
    record = {
        "machine": cpu_name(),
        "threads": args.threads,
        "torch": torch.__version__,
        "results": results,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, default=float))


if __name__ == "__main__":
    main()
