"""The GLT and DimConv under ``torch.autocast``: both impls against their own float32 run.

These two ops have their own autograd Functions (and Triton kernels), which autocast cannot see
into, so they apply its rule themselves: operands cast to the autocast dtype before the Function,
products accumulated in float32, outputs in the autocast dtype, float32 parameters with float32
gradients (the GLT kernel takes float32 parameters and inputs themselves and rounds them as it loads
them). Without CUDA the Triton kernels run in the interpreter on CPU tensors
(tests/conftest.py), the shapes stay tiny and rows are never a multiple of a block; with CUDA the
same cases run on the GPU with the compiled kernels.

Tolerance. A 16-bit float with p significant bits rounds with relative error at most
u = 2^-p (bfloat16: p = 8, u = 3.9e-3; float16: p = 11, u = 4.9e-4). Each product here (forward,
input gradient, weight gradient) rounds its two operands to 16 bits (the output gradient arrives
in the output's dtype), multiplies them exactly in float32, accumulates in float32 (error
~k 2^-24, negligible) and rounds the result once more: at most 3u relative to sum_i |a_i b_i|.
Over random data and the short reductions here that sum is at most about 1.6 times the largest
output element, so the max-norm relative error ||y - y32||_inf / ||y32||_inf stays below 5u:
2e-2 for bfloat16, 2.5e-3 for float16 (observed: up to 2.4u; the roundings are not all one way).
DExTra's output has gone through N + 2 = 6 such products in series, each followed by a LayerNorm
that rescales its error back to the same relative size, so the errors add up to 6 * 3u = 18u
(7e-2); its gradients go back through all six again, 36u (0.14; observed: up to 10u).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from src.kernels.group_linear import interleaved_group_linear
from src.ops.dextra import DExTra
from src.ops.dim_conv import DimConv
from src.ops.group_linear import GroupLinear
from tests.helpers import CastCounter, tf32

pytest.importorskip("triton")

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# significant bits of each 16-bit dtype; both autocast on the CPU and run in the interpreter
PRECISION = {torch.bfloat16: 8, torch.float16: 11}


def op_tolerance(dtype: torch.dtype) -> float:
    """5u for one product (module docstring)."""
    return 5 * 2.0 ** -PRECISION[dtype]


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    # the float32 runs are the yardstick: on a GPU they must not round to TF32 (u = 2^-11)
    with tf32(False):
        yield


def max_norm_error(value: Tensor, reference: Tensor) -> float:
    """``||value - reference||_inf / ||reference||_inf``, in float64."""
    value, reference = value.detach().double(), reference.detach().double()
    return float((value - reference).abs().max() / reference.abs().max())


def run(
    fn: Callable[..., Tensor], leaves: Sequence[Tensor], dtype: torch.dtype | None
) -> tuple[Tensor, list[Tensor]]:
    """``fn()`` under autocast in ``dtype`` (None: float32) and the gradients of ``leaves``.

    The backward weighs every output element by a fixed pseudo-random probe, rounded to the
    output's dtype as autograd would hand it over.
    """
    with torch.autocast(DEVICE, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        out = fn()
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return out, list(torch.autograd.grad(out, leaves, probe.to(out)))


def check_autocast(
    fn: Callable[..., Tensor],
    leaves: Sequence[Tensor],
    dtype: torch.dtype,
    tolerance: float,
    *,
    output_tolerance: float | None = None,
    output_dtype: torch.dtype | None = None,
) -> None:
    """Output in ``output_dtype`` (default ``dtype``), float32 gradients, all within ``tolerance``
    of the float32 run (the output within ``output_tolerance`` when given)."""
    want, want_grads = run(fn, leaves, None)
    got, got_grads = run(fn, leaves, dtype)
    assert got.dtype == (output_dtype or dtype)
    assert max_norm_error(got, want) <= (output_tolerance or tolerance), "output"
    for leaf, grad, want_grad in zip(leaves, got_grads, want_grads, strict=True):
        assert grad.dtype == leaf.dtype == torch.float32
        assert max_norm_error(grad, want_grad) <= tolerance, f"gradient of {tuple(leaf.shape)}"


# every combination in bfloat16; float16 (the same arithmetic, more bits) at the two extremes
GLT_CASES = [
    (n_parts, shuffle, bias, torch.bfloat16)
    for n_parts in (1, 2)
    for shuffle in (False, True)
    for bias in (True, False)
] + [(1, False, False, torch.float16), (2, True, True, torch.float16)]


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("n_parts, shuffle, bias, dtype", GLT_CASES, ids=str)
def test_glt_autocast(
    n_parts: int, shuffle: bool, bias: bool, dtype: torch.dtype, impl: str
) -> None:
    torch.manual_seed(0)
    groups, rows = 4, 37
    parts = [
        torch.randn(rows, 8 * (j + 1), device=DEVICE, requires_grad=True) for j in range(n_parts)
    ]
    glt = GroupLinear(sum(p.shape[1] for p in parts), 24, groups, bias=bias).to(DEVICE)
    params = list(glt.parameters())

    def fn() -> Tensor:
        return interleaved_group_linear(parts, glt.weight, glt.bias, shuffle=shuffle, impl=impl)

    check_autocast(fn, [*parts, *params], dtype, op_tolerance(dtype))


DIM_CONV_CASES = [
    (interleave, dilation, torch.bfloat16)
    for interleave in (True, False)
    for dilation in ((1, 1, 1), (2, 1, 3))
] + [(True, (2, 1, 3), torch.float16)]


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("interleave, dilation, dtype", DIM_CONV_CASES, ids=str)
def test_dim_conv_autocast(
    interleave: bool, dilation: tuple[int, int, int], dtype: torch.dtype, impl: str
) -> None:
    torch.manual_seed(0)
    layer = DimConv(6, 5, 7, dilation=dilation, interleave=interleave, impl=impl).to(DEVICE)
    x = torch.randn(2, 6, 5, 7, device=DEVICE, requires_grad=True)
    check_autocast(lambda: layer(x), [x, *layer.parameters()], dtype, op_tolerance(dtype))


@pytest.mark.parametrize("dtype", list(PRECISION), ids=str)
def test_dim_conv_reference_autocast_off_the_build_size(dtype: torch.dtype) -> None:
    # both resizes (growing the height, shrinking the width) as 16-bit products
    torch.manual_seed(0)
    layer = DimConv(4, 6, 6, impl="reference").to(DEVICE)
    x = torch.randn(2, 4, 5, 9, device=DEVICE, requires_grad=True)
    check_autocast(lambda: layer(x), [x, *layer.parameters()], dtype, op_tolerance(dtype))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_dextra_autocast(impl: str) -> None:
    torch.manual_seed(0)
    unit = DExTra(32, 16, 16, width_multiplier=2.0, depth=4, max_groups=4, impl=impl).to(DEVICE)
    with torch.no_grad():  # no trivial LayerNorm affines or zero biases
        for name, param in unit.named_parameters():
            if "norm" in name or "bias" in name:
                param.add_(0.1 * torch.randn_like(param))
    x = torch.randn(5, 7, 32, device=DEVICE, requires_grad=True)
    # N + 2 = 6 products of 3u each, forward (18u) and forward then backward (36u): docstring
    u = 2.0 ** -PRECISION[torch.bfloat16]
    # the unit ends in a LayerNorm of a bf16 product and a Swish: on the kernel (one launch) its
    # output is bf16; the PyTorch path's is whatever dtype autocast gives layer_norm of a bf16
    # input on this device (CUDA: float32, CPU: bf16)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        norm_dtype = F.layer_norm(torch.ones(2, 4, device=DEVICE, dtype=torch.bfloat16), (4,)).dtype
    if impl == "triton":
        norm_dtype = torch.bfloat16
    check_autocast(
        lambda: unit(x), [x, *unit.parameters()], torch.bfloat16, 36 * u, output_tolerance=18 * u,
        output_dtype=norm_dtype,
    )  # fmt: skip


@pytest.mark.parametrize("part_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("n_parts", [1, 2])
def test_glt_kernel_takes_float32_operands_without_casts(
    n_parts: int, part_dtype: torch.dtype
) -> None:
    """Under autocast the kernel rounds the float32 weight and bias (and float32 parts, such as
    the residual stream) to 16 bits as it loads them and writes their float32 gradients: no cast
    launches, and the same numbers as casting first (the forward bit for bit, the gradients of
    float32 tensors rounded once less)."""
    torch.manual_seed(0)
    rows, groups = 37, 4
    parts = [
        torch.randn(rows, 8 * (j + 1), device=DEVICE, dtype=part_dtype, requires_grad=True)
        for j in range(n_parts)
    ]
    glt = GroupLinear(sum(p.shape[1] for p in parts), 24, groups, bias=True).to(DEVICE)
    with torch.no_grad():
        glt.bias.normal_()
    dy = torch.randn(rows, 24, device=DEVICE, dtype=torch.bfloat16)
    casts = CastCounter()
    with casts, torch.autocast(DEVICE, dtype=torch.bfloat16):
        y = interleaved_group_linear(parts, glt.weight, glt.bias, shuffle=True, impl="triton")
    with casts:
        y.backward(dy)
    assert casts.count == 0
    assert y.dtype == torch.bfloat16
    assert glt.weight.grad.dtype == glt.bias.grad.dtype == torch.float32
    assert all(p.grad.dtype == part_dtype for p in parts)
    # the same kernel on operands rounded first as it rounds them, outside autocast
    weight = _kernel_rounded(glt.weight.detach()).requires_grad_()
    bias = _kernel_rounded(glt.bias.detach()).requires_grad_()
    parts_cast = [_kernel_rounded(p.detach()).requires_grad_() for p in parts]
    y_cast = interleaved_group_linear(parts_cast, weight, bias, shuffle=True, impl="triton")
    y_cast.backward(dy)
    assert torch.equal(y, y_cast)
    for part, part_cast in zip(parts, parts_cast, strict=True):
        assert torch.equal(_kernel_rounded(part.grad), part_cast.grad)
    assert torch.equal(_kernel_rounded(glt.weight.grad), weight.grad)
    assert torch.equal(_kernel_rounded(glt.bias.grad), bias.grad)


def _kernel_rounded(t: Tensor) -> Tensor:
    """float32 -> bfloat16 as a kernel's ``.to`` rounds: to nearest even on a GPU; the interpreter
    truncates (it keeps the top 16 bits)."""
    if CUDA:
        return t.bfloat16()
    return (t.float().view(torch.int32) & -65536).view(torch.float32).bfloat16()


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_glt_backward_is_not_autocast_again(impl: str) -> None:
    # a backward called inside another autocast region must not recast the saved bf16 operands
    torch.manual_seed(0)
    glt = GroupLinear(16, 8, 2, shuffle=True, impl=impl).to(DEVICE)
    x = torch.randn(9, 16, device=DEVICE, requires_grad=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        y = glt(x)
    with torch.autocast(DEVICE, dtype=torch.float16):
        y.float().sum().backward()
    assert x.grad.dtype == glt.weight.grad.dtype == torch.float32
    assert torch.isfinite(x.grad).all() and torch.isfinite(glt.weight.grad).all()


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_mixed_dtypes_outside_autocast_raise(impl: str) -> None:
    weight = torch.randn(2, 4, 3, device=DEVICE)
    x = torch.randn(5, 8, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"parts \[torch.bfloat16\], weight torch.float32"):
        interleaved_group_linear((x,), weight, None, shuffle=False, impl=impl)
    layer = DimConv(3, 4, 5, impl=impl).to(DEVICE)
    images = torch.randn(1, 3, 4, 5, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises((TypeError, RuntimeError), match=r"(?i)type|dtype"):
        layer(images)
