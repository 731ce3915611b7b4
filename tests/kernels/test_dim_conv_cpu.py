"""DimConv on the CPU kernels (``src/kernels/dim_conv/__init__.py``,
``src/kernels/dim_conv/dim_conv.cpp``)
against the eager path (:func:`src.kernels.dim_conv.dim_conv_reference`) and its float64 evaluation.

Tolerances: the output and the input gradient sum at most 3 k^2 float32 products per element and
round once to the operands' dtype: within 1e-6 of the float64 result relative to the largest
magnitude for float32, one rounding of the dtype (2^-8 bfloat16, 2^-11 float16) for 16-bit
operands. The weight gradients are float32 sums over every position: within 1e-5 relative for
float32 operands, 2^-7 relative to the largest for 16-bit ones (rounded to their dtype).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import src.kernels.dim_conv
from src.kernels.dim_conv import dim_conv_cpu, dim_conv_reference
from src.ops.dim_conv import DimConv
from src.utils.complexity import measure
from tests.helpers import (
    KIND_FAULTS,
    SHAPE_FAULTS,
    assert_rejected,
    max_relative_error,
    recording_backend,
    require_cpu_kernels,
)

KERNEL = "DimConvCpuFunctionBackward"
BOUND = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
WEIGHT_BOUND = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-7}


@pytest.fixture
def kernels() -> None:
    require_cpu_kernels()


# (B, C, H, W, kernel size, dilation (channel, height, width), interleave)
CONFIGS = [
    (2, 5, 6, 7, 3, (1, 1, 1), True),  # DiCE's
    (2, 6, 5, 9, 3, (2, 1, 3), False),  # per-branch dilations, concatenated
    (3, 4, 7, 7, 5, (1, 2, 1), True),
    (2, 3, 4, 4, 1, (1, 1, 1), True),  # 1x1: no neighbours
    (2, 2, 3, 3, 5, (2, 2, 2), True),  # taps reaching past every edge
    (20, 4, 4, 3, 3, (1, 1, 1), True),  # 80 (b, h) rows: more than the kernel's 64 row blocks
]


def _module(config: tuple, dtype: torch.dtype = torch.float32) -> tuple[DimConv, Tensor, Tensor]:
    batch, channels, height, width, k, dilation, interleave = config
    torch.manual_seed(0)
    conv = DimConv(channels, height, width, kernel_size=k, dilation=dilation, interleave=interleave)
    conv = conv.to(dtype)
    x = torch.randn(batch, channels, height, width).to(dtype, memory_format=torch.channels_last)
    probe = torch.randn(batch, 3 * channels, height, width).to(dtype)
    return conv, x, probe


def _weights(conv: DimConv) -> tuple[Tensor, Tensor, Tensor]:
    return conv.weight_channel, conv.weight_height, conv.weight_width


def _grads(fn, conv: DimConv, x: Tensor, probe: Tensor) -> tuple:
    x = x.detach().requires_grad_()
    y = fn(x)
    return (y, *torch.autograd.grad(y, (x, *_weights(conv)), probe), type(y.grad_fn).__name__)


def _reference(conv: DimConv):
    return lambda x: dim_conv_reference(
        x, _weights(conv), dilation=conv.dilation, interleave=conv.interleave
    )


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_the_eager_path_in_float64(
    kernels: None, config: tuple, dtype: torch.dtype
) -> None:
    conv, x, probe = _module(config, dtype)
    ours = _grads(conv, conv, x, probe)
    assert ours[-1] == KERNEL
    assert ours[0].dtype == dtype and ours[0].is_contiguous(memory_format=torch.channels_last)
    assert ours[1].is_contiguous(memory_format=torch.channels_last)
    assert all(g.dtype == dtype and g.shape == w.shape for g, w in zip(ours[2:5], _weights(conv)))
    double = conv.double()
    want = _grads(_reference(double), double, x.double(), probe.double())
    for got, expected, bound in zip(
        ours[:5], want[:5], [BOUND[dtype]] * 2 + [WEIGHT_BOUND[dtype]] * 3, strict=True
    ):
        assert max_relative_error(got, expected) <= bound


def test_weight_gradients_do_not_depend_on_the_thread_count(kernels: None) -> None:
    conv, x, probe = _module((20, 6, 8, 8, 3, (1, 1, 1), True))
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            runs.append(_grads(conv, conv, x, probe)[:5])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run, strict=True))


@pytest.mark.parametrize("wanted", ["x", "weights"])
def test_gradients_of_some_operands_alone(kernels: None, wanted: str) -> None:
    conv, x, probe = _module(CONFIGS[0])
    both = _grads(conv, conv, x, probe)
    x = x.detach().requires_grad_(wanted == "x")
    for weight in _weights(conv):
        weight.requires_grad_(wanted == "weights")
    y = conv(x)
    assert type(y.grad_fn).__name__ == KERNEL
    inputs = (x,) if wanted == "x" else _weights(conv)
    grads = torch.autograd.grad(y, inputs, probe)
    assert all(torch.equal(g, w) for g, w in zip(grads, both[1:2] if wanted == "x" else both[2:5]))


def test_autocast_casts_like_the_eager_path(kernels: None) -> None:
    conv, x, probe = _module(CONFIGS[0])
    with torch.autocast("cpu", torch.bfloat16):
        ours = _grads(conv, conv, x, probe)
        theirs = _grads(_reference(conv), conv, x, probe)
    assert ours[-1] == KERNEL and theirs[-1] != KERNEL
    assert ours[0].dtype == theirs[0].dtype == torch.bfloat16
    assert all(g.dtype == torch.float32 for g in ours[1:5])  # float32 leaves, float32 gradients
    for got, want in zip(ours[:5], theirs[:5], strict=True):
        assert max_relative_error(got, want.double()) <= 2.0**-6


def test_without_autograd_the_forward_kernel_runs(kernels: None) -> None:
    conv, x, _ = _module(CONFIGS[1])
    with torch.no_grad():
        y = conv(x)
        want = _reference(conv)(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert max_relative_error(y, want.double()) <= 1e-6


@pytest.mark.parametrize(
    "case", ["contiguous", "other_size", "float64", "reference", "no_kernels", "dispatch_mode"]
)
def test_the_eager_path_runs_where_the_kernels_do_not_apply(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv, x, _ = _module(CONFIGS[0])
    if case == "contiguous":
        x = x.contiguous()
    elif case == "other_size":  # resized to the build size and back
        x = torch.randn(2, 5, 9, 4).to(memory_format=torch.channels_last)
    elif case == "float64":
        conv, x = conv.double(), x.double()
    elif case == "reference":
        conv.impl = "reference"
    elif case == "no_kernels":
        monkeypatch.setattr(src.kernels.dim_conv, "cpu_kernels_loaded", lambda: False)
    x.requires_grad_()
    if case == "dispatch_mode":
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            y = conv(x)
        assert counter.get_total_flops() > 0
    else:
        y = conv(x)
    assert type(y.grad_fn).__name__ != KERNEL
    assert torch.equal(y, _reference(conv)(x))


def test_flop_counter_counts_the_three_convolutions(kernels: None) -> None:
    conv, x, _ = _module(CONFIGS[0])
    batch, channels, height, width = x.shape
    for layout in (torch.contiguous_format, torch.channels_last):
        counted = measure(conv, x.contiguous(memory_format=layout))
        assert counted.macs == 3 * batch * channels * height * width * 9


def test_dim_conv_cpu_leaves_other_dtypes_to_the_caller(kernels: None) -> None:
    conv, x, _ = _module(CONFIGS[0])
    assert dim_conv_cpu(x.double(), _weights(conv), dilation=(1, 1, 1), interleave=True) is None
    mixed = dim_conv_cpu(x.bfloat16(), _weights(conv), dilation=(1, 1, 1), interleave=True)
    assert mixed is None


FORWARD = {"x": 0, "weight_channel": 1, "weight_height": 2, "weight_width": 3}
BACKWARD = {"grad_y": 0, "x": 1, "weight_channel": 2, "weight_height": 3, "weight_width": 4}
# the sizes the other operands fix: x's batch only where grad_y is there; a kernel's k
# (weight_channel's) is its own, odd, and fixes the other two kernels
FORWARD_FIXED = {"x": (1, 2, 3), "weight_channel": (0, 1, 2)}
BACKWARD_FIXED = {"x": (0, 1, 2, 3), "grad_y": (0, 1, 2, 3), "weight_channel": (0, 1, 2)}


def _operands(backward: bool) -> list:
    torch.manual_seed(0)
    tensors = [torch.randn(2, 4, 5, 6), torch.randn(6, 3, 3), torch.randn(4, 3, 3)]
    tensors.append(torch.randn(5, 3, 3))
    if backward:
        return [torch.randn(2, 4, 5, 18), *tensors, [1, 1, 1], True, True, True]
    return [*tensors, [1, 1, 1], True]


def _faults(operands: dict) -> list[tuple[str, str]]:
    # x may be 16-bit (the others must then follow it)
    return [
        (n, f)
        for n in operands
        for f in (*SHAPE_FAULTS, *KIND_FAULTS)
        if (n, f) != ("x", "bfloat16")
    ]


@pytest.mark.parametrize(("name", "fault"), _faults(FORWARD))
def test_forward_kernel_rejects_a_faulty_operand(kernels: None, name: str, fault: str) -> None:
    fixed = FORWARD_FIXED.get(name, (0, 1, 2))
    assert_rejected("dim_conv_forward", _operands(False), name, FORWARD[name], fault, fixed)


@pytest.mark.parametrize(("name", "fault"), _faults(BACKWARD))
def test_backward_kernel_rejects_a_faulty_operand(kernels: None, name: str, fault: str) -> None:
    fixed = BACKWARD_FIXED.get(name, (0, 1, 2))
    assert_rejected("dim_conv_backward", _operands(True), name, BACKWARD[name], fault, fixed)


def test_kernel_rejects_bad_dilations_and_even_kernels(kernels: None) -> None:
    args = _operands(False)
    for dilation in ([1, 1], [1, 0, 1]):
        with pytest.raises(RuntimeError, match="dilation must be three positive ints"):
            torch.ops.lightnets_cpu.dim_conv_forward(*args[:4], dilation, True)
    even = [args[0], torch.randn(6, 2, 2), torch.randn(4, 2, 2), torch.randn(5, 2, 2)]
    with pytest.raises(RuntimeError, match="k odd"):
        torch.ops.lightnets_cpu.dim_conv_forward(*even, [1, 1, 1], True)


def test_compiled_step_traces_both_kernels_and_matches_eager_bitwise(kernels: None) -> None:
    backend, graphs = recording_backend()
    torch._dynamo.reset()
    conv, x, probe = _module(CONFIGS[0])
    eager = _grads(conv, conv, x, probe)
    compiled = _grads(torch.compile(conv, backend=backend, fullgraph=True), conv, x, probe)
    torch._dynamo.reset()
    assert len(graphs["forward"]) == len(graphs["backward"]) == 1
    assert "lightnets.dim_conv_forward.default" in graphs["forward"][0]
    assert "lightnets.dim_conv_backward.default" in graphs["backward"][0]
    assert all(torch.equal(a, b) for a, b in zip(eager[:5], compiled[:5], strict=True))
