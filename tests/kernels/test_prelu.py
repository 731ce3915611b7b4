"""PReLU's one-pass CPU backward (``src/kernels/prelu/__init__.py``,
``src/kernels/prelu/prelu.cpp``) against
``F.prelu`` under autograd and a float64 oracle.

Tolerances: the input gradient is ATen's bit for bit (both compute ``a * g`` where x <= 0 in
float32 and round once). The slope gradient is a float32 sum over the batch and spatial axes in
another order than ATen's: within 1e-5 relative of the float64 oracle for float32, and within
bfloat16's rounding of the result (2^-8 relative) for 16-bit operands.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import src.kernels.prelu
from src.kernels.prelu import PReLU, prelu
from tests.helpers import (
    KIND_FAULTS,
    SHAPE_FAULTS,
    assert_rejected,
    recording_backend,
    require_cpu_kernels,
)

KERNEL = "PReLUCpuFunctionBackward"
ATEN = "PreluKernelBackward0"


@pytest.fixture
def kernels() -> None:
    require_cpu_kernels()


# (x shape, x channels-last, output gradient channels-last): every layout the kernel reads, with
# the output gradient in x's layout or autograd's other one
LAYOUTS = [
    ((4, 6, 9, 7), True, True),  # (B, C, H, W) channels-last: rows of channels
    ((4, 6, 9, 7), True, False),  # ... the gradient contiguous, copied to x's layout first
    ((4, 6, 9, 7), False, False),  # contiguous: a plane per channel
    ((4, 6, 9, 7), False, True),
    ((3, 5, 11), False, False),  # (B, C, L)
    ((2, 3, 4, 5, 6), False, False),  # (B, C, D, H, W)
    ((17, 8), False, False),  # (B, C): rows
    ((20, 5, 4, 4), True, True),  # 320 rows: more than the kernel's 64 row blocks
]


def _operands(shape: tuple[int, ...], channels_last: bool, grad_channels_last: bool, dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=gen)
    x[..., 0] = 0.0  # the kink itself takes the negative side's gradient, as in ATen
    probe = torch.randn(shape, generator=gen)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    if grad_channels_last:
        probe = probe.to(memory_format=torch.channels_last)
    # slopes of both signs, above and below 1
    weight = torch.linspace(-0.3, 1.2, shape[1])
    return x.to(dtype), weight.to(dtype), probe.to(dtype)


def _grads(fn, x: Tensor, weight: Tensor, probe: Tensor) -> tuple[Tensor, ...]:
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    y = fn(x, weight)
    return (y, *torch.autograd.grad(y, (x, weight), probe), type(y.grad_fn).__name__)


@pytest.mark.parametrize(("shape", "channels_last", "grad_channels_last"), LAYOUTS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_aten_and_float64_oracle(
    kernels: None, shape: tuple[int, ...], channels_last: bool, grad_channels_last: bool, dtype
) -> None:
    x, weight, probe = _operands(shape, channels_last, grad_channels_last, dtype)
    y, grad_x, grad_w, node = _grads(prelu, x, weight, probe)
    y_aten, grad_x_aten, _, _ = _grads(F.prelu, x, weight, probe)
    _, _, grad_w64, _ = _grads(F.prelu, x.double(), weight.double(), probe.double())
    assert node == KERNEL
    assert y.dtype == grad_x.dtype == grad_w.dtype == dtype
    assert grad_x.shape == x.shape and grad_w.shape == weight.shape
    assert grad_x.stride() == x.stride()  # in x's layout, as ATen gives it
    assert torch.equal(y, y_aten)
    assert torch.equal(grad_x, grad_x_aten)
    rtol = 1e-5 if dtype == torch.float32 else 2**-8
    scale = grad_w64.abs().max().item()
    torch.testing.assert_close(grad_w.double(), grad_w64, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_special_values_give_aten_bits(kernels: None, dtype: torch.dtype) -> None:
    """NaN, infinities, signed zeros and subnormals in x and the gradient: the same input gradient
    as ATen, bit for bit but for NaN payloads (the kernel writes bfloat16's rounding out itself; the
    products a g with a = -0.7 or 3 are rounded)."""
    special = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 4, 9, generator=gen)
    probe = torch.randn(2, 3, 4, 9, generator=gen)
    x[0, :, 0] = torch.tensor(special)
    probe[1, :, 1] = torch.tensor(special)
    weight = torch.tensor([0.25, -0.7, 3.0])
    x, probe, weight = x.to(dtype), probe.to(dtype), weight.to(dtype)
    _, grad_x, _, node = _grads(prelu, x, weight, probe)
    _, want, _, _ = _grads(F.prelu, x, weight, probe)
    assert node == KERNEL
    # NaN where ATen has NaN (its NaN payloads are its vector code's), every other value's bits
    assert torch.equal(grad_x.isnan(), want.isnan())
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    number = ~want.isnan()
    assert torch.equal(grad_x.view(bits)[number], want.view(bits)[number])


@pytest.mark.parametrize("channels_last", [True, False])
def test_slope_gradient_does_not_depend_on_the_thread_count(
    kernels: None, channels_last: bool
) -> None:
    x, weight, probe = _operands((8, 16, 40, 40), channels_last, channels_last, torch.float32)
    threads = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            runs.append(_grads(prelu, x, weight, probe)[1:3])
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))


def test_gradient_of_the_slope_alone(kernels: None) -> None:
    x, weight, probe = _operands((2, 3, 4, 4), False, False, torch.float32)
    y = prelu(x, weight.requires_grad_())
    assert type(y.grad_fn).__name__ == KERNEL
    (grad_w,) = torch.autograd.grad(y, weight, probe)
    (want,) = torch.autograd.grad(F.prelu(x, weight), weight, probe)
    torch.testing.assert_close(grad_w, want, rtol=1e-5, atol=1e-6)


def test_autocast_casts_like_f_prelu_and_keeps_float32_slope_gradients(kernels: None) -> None:
    x, weight, probe = _operands((2, 4, 5, 5), True, True, torch.float32)
    x.requires_grad_()
    weight.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = prelu(x, weight)
        y_aten = F.prelu(x, weight)
    assert type(y.grad_fn).__name__ == KERNEL
    assert y.dtype == y_aten.dtype == torch.bfloat16
    assert torch.equal(y, y_aten)
    grad_x, grad_w = torch.autograd.grad(y, (x, weight), probe.bfloat16())
    want_x, want_w = torch.autograd.grad(y_aten, (x, weight), probe.bfloat16())
    assert grad_x.dtype == grad_w.dtype == torch.float32
    assert torch.equal(grad_x, want_x)
    torch.testing.assert_close(grad_w, want_w, rtol=2**-8, atol=2**-8 * want_w.abs().max().item())


@pytest.mark.parametrize(
    "case",
    ["no_grad", "single_slope", "strided", "vector", "float64", "no_kernels", "mixed_dtypes"],
)
def test_f_prelu_runs_where_the_kernel_does_not_apply(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    weight = torch.rand(3)
    if case == "single_slope":
        weight = torch.rand(1)
    elif case == "strided":
        x = torch.randn(2, 3, 4, 10)[..., ::2].requires_grad_()  # neither layout
    elif case == "vector":
        x, weight = torch.randn(7, requires_grad=True), torch.rand(1)
    elif case == "float64":
        x, weight = x.detach().double().requires_grad_(), weight.double()
    elif case == "no_kernels":
        monkeypatch.setattr(src.kernels.prelu, "cpu_kernels_loaded", lambda: False)
    if case == "mixed_dtypes":  # outside autocast: refused as F.prelu refuses it
        with pytest.raises(RuntimeError, match="prelu"):
            prelu(x.bfloat16(), weight)
        return
    with torch.set_grad_enabled(case != "no_grad"):
        y = prelu(x, weight)
    want = F.prelu(x, weight)
    assert torch.equal(y, want)
    assert (y.grad_fn is None) if case == "no_grad" else type(y.grad_fn).__name__ == ATEN


OPERANDS = {"grad_y": 0, "x": 1, "weight": 2}


@pytest.mark.parametrize("rows", [False, True], ids=["planes", "rows"])
@pytest.mark.parametrize(
    ("name", "fault"),
    [(n, f) for n in OPERANDS for f in (*SHAPE_FAULTS, *KIND_FAULTS)
     # x may be 16-bit (the others must then follow it); a vector has no other shape of its rank
     if (n, f) not in (("x", "bfloat16"), ("weight", "reshaped"))],
)  # fmt: skip
def test_kernel_rejects_a_faulty_operand(kernels: None, rows: bool, name: str, fault: str) -> None:
    torch.manual_seed(0)
    shape = (12, 5) if rows else (3, 5, 4)
    args = [torch.randn(shape), torch.randn(shape), torch.rand(5)]
    position = OPERANDS[name]
    # grad_y and x fix each other's every size; weight is fixed by x's channels
    fixed = (0,) if name == "weight" else tuple(range(len(shape)))
    assert_rejected("prelu_backward", args, name, position, fault, fixed)


def test_module_is_a_drop_in_nn_prelu() -> None:
    torch.manual_seed(0)
    ours, theirs = PReLU(6), nn.PReLU(6)
    assert isinstance(ours, nn.PReLU)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert torch.equal(ours.weight, theirs.weight)  # the same 0.25 initialisation
    x = torch.randn(2, 6, 5, 5)
    assert torch.equal(ours(x), theirs(x))


def test_compiled_step_traces_the_kernel_and_matches_eager_bitwise(kernels: None) -> None:
    backend, graphs = recording_backend()
    torch._dynamo.reset()
    x, weight, probe = _operands((2, 4, 6, 6), True, False, torch.float32)
    eager = _grads(prelu, x, weight, probe)
    compiled = _grads(torch.compile(prelu, backend=backend, fullgraph=True), x, weight, probe)
    torch._dynamo.reset()
    assert len(graphs["backward"]) == 1 and "lightnets.prelu_backward" in graphs["backward"][0]
    assert all(torch.equal(a, b) for a, b in zip(eager[:3], compiled[:3], strict=True))
