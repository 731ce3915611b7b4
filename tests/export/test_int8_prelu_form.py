"""benchmarks/int8_prelu.py: PReLU as ``x + relu((slope - 1) x)`` is the same map for slopes up to
1, is refused above, and its exported ``Mul -> Relu -> Add`` nodes are the ones found to
quantise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.int8_prelu import check_slopes, prelu_nodes, quantisable_prelu


def test_the_quantisable_form_is_prelu_for_slopes_up_to_one() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 7)
    slopes = torch.tensor([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 0.33])
    expected = F.prelu(x, slopes)
    original = F.prelu
    with quantisable_prelu():
        # the same map; float32 rounds the two products differently (about one ulp)
        assert torch.allclose(F.prelu(x, slopes), expected, atol=1e-6, rtol=0)
        assert torch.allclose(F.prelu(x, slopes[:1]), F.relu(x) + 0.0 * x)  # one shared slope
    with quantisable_prelu(keep_float=lambda t: t.shape[-1] == 7):
        assert torch.equal(F.prelu(x, slopes), expected)  # left to PReLU itself
    assert F.prelu is original  # restored after the block
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.PReLU(4))
    check_slopes(net)
    with torch.no_grad():
        net[1].weight[2] = 1.5
    with pytest.raises(ValueError, match="slope above 1"):
        check_slopes(net)


def test_the_exported_form_is_found_node_by_node(tmp_path) -> None:
    onnx = pytest.importorskip("onnx")
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.PReLU(4), nn.Conv2d(4, 4, 1), nn.PReLU(4))
    net.eval()
    path = tmp_path / "net.onnx"
    with torch.no_grad(), quantisable_prelu():
        torch.onnx.export(net, (torch.randn(1, 3, 8, 8),), str(path), dynamo=True, opset_version=18)
    model = onnx.load(str(path))
    names = prelu_nodes(model)
    ops = {n.name: n.op_type for n in model.graph.node}
    assert [ops[n] for n in names] == ["Mul", "Relu", "Add"] * 2
