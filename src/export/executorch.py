"""ExecuTorch programs (``.pte``) lowered to the XNNPACK backend, fp32 or int8, and their runtime.

The graph is ``torch.export``'s of an :class:`~src.export.spec.ExportSpec` at its example shapes
(ExecuTorch programs are planned for fixed shapes here: a device runs the size it was exported at).
int8 is the PT2E flow with the XNNPACK quantizer (symmetric, per-channel weights, static
activations) calibrated on the batches given; the quantised graph is lowered the same way. The
``executorch`` package is an optional extra: a missing one stops with the pip command.
"""

from __future__ import annotations

import collections
import copy
import importlib.metadata
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from src.export.spec import ExportSpec
from src.kernels.dispatch import capture_for_export
from src.utils.extras import MissingExtraError
from src.utils.files import atomic_write_bytes

log = logging.getLogger(__name__)


def require_executorch() -> None:
    """A one-line error unless executorch is installed, naming the install docs/deploy.md gives:
    ``pip install executorch`` into this environment (the ``[executorch]`` extra, resolved from
    scratch, backtracks to an older torch; see pyproject.toml)."""
    try:
        importlib.metadata.distribution("executorch")
    except importlib.metadata.PackageNotFoundError:
        raise MissingExtraError(
            "format=executorch needs executorch, which is not installed: pip install executorch "
            "(into this environment, which has torch already; pip install -e '.[executorch]' "
            "resolves torch afresh and downgrades it, see docs/deploy.md)"
        ) from None


def _traced_copy(spec: ExportSpec) -> torch.nn.Module:
    """A copy of ``spec.module`` in eval mode and in contiguous memory format, to trace.

    A copy: the caller's module must not keep traced tensors in its folded-inference caches (in
    the int8 test an eager forward after the export failed reading a fake tensor's data pointer
    there), as :func:`src.export.onnx.export_onnx` does. Contiguous: a task that trains
    channels-last hands over channels-last weights, and the XNNPACK delegate of executorch 1.5.1
    then sized a transposed activation wrongly at run time ("Attempted to resize a static tensor.
    Expected shape (1, 8, 24, 8), but received (1, 24, 8, 8)", the digits DiCENet)."""
    return copy.deepcopy(spec.module).eval().to(memory_format=torch.contiguous_format)


def captured_program(spec: ExportSpec) -> torch.export.ExportedProgram:
    """``torch.export`` of a copy of ``spec.module`` on its PyTorch paths, with the subgraphs that
    depend on constants only folded (ExecuTorch's ``constant_prop_pass``): a program is planned
    for fixed shapes, so DiCE's resize maps, which a dynamic graph computes from the input's size,
    become constants here (in DiCENet s=0.5 about 3,000 index and arithmetic ops that XNNPACK
    does not take would otherwise run on ExecuTorch's portable kernels between the delegates)."""
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    with torch.no_grad(), capture_for_export():
        return constant_prop_pass(torch.export.export(_traced_copy(spec), spec.inputs))


def quantized_module(spec: ExportSpec, calibration: Iterable[Sequence[Tensor]]) -> torch.nn.Module:
    """``spec.module`` quantised to int8 by PT2E with the XNNPACK quantizer, observers calibrated
    on ``calibration`` (each item: inputs in ``spec.inputs``' order): the converted module, whose
    quantise/dequantise pairs run in PyTorch the int8 arithmetic that XNNPACK's kernels do (up
    to their rounding)."""
    require_executorch()
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    prepared = prepare_pt2e(captured_program(spec).module(), quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    converted = convert_pt2e(prepared)
    # convert_pt2e folds each weight into an int8 constant but leaves the fp32 original registered
    # on the module; export lifts every registered tensor, so the program would carry both (1.05 MB
    # of tensors instead of 0.33 MB for DiCENet s=0.5). A GraphModule rebuilt from its own graph
    # copies only the attributes the graph reads.
    return torch.fx.GraphModule(converted, converted.graph)


def quantized_program(
    spec: ExportSpec, calibration: Iterable[Sequence[Tensor]]
) -> torch.export.ExportedProgram:
    """:func:`quantized_module`, exported again for lowering."""
    return torch.export.export(quantized_module(spec, calibration), spec.inputs)


def export_executorch(
    spec: ExportSpec, path: str | Path, *, calibration: Iterable[Sequence[Tensor]] | None = None
) -> Path:
    """Write ``spec`` as an XNNPACK-delegated ExecuTorch program at ``path``: fp32, or int8 when
    ``calibration`` batches are given."""
    require_executorch()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    with torch.no_grad(), capture_for_export():  # every op on its PyTorch path
        if calibration is None:
            program = captured_program(spec)
        else:
            program = quantized_program(spec, calibration)
        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
        delegates, outside = delegate_summary(edge.exported_program().graph)
        # every node outside a delegate runs on ExecuTorch's portable kernels, and each edge
        # between them and XNNPACK converts the layout: a split program is several times slower
        # (DiCENet s=1.0 in 18 delegates: 19.2 ms; in one: 7.9 ms)
        level = logging.WARNING if outside else logging.INFO
        log.log(
            level,
            "%s: %d XNNPACK delegate(s); outside them: %s",
            Path(path).name,
            delegates,
            dict(outside) or "nothing",
        )
        lowered = edge.to_executorch()
    return atomic_write_bytes(path, lowered.buffer)


def delegate_summary(graph: torch.fx.Graph) -> tuple[int, collections.Counter[str]]:
    """The number of delegate calls in a lowered program's ``graph`` and the ops left outside
    them (by name; tuple indexing excluded)."""
    calls = [n for n in graph.nodes if n.op == "call_function"]
    delegates = sum(1 for n in calls if "call_delegate" in str(n.target))
    outside = collections.Counter(
        getattr(n.target, "__name__", str(n.target))
        for n in calls
        if "call_delegate" not in str(n.target) and str(n.target) != "<built-in function getitem>"
    )
    return delegates, outside


def load_program(path: str | Path) -> Callable[[Sequence[Tensor]], list[Tensor]]:
    """The ExecuTorch program at ``path``, loaded once by the Python runtime: inputs -> outputs.
    XNNPACK packs its weights on the first call, so time the calls after it."""
    require_executorch()
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    program = _load_for_executorch(str(path))
    return lambda inputs: list(program.forward(list(inputs)))
