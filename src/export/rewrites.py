"""Rewrites of exported ONNX graphs that onnxruntime runs faster, the same map.

:func:`src.export.onnx.export_onnx` applies them to the file it writes; no op of :mod:`src.ops`
changes.

- **PReLU with every slope in [0, 1]** (:func:`prelu_as_max`): ``Max(x, slope * x)``, two
  element-wise nodes instead of the four of :func:`src.export.onnx.prelu_as_min_max`; for such
  slopes it is the same map, bit for bit. The slopes are the graph's initializers, so a PReLU
  with any slope outside [0, 1] keeps the four-node form. In DiCENet s=1.0 (71 PReLUs) it took
  onnxruntime's element-wise share from about 25% to 15% of the run.
- **PReLU over a multiple of 16 channels** (:func:`prelu_blocked`, after :func:`prelu_as_max`):
  ``Relu(x) + (-slope) * Relu(-1 * x)``, which onnxruntime keeps in its blocked NCHWc layout on
  x86 (the per-channel products become 1x1 depth-wise NCHWc convolutions, the sum fuses into
  the second; blocks of 8 channels with AVX2, 16 with AVX-512, so a multiple of 16 is blocked on
  both), where ``Max`` takes the map out of the layout and back (a ReorderOutput and a
  ReorderInput around each PReLU between blocked convolutions). The same map bit for bit: x >= 0
  gives x + (-slope) * 0, x < 0 gives 0 + slope * x. ESPNetv2 s=1.0 (53 of its 57 PReLUs):
  6.64 -> 5.75 ms, 0.87x (2 threads); DiCENet's maps (116, 232, 464 channels) keep ``Max``
  (rewritten, all 71 PReLUs of DiCENet s=1.0 ran 1.07x slower). Measured with onnxruntime on x86
  only: runtimes without the NCHWc layout run five nodes where ``Max`` needs two.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # onnx is the [export] extra's: imported where a rewrite runs
    import onnx


def _initializer_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:  # Constant nodes too
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _index(model: onnx.ModelProto) -> tuple[list, dict, Counter]:
    """The main graph's nodes, held in a list so that their ids stay unique while a rewrite keys
    on them; each name's producing node; how many nodes (and graph outputs) read each name."""
    graph = model.graph
    nodes = list(graph.node)
    producer = {out: node for node in nodes for out in node.output}
    consumers = Counter(name for node in nodes for name in node.input)
    consumers.update(out.name for out in graph.output)
    return nodes, producer, consumers


