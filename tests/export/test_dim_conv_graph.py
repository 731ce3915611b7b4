"""DimConv's exported graph at its build size: the same map as the reference, no resize products,
and transposes that each move one axis; off the build size (or with a dynamic size) the reference's
resizes stay."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from src.kernels.dim_conv import dim_conv_exported, dim_conv_reference
from src.ops.dim_conv import DimConv

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def weights(channels: int, height: int, width: int, k: int = 3) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    shapes = ((channels, 1, k, k), (height, 1, k, k), (width, 1, k, k))
    return tuple(torch.randn(shape, generator=generator) for shape in shapes)


@pytest.mark.parametrize(
    ("interleave", "dilation", "k"),
    [(True, (1, 1, 1), 3), (False, (1, 1, 1), 3), (True, (1, 2, 3), 3), (True, (2, 1, 1), 5)],
)
def test_the_exported_formulation_equals_the_reference(interleave, dilation, k) -> None:
    # a non-square map with C != H != W: a swapped axis or kernel would not line up
    x = torch.randn(2, 6, 7, 9, generator=torch.Generator().manual_seed(1))
    w = weights(6, 7, 9, k)
    expected = dim_conv_reference(x, w, dilation=dilation, interleave=interleave)
    got = dim_conv_exported(x, w, dilation=dilation, interleave=interleave)
    assert got.shape == (2, 18, 7, 9)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def is_one_axis_move(perm: list[int]) -> bool:
    """Whether ``perm`` moves a single axis to another place, the others keeping their order."""
    n = len(perm)
    for src, dst in itertools.product(range(n), range(n)):
        rest = [a for a in range(n) if a != src]
        if rest[:dst] + [src] + rest[dst:] == perm:
            return True
    return False


def export(net: torch.nn.Module, x: torch.Tensor, path: Path, dynamic: bool) -> Path:
    shapes = ({2: torch.export.Dim("h", min=4, max=64), 3: torch.export.Dim("w", min=4, max=64)},)
    with torch.no_grad():
        program = torch.onnx.export(
            net, (x,), dynamo=True, opset_version=18, dynamic_shapes=shapes if dynamic else None
        )
    program.save(str(path))
    return path


def run(path: Path, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (name,) = [i.name for i in session.get_inputs()]
    return session.run(None, {name: x.numpy()})[0]


@pytest.mark.parametrize(
    ("size", "dynamic", "products"),
    [((7, 9), False, False), ((10, 6), False, True), ((7, 9), True, True)],
    ids=["build-size", "other-static-size", "dynamic-size"],
)
def test_the_onnx_graph(tmp_path: Path, size, dynamic: bool, products: bool) -> None:
    torch.manual_seed(0)
    net = DimConv(6, 7, 9, dilation=(1, 2, 1)).eval()
    x = torch.randn(1, 6, *size)
    path = export(net, x, tmp_path / "dim_conv.onnx", dynamic)
    graph = onnx.load(str(path)).graph
    ops = [node.op_type for node in graph.node]
    # the resize products are in the graph off the build size or where the size is dynamic only
    assert ("MatMul" in ops) == products, ops
    if not products:
        perms = [
            list(attribute.ints)
            for node in graph.node
            if node.op_type == "Transpose"
            for attribute in node.attribute
        ]
        assert len(perms) == 4 and all(is_one_axis_move(p) for p in perms), perms
    with torch.no_grad():
        expected = net(x).numpy()
    np.testing.assert_allclose(run(path, x), expected, rtol=1e-5, atol=1e-5)
    if dynamic:  # another size through the same file
        other = torch.randn(1, 6, 12, 5)
        with torch.no_grad():
            np.testing.assert_allclose(run(path, other), net(other).numpy(), rtol=1e-5, atol=1e-5)
