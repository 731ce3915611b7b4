"""The dilated depth-wise convolution's CPU backward (``src/kernels/depthwise_conv/__init__.py``,
``src/kernels/depthwise_conv/depthwise_conv.cpp``) against ``F.conv2d`` evaluated in float64.

Tolerances: the forward is ATen's, so it equals ``F.conv2d``'s bit for bit. The input gradient sums
at most k^2 float32 products per element and rounds once to the operands' dtype: within 1e-6 of
the float64 result relative to the largest magnitude for float32, one rounding of the dtype
(2^-8 bfloat16, 2^-11 float16) for 16-bit operands. The weight and bias gradients are float32
sums over every output position: within 1e-5 relative for float32 operands, 2^-7 for 16-bit ones
(rounded to their dtype).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import src.kernels.depthwise_conv
from src.kernels.depthwise_conv import DepthwiseConv2d, depthwise_conv2d
from src.ops.eesp import EESP
from tests.helpers import (
    KIND_FAULTS,
    SHAPE_FAULTS,
    assert_rejected,
    max_relative_error,
    recording_backend,
    require_cpu_kernels,
)

KERNEL = "DepthwiseConvCpuFunctionBackward"
ATEN = "ConvolutionBackward0"
BOUND = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
PARAMETER_BOUND = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-7}


@pytest.fixture
def kernels() -> None:
    require_cpu_kernels()


# (B, C, H, W, k, stride, padding, dilation, bias)
CONFIGS = [
    (2, 5, 9, 7, 3, 1, 2, 2, False),  # EESP's branches: "same" padding d
    (2, 6, 11, 9, 3, 2, 3, 3, True),  # strided, with a bias
    (3, 4, 8, 8, 5, 1, 4, 2, True),
    (2, 3, 7, 6, 3, 2, 0, 2, False),  # no padding
    (2, 2, 5, 5, 3, 1, 4, 4, False),  # taps reaching past every edge
    (20, 4, 6, 6, 3, 1, 2, 2, False),  # 120 output rows: more than the kernel's 64 row blocks
]


def _operands(config: tuple, dtype: torch.dtype = torch.float32):
    batch, channels, height, width, k, stride, padding, dilation, bias = config
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(batch, channels, height, width, generator=gen)
    x = x.to(dtype, memory_format=torch.channels_last)
    weight = torch.randn(channels, 1, k, k, generator=gen).to(dtype)
    b = torch.randn(channels, generator=gen).to(dtype) if bias else None
    return x, weight, b, (stride, padding, dilation)


def _grads(fn, x: Tensor, weight: Tensor, bias: Tensor | None, geometry: tuple, probe=None):
    leaves = [x.detach().requires_grad_(), weight.detach().requires_grad_()]
    if bias is not None:
        leaves.append(bias.detach().requires_grad_())
    y = fn(leaves[0], leaves[1], leaves[2] if bias is not None else None, *geometry)
    if probe is None:
        probe = torch.randn(y.shape, generator=torch.Generator().manual_seed(4)).to(y.dtype)
    return (y, *torch.autograd.grad(y, leaves, probe), type(y.grad_fn).__name__), probe


def _conv(x, weight, bias, stride, padding, dilation):
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups=weight.shape[0])


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_f_conv2d_in_float64(kernels: None, config: tuple, dtype: torch.dtype) -> None:
    x, weight, bias, geometry = _operands(config, dtype)
    ours, probe = _grads(depthwise_conv2d, x, weight, bias, geometry)
    assert ours[-1] == KERNEL
    theirs, _ = _grads(_conv, x, weight, bias, geometry, probe)
    assert torch.equal(ours[0], theirs[0])  # ATen's forward
    assert ours[1].dtype == dtype and ours[1].is_contiguous(memory_format=torch.channels_last)
    double = [t.double() if t is not None else None for t in (x, weight, bias)]
    want, _ = _grads(_conv, *double, geometry, probe.double())
    assert max_relative_error(ours[1], want[1]) <= BOUND[dtype]
    for got, expected in zip(ours[2:-1], want[2:-1], strict=True):
        assert got.dtype == dtype and max_relative_error(got, expected) <= PARAMETER_BOUND[dtype]


def test_gradients_do_not_depend_on_the_thread_count(kernels: None) -> None:
    x, weight, bias, geometry = _operands((20, 6, 8, 8, 3, 1, 2, 2, True))
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            runs.append(_grads(depthwise_conv2d, x, weight, bias, geometry)[0][1:-1])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run, strict=True))


@pytest.mark.parametrize("wanted", [0, 1, 2])
def test_gradient_of_one_operand_alone(kernels: None, wanted: int) -> None:
    x, weight, bias, geometry = _operands(CONFIGS[1])
    (_, *all_grads, _), probe = _grads(depthwise_conv2d, x, weight, bias, geometry)
    leaves = [x.clone(), weight.clone(), bias.clone()]
    leaves[wanted].requires_grad_()
    y = depthwise_conv2d(*leaves, *geometry)
    assert type(y.grad_fn).__name__ == KERNEL
    (grad,) = torch.autograd.grad(y, leaves[wanted], probe)
    assert torch.equal(grad, all_grads[wanted])


def test_autocast_casts_like_f_conv2d(kernels: None) -> None:
    x, weight, bias, geometry = _operands(CONFIGS[1])
    with torch.autocast("cpu", torch.bfloat16):
        ours, probe = _grads(depthwise_conv2d, x, weight, bias, geometry)
        theirs, _ = _grads(_conv, x, weight, bias, geometry, probe)
    assert ours[-1] == KERNEL and theirs[-1] == ATEN
    assert ours[0].dtype == theirs[0].dtype == torch.bfloat16
    assert all(g.dtype == torch.float32 for g in ours[1:-1])  # float32 leaves' gradients
    for got, want in zip(ours[:-1], theirs[:-1], strict=True):
        assert max_relative_error(got, want.double()) <= 2.0**-6


@pytest.mark.parametrize(
    "case", ["no_grad", "contiguous", "undilated", "float64", "no_kernels", "uneven", "dispatch"]
)
def test_f_conv2d_runs_where_the_kernel_does_not_apply(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, weight, bias, (stride, padding, dilation) = _operands(CONFIGS[0])
    if case == "contiguous":
        x = x.contiguous()
    elif case == "undilated":
        padding, dilation = 1, 1
    elif case == "float64":
        x, weight = x.double(), weight.double()
    elif case == "no_kernels":
        monkeypatch.setattr(src.kernels.depthwise_conv, "cpu_kernels_loaded", lambda: False)
    elif case == "uneven":
        dilation, padding = (2, 1), (2, 1)
    x.requires_grad_(case != "no_grad")
    if case == "dispatch":
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            y = depthwise_conv2d(x, weight, bias, stride, padding, dilation)
        assert counter.get_total_flops() > 0
    else:
        y = depthwise_conv2d(x, weight, bias, stride, padding, dilation)
    want = _conv(x, weight, bias, stride, padding, dilation)
    assert torch.equal(y, want)
    assert (y.grad_fn is None) if case == "no_grad" else type(y.grad_fn).__name__ == ATEN


OPERANDS = {"grad_y": 0, "x": 1, "weight": 2}


def _faults() -> list[tuple[str, str]]:
    # x may be 16-bit (the others must then follow it)
    return [
        (n, f)
        for n in OPERANDS
        for f in (*SHAPE_FAULTS, *KIND_FAULTS)
        if (n, f) != ("x", "bfloat16")
    ]


@pytest.mark.parametrize(("name", "fault"), _faults())
def test_kernel_rejects_a_faulty_operand(kernels: None, name: str, fault: str) -> None:
    torch.manual_seed(0)
    # x (B, H, W, C) = (2, 7, 8, 5), 3x3, stride 1, padding 2, dilation 2: grad_y (2, 7, 8, 5)
    args = [torch.randn(2, 7, 8, 5), torch.randn(2, 7, 8, 5), torch.randn(5, 3, 3), 1, 2, 2]
    args += [True, True, True]
    # every size of grad_y and x fixes the other's; the weight's channels come from x, its k is
    # its own (a (5, 2, 2) kernel is valid) but must be square
    fixed = {"weight": (0,)}.get(name, (0, 1, 2, 3))
    if name == "weight" and fault in ("grown", "shrunk"):
        fixed = (0, 2)
    assert_rejected("depthwise_conv_backward", args, name, OPERANDS[name], fault, fixed)


def test_kernel_rejects_a_bad_geometry(kernels: None) -> None:
    grad_y, x, weight = torch.randn(2, 7, 8, 5), torch.randn(2, 7, 8, 5), torch.randn(5, 3, 3)
    op = torch.ops.lightnets_cpu.depthwise_conv_backward
    for stride, padding, dilation in ((0, 2, 2), (1, -1, 2), (1, 2, 0)):
        with pytest.raises(RuntimeError, match="need stride >= 1"):
            op(grad_y, x, weight, stride, padding, dilation, True, True, True)
    with pytest.raises(RuntimeError, match="smaller than the kernel's reach"):
        op(grad_y, x, weight, 1, 0, 5, True, True, True)


def test_module_is_a_drop_in_conv2d_and_eesp_trains_through_it(kernels: None) -> None:
    torch.manual_seed(0)
    ours = DepthwiseConv2d(6, 3, padding=2, dilation=2)
    torch.manual_seed(0)
    theirs = nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=6, bias=False)
    assert isinstance(ours, nn.Conv2d) and ours.state_dict().keys() == theirs.state_dict().keys()
    assert torch.equal(ours.weight, theirs.weight)
    x = torch.randn(2, 6, 9, 9).to(memory_format=torch.channels_last).requires_grad_()
    assert torch.equal(ours(x), theirs(x))

    unit = EESP(32, 32, branches=4, r_lim=7).train()
    nodes = set()
    for conv in unit.transform:
        conv.register_forward_hook(lambda m, i, y: nodes.add(type(y.grad_fn).__name__))
    unit(torch.randn(2, 32, 12, 12).to(memory_format=torch.channels_last)).sum().backward()
    assert KERNEL in nodes  # the dilated branches; the undilated first keeps ATen's
    assert all(conv.weight.grad is not None for conv in unit.transform)


def test_compiled_step_traces_the_kernel_and_matches_eager_bitwise(kernels: None) -> None:
    backend, graphs = recording_backend()
    torch._dynamo.reset()
    x, weight, bias, geometry = _operands(CONFIGS[1])
    eager, probe = _grads(depthwise_conv2d, x, weight, bias, geometry)
    compiled_fn = torch.compile(depthwise_conv2d, backend=backend, fullgraph=True)
    compiled, _ = _grads(compiled_fn, x, weight, bias, geometry, probe)
    torch._dynamo.reset()
    assert len(graphs["backward"]) == 1
    assert "lightnets.depthwise_conv_backward.default" in graphs["backward"][0]
    assert all(torch.equal(a, b) for a, b in zip(eager[:-1], compiled[:-1], strict=True))
