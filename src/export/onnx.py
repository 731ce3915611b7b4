"""ONNX files of an :class:`~src.export.spec.ExportSpec`, run by onnxruntime and checked against
eager PyTorch.

The graph is captured by ``torch.export`` and translated by ``torch.onnx``'s dynamo exporter
(``torch.onnx.export(..., dynamo=True)``): while it traces, every op of :mod:`src.ops` takes its
PyTorch reference path (:func:`src.kernels.dispatch.exporting`), so the file holds standard ONNX
operators only. A dimension the spec leaves dynamic is a ``torch.export.Dim``; one that the
network can only take in steps (an image side, a multiple of the network's output stride) is
that step times a ``Dim``. The TorchScript exporter (``dynamo=False``) records reshapes of the
DiCE units' resizes with the example's sizes, so its files run at the export size only: it is not
used.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import inspect
import logging
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from src.export.spec import ExportSpec
from src.utils.files import atomic_path

EXPORTER = "torch.onnx.export(dynamo=True)"
DEFAULT_OPSET = 18
MIN_STEPS = 2  # an image side of one output stride leaves 1x1 maps, which some units refuse
# the libraries whose log records are kept off the console: the exporter's optimiser logs each
# deduplicated initializer ("Replaced initializer ...", 1,448 lines for DiCENet) and each rewrite
CHATTY = ("onnx", "onnx_ir", "onnxscript", "onnxruntime", "torch.onnx")


def library_folders() -> tuple[str, ...]:
    """The installed folders of the :data:`CHATTY` packages, each ending in a separator."""
    folders = []
    for name in CHATTY:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            folders.append(os.path.join(os.path.realpath(folder), ""))
    return tuple(folders)


def from_library(record: logging.LogRecord, folders: tuple[str, ...]) -> bool:
    """Whether ``record`` comes from one of :data:`CHATTY`: by its logger's name, or, for what
    they log through the root logger (onnxruntime's quantizer calls ``logging.warning``), by its
    call site being in one of their ``folders`` (:func:`library_folders`)."""
    if any(record.name == name or record.name.startswith(name + ".") for name in CHATTY):
        return True
    return os.path.realpath(record.pathname).startswith(folders)


@contextlib.contextmanager
def library_logs_to_file() -> Iterator[None]:
    """Inside the block, the log records of the ONNX libraries (:data:`CHATTY`) reach the root
    logger's file handlers (the run's log file) and no other handler (the console), and
    onnxruntime's own C++ logger reports errors only."""
    import onnxruntime as ort

    folders = library_folders()

    def quiet(record: logging.LogRecord) -> bool:  # a handler's filter: False drops the record
        return not from_library(record, folders)

    consoles = [
        handler
        for handler in logging.getLogger().handlers
        if not isinstance(handler, logging.FileHandler)
    ]
    for handler in consoles:
        handler.addFilter(quiet)
    ort.set_default_logger_severity(3)  # its sessions' warnings, the calibrator's among them
    try:
        yield
    finally:
        ort.set_default_logger_severity(2)  # onnxruntime's default: warnings
        for handler in consoles:
            handler.removeFilter(quiet)


def dynamic_shapes(spec: ExportSpec) -> tuple[Any, ...]:
    """``torch.export`` dimensions of ``spec.inputs``: one ``Dim`` per dimension name (inputs that
    share a name share it), ``step * Dim`` where ``spec.steps`` has the name; grouped as the
    module's ``forward`` takes its inputs (a ``*state`` parameter takes the rest as one tuple)."""
    dims: dict[str, Any] = {}
    for axes in spec.dynamic.values():
        for name in axes.values():
            if name in dims:
                continue
            step = spec.steps.get(name, 1)
            dims[name] = (
                step * torch.export.Dim(f"{name}_steps", min=MIN_STEPS)
                if step > 1
                else torch.export.Dim(name, min=1)
            )
    shapes = [
        {axis: dims[name] for axis, name in spec.dynamic[input_name].items()}
        if input_name in spec.dynamic
        else None
        for input_name in spec.input_names
    ]
    grouped: list[Any] = []
    parameters = inspect.signature(spec.module.forward).parameters.values()
    for i, parameter in enumerate(parameters):
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            grouped.append(tuple(shapes[i:]))
            break
        if i < len(shapes):
            grouped.append(shapes[i])
    return tuple(grouped)