def _rewrite(
    model: onnx.ModelProto,
    nodes: list,
    replace: dict[int, list],
    drop: Collection[int] = frozenset(),
    added: Sequence = (),
) -> int:
    """Write the main graph's ``nodes`` back in order, each node whose id is in ``replace`` as
    its replacement nodes and those in ``drop`` left out, with the ``added`` initializers and
    without the ones no node reads any more. Returns how many nodes were replaced."""
    graph = model.graph
    kept = [new for node in nodes if id(node) not in drop for new in replace.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(added)
    drop_unused_initializers(model)
    return len(replace)


def prelu_as_max(model: onnx.ModelProto) -> int:
    """Rewrite, in place, each ``Max(x, 0) + slope * Min(x, 0)`` of the main graph (the PReLU of
    :func:`src.export.onnx.prelu_as_min_max`) whose constant slopes are all in [0, 1] as
    ``Max(x, slope * x)``: two element-wise nodes instead of four, the same map bit for bit there
    (x >= 0: slope * x <= x; x < 0: slope * x >= x). Returns how many were rewritten.
    """
    from onnx import helper

    values = _initializer_values(model)
    nodes, producer, consumers = _index(model)

    def is_zero(name: str) -> bool:
        value = values.get(name)
        return value is not None and value.size == 1 and float(value.reshape(())) == 0.0

    drop, replace = set(), {}
    for add in nodes:
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        parents = [producer.get(name) for name in add.input]
        if any(p is None for p in parents):
            continue
        maximum = next((p for p in parents if p.op_type == "Max"), None)
        mul = next((p for p in parents if p.op_type == "Mul"), None)
        if maximum is None or mul is None or len(maximum.input) != 2:
            continue
        x = next((n for n in maximum.input if not is_zero(n)), None)
        if x is None or not any(is_zero(n) for n in maximum.input):
            continue
        minimum = next((producer.get(n) for n in mul.input if n in producer
                        and producer[n].op_type == "Min"), None)  # fmt: skip
        if minimum is None or sorted(minimum.input) != sorted(maximum.input):
            continue
        slope = next((n for n in mul.input if n != minimum.output[0]), None)
        slope_value = values.get(slope)
        if slope_value is None or not ((slope_value >= 0) & (slope_value <= 1)).all():
            continue
        if any(consumers.get(node.output[0], 0) != 1 for node in (maximum, minimum, mul)):
            continue
        scaled = f"{add.output[0]}_slope_x"
        replace[id(add)] = [
            helper.make_node("Mul", [slope, x], [scaled], name=f"{add.name}_slope_x"),
            helper.make_node("Max", [x, scaled], list(add.output), name=f"{add.name}_max"),
        ]
        drop.update(id(node) for node in (maximum, minimum, mul))
    return _rewrite(model, nodes, replace, drop)


def drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Remove the main graph's initializers no node or output reads any more (the zeros of the
    rewritten PReLUs), which onnxruntime would otherwise warn about on every load."""
    from onnx import AttributeProto

    graph = model.graph
    used = {name for node in graph.node for name in node.input}
    used.update(out.name for out in graph.output)
    for node in graph.node:  # inputs of subgraphs (If, Loop) read the outer scope too
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                used.update(name for inner in attribute.g.node for name in inner.input)
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


BLOCK = 16  # onnxruntime's NCHWc block: 8 channels with AVX2, 16 with AVX-512


def prelu_blocked(model: onnx.ModelProto, block: int = BLOCK) -> int:
    """Rewrite, in place, each ``Max(x, slope * x)`` of the main graph (:func:`prelu_as_max`'s
    PReLU) whose constant per-channel slope has a multiple of ``block`` entries as
    ``Relu(x) + (-slope) * Relu(-1 * x)``, the same map bit for bit, which onnxruntime's NCHWc
    layout keeps blocked. Returns how many were rewritten.
    """
    from onnx import helper, numpy_helper

    values = _initializer_values(model)
    nodes, producer, consumers = _index(model)
    drop, replace, added = set(), {}, []
    for maximum in nodes:
        if maximum.op_type != "Max" or len(maximum.input) != 2:
            continue
        mul = next((producer.get(n) for n in maximum.input if n in producer
                    and producer[n].op_type == "Mul"), None)  # fmt: skip
        if mul is None or consumers.get(mul.output[0], 0) != 1:
            continue
        x = next((n for n in maximum.input if n != mul.output[0]), None)
        if x is None or x not in mul.input:
            continue
        slope = next((n for n in mul.input if n != x), None)
        value = values.get(slope)
        # a per-channel slope (C, 1, 1) of a blocked width; a single slope says nothing of C
        if value is None or value.size <= 1 or value.size % block:
            continue
        stem = maximum.output[0]
        minus_one, minus_slope = f"{stem}_minus_one", f"{stem}_minus_slope"
        added += [
            numpy_helper.from_array(np.full_like(value, -1), minus_one),
            numpy_helper.from_array(-value, minus_slope),
        ]
        replace[id(maximum)] = [
            helper.make_node("Relu", [x], [f"{stem}_pos"], name=f"{stem}_relu"),
            helper.make_node("Mul", [x, minus_one], [f"{stem}_neg_x"], name=f"{stem}_negate"),
            helper.make_node("Relu", [f"{stem}_neg_x"], [f"{stem}_neg"], name=f"{stem}_relu_neg"),
            helper.make_node(
                "Mul", [f"{stem}_neg", minus_slope], [f"{stem}_tail"], name=f"{stem}_slope"
            ),
            helper.make_node(
                "Add", [f"{stem}_pos", f"{stem}_tail"], list(maximum.output), name=f"{stem}_sum"
            ),
        ]
        drop.add(id(mul))
    return _rewrite(model, nodes, replace, drop, added)
