"""int8 ONNX files: onnxruntime's static quantization, calibrated on batches of the training split.

``onnxruntime.quantization.quantize_static`` in the QDQ format (QuantizeLinear/DequantizeLinear
pairs around each quantized operator, which any onnxruntime back-end runs), activations uint8 and
weights int8, per output channel (their channels' ranges differ by orders of magnitude in these
narrow networks, so one scale per tensor costs accuracy). Activation ranges are the min/max over
the calibration batches.

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

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from src.utils.files import atomic_path

# activation element type -> onnxruntime's QuantType name
ACTIVATIONS = {"uint8": "QUInt8", "uint16": "QUInt16"}


def calibration_feeds(
    batches: Iterable[Any], input_name: str, limit: int
) -> Iterator[dict[str, np.ndarray]]:
    """The first ``limit`` batches' images (a batch's first element, or the batch itself) as
    onnxruntime feeds."""
    for index, batch in enumerate(batches):
        if index >= limit:
            return
        images: Tensor = batch[0] if isinstance(batch, (tuple, list)) else batch
        yield {input_name: images.detach().cpu().numpy()}


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