def prelu_as_min_max(x: Any, weight: Any) -> Any:
    """``aten.prelu`` as ``Max(x, 0) + slope * Min(x, 0)`` in the ONNX graph, slope (1, C, 1, ...).

    onnxruntime runs its ``PRelu`` node with a per-channel slope as a generic broadcast: measured on
    2 cores of an AMD EPYC (2026-11-27), 857 us for a (1, 232, 28, 28) map against 94 us for these
    four element-wise nodes, and ``PRelu`` was 47% of DiCENet s=1.0's onnxruntime time.
    """
    from onnxscript import opset18 as op

    rank = len(x.shape)
    if rank >= 2:
        weight = op.Reshape(weight, op.Constant(value_ints=[1, -1] + [1] * (rank - 2)))
    zero = op.CastLike(op.Constant(value_float=0.0), x)
    return op.Add(op.Max(x, zero), op.Mul(weight, op.Min(x, zero)))


def attention_any_rank(
    query: object,
    key: object,
    value: object,
    attn_mask: object = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> object:
    """ONNX of ``aten.scaled_dot_product_attention`` for 3-D operands as well (DeLighT's single
    head attention, (B, T, d)), which onnxscript's translation refuses: ``softmax(q k^T scale +
    mask) v``, written out. Dropout is not exported (eval mode)."""
    import numpy as np
    from onnxscript import ir
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops.nn import aten_scaled_dot_product_attention

    if len(query.shape) != 3:  # type: ignore[attr-defined]
        return aten_scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
    if scale is None:
        scale = 1.0 / float(query.shape[-1]) ** 0.5  # type: ignore[attr-defined]
    scores = op.MatMul(query, op.Transpose(key, perm=[0, 2, 1]))  # (B, T, S)
    scores = op.Mul(scores, op.CastLike(scale, query))
    if is_causal:
        ones = op.ConstantOfShape(
            op.Concat(op.Shape(query, start=1, end=2), op.Shape(key, start=1, end=2), axis=0),
            value=ir.tensor(np.ones(1, dtype=bool)),
        )
        attn_mask = op.Trilu(ones, upper=0)  # (T, S), True where a query may read a key
    if attn_mask is not None:
        if attn_mask.dtype == ir.DataType.BOOL:  # type: ignore[attr-defined]
            minus_inf = op.CastLike(float("-inf"), query)
            attn_mask = op.Where(attn_mask, op.CastLike(0.0, query), minus_inf)
        scores = op.Add(scores, attn_mask)
    return op.MatMul(op.Softmax(scores, axis=-1), value)  # (B, T, d)


def custom_translations() -> dict:
    """The ATen ops this project translates itself (:func:`prelu_as_min_max`,
    :func:`attention_any_rank`)."""
    return {
        torch.ops.aten.prelu.default: prelu_as_min_max,
        torch.ops.aten._prelu_kernel.default: prelu_as_min_max,
        torch.ops.aten.scaled_dot_product_attention.default: attention_any_rank,
    }


def traced_inputs(spec: ExportSpec) -> tuple[Tensor, ...]:
    """``spec.inputs`` as traced: an input whose dynamic batch ("batch") is 1 in the example is
    repeated to 2 along it, since ``torch.export`` specialises a dimension of size 1 to the
    constant 1 (the export then fails with "Constraints violated (batch)"); the graph takes any
    batch either way."""
    inputs = []
    for name, tensor in zip(spec.input_names, spec.inputs, strict=True):
        for axis, dim in spec.dynamic.get(name, {}).items():
            if dim == "batch" and tensor.shape[axis] == 1:
                tensor = torch.cat([tensor, tensor], axis)
        inputs.append(tensor)
    return tuple(inputs)


def export_onnx(
    spec: ExportSpec,
    path: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    optimize: bool = True,
    rewrite: bool = True,
) -> Path:
    """Write ``spec``'s graph to ``path`` (whole or not at all) with the dynamo exporter; returns
    the path. ``optimize``: ``torch.onnx``'s graph optimisation (constant folding, fused shapes).
    ``rewrite``: the rewrites of :mod:`src.export.rewrites` that onnxruntime runs faster (the
    same map)."""
    import onnx

    from src.export.rewrites import prelu_as_max, prelu_blocked

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a copy is traced: tracing may leave traced tensors in a module's attributes (the folded
    # inference caches), which the eager module then must not see
    module = copy.deepcopy(spec.module).eval()
    with torch.no_grad():
        program = torch.onnx.export(
            module,
            traced_inputs(spec),
            dynamo=True,
            dynamic_shapes=dynamic_shapes(spec),
            input_names=spec.input_names,
            output_names=spec.output_names,
            opset_version=opset,
            optimize=optimize,
            verbose=False,
            custom_translation_table=custom_translations(),
        )
    with atomic_path(path) as temporary:
        program.save(str(temporary))
        if rewrite:
            model = onnx.load(str(temporary))
            prelu_as_max(model)
            prelu_blocked(model)
            onnx.save(model, str(temporary))
    return path


def session(path: str | Path) -> Any:
    """An onnxruntime CPU session of the file at ``path``, with every graph optimisation.

    ``ORT_ENABLE_ALL`` adds to ``ORT_ENABLE_EXTENDED`` the NCHWc layout of the convolutions (with
    its ReorderInput/ReorderOutput nodes around them): DiCENet s=1.0 ran 1.1-1.6x and ESPNetv2
    s=1.0 1.9-2.0x faster with it than without (batch 1, 2 threads, onnxruntime 1.32, 2 shared
    cores of an AMD EPYC, 2026-11-28), so it is not chosen per file.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: shape-inference notes are not the user's
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_session(runner: Any, input_names: Sequence[str], inputs: Sequence[Tensor]) -> list[Tensor]:
    """The graph's outputs for ``inputs`` (in ``input_names`` order), as tensors."""
    feeds = {name: t.detach().cpu().numpy() for name, t in zip(input_names, inputs)}
    return [torch.from_numpy(np.asarray(out)) for out in runner.run(None, feeds)]


def eager_outputs(module: torch.nn.Module, inputs: Sequence[Tensor]) -> list[Tensor]:
    """``module(*inputs)`` in eval mode without autograd, flattened to a list of tensors."""
    module.eval()
    with torch.no_grad():
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def parity(runner: Any, spec: ExportSpec, inputs: Sequence[Tensor]) -> dict[str, Any]:
    """Errors of the ONNX graph against eager PyTorch on ``inputs``: the largest absolute error
    over all outputs, and that error relative to the largest eager magnitude of its output.

    Returns ``{"shapes": [input shapes], "max_abs": float, "max_rel": float}``.
    """
    expected = eager_outputs(spec.module, inputs)
    got = run_session(runner, spec.input_names, inputs)
    if len(got) != len(expected):
        raise RuntimeError(f"the graph gave {len(got)} outputs, eager PyTorch {len(expected)}")
    max_abs, max_rel = 0.0, 0.0
    for g, e in zip(got, expected):
        if tuple(g.shape) != tuple(e.shape):
            raise RuntimeError(f"output shape {tuple(g.shape)} != eager {tuple(e.shape)}")
        error = (g.double() - e.double()).abs().max().item()
        max_abs = max(max_abs, error)
        max_rel = max(max_rel, error / max(e.double().abs().max().item(), 1e-12))
    return {"shapes": [list(t.shape) for t in inputs], "max_abs": max_abs, "max_rel": max_rel}


def op_counts(path: str | Path) -> dict[str, int]:
    """How many nodes of each operator type (``domain::type`` outside the standard domain) the
    file's main graph holds: the card's record of what was exported."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts = Counter(
        f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        for node in model.graph.node
    )
    return dict(sorted(counts.items()))


def graph_inputs(path: str | Path) -> list[dict[str, Any]]:
    """Name, element type and shape (a dimension's name where it is dynamic) of each input."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    rows = []
    for value in model.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_param if d.dim_param else d.dim_value for d in tensor.shape.dim]
        rows.append(
            {
                "name": value.name,
                "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name,
                "shape": shape,
                "dynamic": [i for i, d in enumerate(shape) if isinstance(d, str)],
            }
        )
    return rows
