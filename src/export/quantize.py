"""int8 ONNX files: onnxruntime's static quantization, calibrated on a bounded stream of images.

``onnxruntime.quantization.quantize_static`` in the QDQ format (QuantizeLinear/DequantizeLinear
pairs around each quantized operator, which any onnxruntime back-end runs), activations uint8 and
weights int8, per output channel (their channels' ranges differ by orders of magnitude in these
narrow networks, so one scale per tensor costs accuracy). Activation ranges are the min/max over
the calibration images.

Memory: onnxruntime's MinMax calibrator adds a ReduceMin and a ReduceMax after every tensor it
calibrates and keeps, per batch fed, only those reduced values, but its session holds the batch's
activations while it runs: calibrating DiCENet s=1.0 at 224x224 (128 images) peaked at 1.5, 2.1,
3.2 and 9.7 GB of resident memory with batches of 4, 8, 16 and 64 images (onnxruntime 1.32,
2026-11-29), about 0.14 GB per image of the batch, so the data config's ImageNet batch of 256 needs
some 35 GB. The images are therefore fed :data:`CALIBRATION_BATCH` at a time
(:class:`CalibrationFeeds`, each batch read when the calibrator asks for it), whatever batch they
come in: the memory does not grow with the batch size or the number of images, and min/max ranges
do not depend on how the images are batched.

Only the dense products are quantized (:func:`dense_nodes`): convolutions with one group and
matrix products with a constant weight. In DiCENet and ESPNetv2 every convolution is followed by
a PReLU (element-wise, in float), so each quantized node costs a QuantizeLinear before it, a
DequantizeLinear after it and onnxruntime's NHWC Transposes around its int8 kernel; that pays for
the dense convolutions, not for the depth-wise and narrow grouped ones (3 to 9 multiply-adds per
output), whose int8 kernels are no faster than the float ones. For DiCENet s=1.0, int8 of every
operator ran at 0.37-0.48x the speed of float, of the dense products only at 0.67-1.23x (batch 1,
2 threads, onnxruntime 1.32, 2 shared and busy cores of an AMD EPYC, 2026-11-28).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from src.export.images import batched, limited
from src.utils.files import atomic_path

CALIBRATION_BATCH = 8  # images per calibrator run (module docstring: memory)
# activation element type -> onnxruntime's QuantType name
ACTIVATIONS = {"uint8": "QUInt8", "uint16": "QUInt16"}


class CalibrationFeeds:
    """onnxruntime feeds (input name -> array) of the first ``limit`` images of ``batches`` (each
    (B, C, H, W), any B), :data:`CALIBRATION_BATCH` images a feed, read only when the calibrator
    asks for it; ``images`` counts the images fed so far (the card's count), ``finished`` is the
    ``time.perf_counter()`` at which the calibrator had read the last one (None before)."""

    def __init__(self, batches: Iterable[Tensor], input_name: str, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1 image, got {limit}")
        self.batches = batches
        self.input_name = input_name
        self.limit = limit
        self.images = 0
        self.finished: float | None = None

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for images in batched(limited(self.batches, self.limit), CALIBRATION_BATCH):
            self.images += len(images)
            yield {self.input_name: images.detach().cpu().numpy()}
        self.finished = time.perf_counter()


def dense_nodes(model: Any) -> list[str]:
    """Names of the nodes worth int8 in an ONNX ``model`` (``onnx.ModelProto``): ``Conv`` with one
    group, ``Gemm`` and ``MatMul`` whose second input is an initializer (not DiCE's resize
    products, which multiply two computed tensors)."""
    constants = {t.name for t in model.graph.initializer}
    names = []
    for node in model.graph.node:
        groups = next((a.i for a in node.attribute if a.name == "group"), 1)
        dense = node.op_type == "Conv" and groups == 1
        product = node.op_type in ("Gemm", "MatMul") and node.input[1] in constants
        if dense or product:
            names.append(node.name)
    return names


def quantize_int8(
    fp32_path: str | Path,
    int8_path: str | Path,
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    per_channel: bool = True,
    activations: str = "uint8",
) -> Path:
    """Write the int8 (QDQ) form of the ONNX file at ``fp32_path`` to ``int8_path`` (whole or not
    at all), its :func:`dense_nodes` quantized, calibrated on ``feeds`` (dicts of input name ->
    array). ``activations``: ``uint8`` (W8A8), or ``uint16`` (W8A16: int8 weights, 16-bit
    activations, as NPUs such as Qualcomm's QNN run them; onnxruntime's CPU kernels compute it in
    float, so it is no faster there)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {list(ACTIVATIONS)}, got {activations!r}")
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    int8_path = Path(int8_path)
    with atomic_path(int8_path) as temporary:
        quantize_static(
            str(fp32_path),
            str(temporary),
            Reader(),
            quant_format=QuantFormat.QDQ,
            activation_type=getattr(QuantType, ACTIVATIONS[activations]),
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            nodes_to_quantize=dense_nodes(onnx.load(str(fp32_path), load_external_data=False)),
        )
    return int8_path
