"""The rewrites of :mod:`src.export.rewrites`: the same outputs, fewer nodes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from src.export.onnx import export_onnx, op_counts, parity, session
from src.export.spec import ExportSpec
from src.kernels.prelu import PReLU
from src.ops.dim_conv import DimConv

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
onnx = pytest.importorskip("onnx")

TOLERANCE = 1e-4  # fp32 max abs error against eager


class DimConvPReLU(nn.Module):
    """DimConv then a PReLU over its 3C channels (DiCE's resizes in the graph, then the rewrite).

    Shape:
        (B, C, H, W) -> (B, 3C, H, W)
    """

    def __init__(self, channels: int, side: int, slope: float) -> None:
        super().__init__()
        self.dim_conv = DimConv(channels, side, side)
        self.act = PReLU(3 * channels, init=slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dim_conv(x))


def spec_of(net: nn.Module, side: int, dynamic: bool) -> ExportSpec:
    torch.manual_seed(0)
    return ExportSpec(
        name="network",
        module=net.eval(),
        inputs=(torch.randn(2, 4, side, side),),
        input_names=["image"],
        output_names=["features"],
        dynamic={"image": {0: "batch", 2: "height", 3: "width"}} if dynamic else {},
    )


def test_prelu_as_max(tmp_path) -> None:
    torch.manual_seed(0)
    spec = spec_of(DimConvPReLU(4, 16, slope=0.25), 16, dynamic=True)
    plain = op_counts(export_onnx(spec, tmp_path / "plain.onnx", rewrite=False))
    path = export_onnx(spec, tmp_path / "net.onnx")
    ops = op_counts(path)
    # Max(x, 0) + slope * Min(x, 0) -> Max(x, slope * x): one Min and one Add fewer (the resizes
    # of the dynamic size hold Min, Max and Add nodes of their own)
    assert (ops["Min"], ops["Add"]) == (plain["Min"] - 1, plain["Add"] - 1), (ops, plain)
    assert (ops["Max"], ops["Mul"]) == (plain["Max"], plain["Mul"]), (ops, plain)
    graph = onnx.load(str(path)).graph  # no initializer left unread (the rewritten zero)
    read = {name for node in graph.node for name in node.input}
    assert [t.name for t in graph.initializer if t.name not in read] == []
    runner = session(path)
    for height, width in [(16, 16), (24, 32), (8, 12)]:  # the export size and two others
        check = parity(runner, spec, (torch.randn(3, 4, height, width),))
        assert check["max_abs"] <= TOLERANCE, (height, width, check)


def test_prelu_outside_unit_interval_keeps_min(tmp_path) -> None:
    torch.manual_seed(0)
    net = DimConvPReLU(4, 16, slope=0.25)
    with torch.no_grad():
        net.act.weight[0] = 1.5  # Max(x, 1.5 x) is not PReLU for x > 0
    spec = spec_of(net, 16, dynamic=False)
    path = export_onnx(spec, tmp_path / "net.onnx")
    plain = op_counts(export_onnx(spec, tmp_path / "plain.onnx", rewrite=False))
    assert op_counts(path) == plain
    check = parity(session(path), spec, (torch.randn(2, 4, 16, 16),))
    assert check["max_abs"] <= TOLERANCE, check


class ConvPReLU(nn.Module):
    """A 1x1 convolution to ``channels`` maps, then their PReLU (slopes spread over [0, 1]).

    Shape:
        (B, 4, H, W) -> (B, channels, H, W)
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, channels, 1)
        self.act = PReLU(channels)
        with torch.no_grad():
            self.act.weight.copy_(torch.linspace(0.0, 1.0, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


@pytest.mark.parametrize(("channels", "blocked"), [(32, True), (24, False)])
def test_prelu_blocked(tmp_path, channels: int, blocked: bool) -> None:
    from src.export.rewrites import prelu_as_max, prelu_blocked

    torch.manual_seed(0)
    spec = spec_of(ConvPReLU(channels), 8, dynamic=False)
    plain = export_onnx(spec, tmp_path / "plain.onnx", rewrite=False)
    as_max = onnx.load(str(plain))
    assert prelu_as_max(as_max) == 1
    rewritten = onnx.load(str(plain))
    prelu_as_max(rewritten)
    # 32 channels are whole NCHWc blocks (8 or 16): rewritten; 24 are not whole blocks of 16
    assert prelu_blocked(rewritten) == int(blocked)
    ops = [node.op_type for node in rewritten.graph.node]
    if blocked:
        assert "Max" not in ops and ops.count("Relu") == 2, ops
    else:
        assert "Relu" not in ops and ops.count("Max") == 1, ops
    paths = []
    for name, model in (("max", as_max), ("blocked", rewritten)):
        paths.append(tmp_path / f"{name}.onnx")
        onnx.save(model, str(paths[-1]))
    x = torch.randn(2, 4, 8, 8) * 4  # the static batch of spec_of
    feeds = {"image": x.numpy()}
    expected, got = (session(path).run(None, feeds)[0] for path in paths)
    # the same map bit for bit: x >= 0 gives x + (-slope) * 0, x < 0 gives 0 + slope * x
    assert (got == expected).all()
    assert check_parity(spec, paths[1], x)


def check_parity(spec: ExportSpec, path, x: torch.Tensor) -> bool:
    return parity(session(path), spec, (x,))["max_abs"] <= TOLERANCE
