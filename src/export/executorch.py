"""ExecuTorch programs (``.pte``) lowered to the XNNPACK backend, fp32 or int8, and their runtime.

The graph is ``torch.export``'s of an :class:`~src.export.spec.ExportSpec` at its example shapes
(ExecuTorch programs are planned for fixed shapes here: a device runs the size it was exported at).
int8 is the PT2E flow with the XNNPACK quantizer (symmetric, per-channel weights, static
activations) calibrated on the batches given; the quantised graph is lowered the same way. The
``executorch`` package is an optional extra: a missing one stops with the pip command.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from src.export.spec import ExportSpec
from src.ops.dispatch import capture_for_export
from src.utils.extras import require
from src.utils.files import atomic_write_bytes


def _require() -> None:
    require("executorch", "executorch", "format=executorch")


def quantized_program(
    spec: ExportSpec, calibration: Iterable[Sequence[Tensor]]
) -> torch.export.ExportedProgram:
    """``spec.module`` quantised to int8 by PT2E with the XNNPACK quantizer, observers calibrated
    on ``calibration`` (each item: inputs in ``spec.inputs``' order), exported again for lowering."""
    _require()
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    with capture_for_export():
        captured = torch.export.export(spec.module.eval(), spec.inputs).module()
    prepared = prepare_pt2e(captured, quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    converted = convert_pt2e(prepared)
    return torch.export.export(converted, spec.inputs)


def export_executorch(
    spec: ExportSpec, path: str | Path, *, calibration: Iterable[Sequence[Tensor]] | None = None
) -> Path:
    """Write ``spec`` as an XNNPACK-delegated ExecuTorch program at ``path``: fp32, or int8 when
    ``calibration`` batches are given."""
    _require()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    with torch.no_grad(), capture_for_export():  # every op on its PyTorch path
        if calibration is None:
            program = torch.export.export(spec.module.eval(), spec.inputs)
        else:
            program = quantized_program(spec, calibration)
        lowered = to_edge_transform_and_lower(
            program, partitioner=[XnnpackPartitioner()]
        ).to_executorch()
    return atomic_write_bytes(path, lowered.buffer)


def run_executorch(path: str | Path, inputs: Sequence[Tensor]) -> list[Tensor]:
    """The outputs of the ExecuTorch program at ``path`` for ``inputs``, by the Python runtime."""
    _require()
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    return list(_load_for_executorch(str(path)).forward(list(inputs)))
