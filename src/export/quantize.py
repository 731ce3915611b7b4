"""int8 ONNX files: onnxruntime's static quantization, calibrated on batches of the training split.

``onnxruntime.quantization.quantize_static`` in the QDQ format (QuantizeLinear/DequantizeLinear
pairs around each quantized operator, which any onnxruntime back-end runs), activations uint8 and
weights int8, per output channel for convolutions and matrix products (their channels' ranges
differ by orders of magnitude in these narrow networks, so one scale per tensor costs accuracy).
Activation ranges are the min/max over the calibration batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from src.utils.files import atomic_path


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


def quantize_int8(
    fp32_path: str | Path,
    int8_path: str | Path,
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    per_channel: bool = True,
) -> Path:
    """Write the int8 (QDQ) form of the ONNX file at ``fp32_path`` to ``int8_path`` (whole or not
    at all), calibrated on ``feeds`` (dicts of input name -> array)."""
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
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
        )
    return int8_path
