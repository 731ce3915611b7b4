"""Point-wise convolutions as products on the rows (``src/kernels/pointwise_conv.py``) against a
float64 oracle and ``F.conv2d``.

Tolerance: the output and the three gradients within 1e-5 of the float64 oracle relative to each
tensor's largest value (float32 GEMMs, sums in another order than oneDNN's).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from src.kernels.pointwise_conv import PointwiseConv2d, pointwise_conv, row_view
from src.models.dicenet import DiCENet
from tests.helpers import autograd_node_names, max_relative_error, recording_backend

OURS = "PointwiseConvCpuFunctionBackward"


def _channels_last(*shape: int) -> Tensor:
    return torch.randn(*shape).contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    ("case", "rows"),
    [("channels_last", True), ("first_half", True), ("second_half", True), ("nchw", False),
     ("pooled", True), ("one_column", True), ("every_other_row", False),
     ("every_other_row_of_one_image", False), ("one_pixel", True)],
)  # fmt: skip
def test_row_view_is_the_rows_in_place_or_none(case: str, rows: bool) -> None:
    x = _channels_last(3, 20, 6, 5)
    x = {
        "channels_last": x,
        "first_half": x[:, :10],  # a DiCENet unit's split
        "second_half": x[:, 10:],
        "nchw": x.contiguous(),
        "pooled": torch.randn(3, 20, 1, 1),
        "one_column": _channels_last(3, 20, 6, 1)[:, 4:9],
        "every_other_row": x[:, :, ::2],
        "every_other_row_of_one_image": x[:1, :, ::2],
        "one_pixel": torch.randn(1, 7, 1, 1),
    }[case]
    view = row_view(x)
    assert (view is not None) == rows
    if view is not None:
        assert view.data_ptr() == x.data_ptr()  # a view: no copy
        assert torch.equal(view, x.permute(0, 2, 3, 1).reshape(-1, x.shape[1]))


def _oracle(x: Tensor, weight: Tensor, bias: Tensor | None, probe: Tensor) -> list[Tensor]:
    leaves = [t.detach().double().requires_grad_() for t in (x, weight)]
    b = bias.detach().double().requires_grad_() if bias is not None else None
    y = F.conv2d(leaves[0], leaves[1], b)
    return [y, *torch.autograd.grad(y, [*leaves, *([b] if b is not None else [])], probe.double())]


@pytest.mark.parametrize(
    ("case", "bias", "grad_channels_last"),
    [("channels_last", True, True), ("channels_last", False, False), ("split_half", True, True),
     ("pooled", True, True)],
)  # fmt: skip
def test_matches_the_float64_oracle(case: str, bias: bool, grad_channels_last: bool) -> None:
    torch.manual_seed(0)
    if case == "split_half":
        x = _channels_last(2, 48, 5, 7)[:, 24:]
    elif case == "pooled":
        x = torch.randn(3, 24, 1, 1)
    else:
        x = _channels_last(2, 24, 5, 7)
    x.requires_grad_()
    conv = PointwiseConv2d(24, 40, bias=bias)
    y = conv(x)
    probe = torch.randn(y.shape)
    if grad_channels_last:
        probe = probe.contiguous(memory_format=torch.channels_last)
    params = [conv.weight, *([conv.bias] if bias else [])]
    got = [y, *torch.autograd.grad(y, [x, *params], probe)]
    want = _oracle(x, conv.weight, conv.bias, probe)
    assert type(y.grad_fn).__name__ == OURS
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert got[1].shape == x.shape and got[2].shape == conv.weight.shape
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32 and max_relative_error(a, b) < 1e-5


@pytest.mark.parametrize(
    "case",
    ["grouped", "few_inputs", "nchw", "no_grad", "autocast", "float64", "strided", "flop_counter"],
)
def test_f_conv2d_runs_where_the_products_do_not_apply(case: str) -> None:
    torch.manual_seed(0)
    groups = 2 if case == "grouped" else 1
    c_in = 4 if case == "few_inputs" else 16
    conv = PointwiseConv2d(c_in, 8, groups=groups)
    x = _channels_last(2, c_in, 3, 3)
    if case == "nchw":
        x = x.contiguous()
    elif case == "float64":
        conv, x = conv.double(), x.double()
    elif case == "strided":
        x = _channels_last(2, c_in, 6, 3)[:, :, ::2]
    x.requires_grad_()
    with (
        torch.set_grad_enabled(case != "no_grad"),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "autocast"),
    ):
        if case == "flop_counter":
            with FlopCounterMode(display=False) as counter:
                y = conv(x)
            assert counter.get_total_flops() == 2 * 2 * 9 * 16 * 8  # counted as a convolution
        else:
            y = conv(x)
        want = F.conv2d(x, conv.weight, conv.bias, groups=groups)
    assert torch.equal(y, want)
    assert y.grad_fn is None if case == "no_grad" else type(y.grad_fn).__name__ != OURS


def test_module_is_a_drop_in_nn_conv2d() -> None:
    torch.manual_seed(3)
    ours = PointwiseConv2d(16, 8, groups=2, bias=False)
    torch.manual_seed(3)
    theirs = nn.Conv2d(16, 8, 1, groups=2, bias=False)
    assert isinstance(ours, nn.Conv2d)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert torch.equal(ours.weight, theirs.weight)  # the same initialisation
    x = torch.randn(2, 16, 3, 3)
    assert torch.equal(pointwise_conv(x, ours.weight, None, 2), theirs(x))


def test_compiled_step_traces_the_products_and_matches_eager_bitwise() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = PointwiseConv2d(16, 12)
    x = _channels_last(2, 16, 4, 5).requires_grad_()
    probe = torch.randn(2, 12, 4, 5)

    def step(fn) -> list[Tensor]:
        y = fn(x)
        return [y, *torch.autograd.grad(y, [x, conv.weight, conv.bias], probe)]

    backend, graphs = recording_backend()
    compiled = step(torch.compile(conv, backend=backend, fullgraph=True))
    eager = step(conv)
    torch._dynamo.reset()
    assert "aten.mm" in "".join(graphs["backward"]) and "convolution" not in "".join(
        graphs["forward"]
    )
    assert all(torch.equal(a, b) for a, b in zip(compiled, eager, strict=True))


def test_dicenet_trains_its_point_wise_convolutions_as_products() -> None:
    net = DiCENet(0.5, num_classes=10, in_chans=1, input_size=32, stem_stride=2)
    net = net.to(memory_format=torch.channels_last)
    names = autograd_node_names(
        net(torch.randn(2, 1, 32, 32).to(memory_format=torch.channels_last))
    )
    pointwise = [
        m for m in net.modules()
        if isinstance(m, PointwiseConv2d) and m.groups == 1 and m.in_channels >= 8
    ]  # fmt: skip
    assert names.count(OURS) == len(pointwise) > 40
