"""DeLighT's per-group LayerNorm and swish as one Triton kernel
(``src/kernels/shared_group_layer_norm/triton_kernel.py``) against the PyTorch ops, forward and
backward. Without CUDA the kernel runs in Triton's interpreter on CPU tensors.

float32 tolerance 1e-5 (of the largest value, for the parameter gradients, which sum over every row
and group): the two differ in summation order only. A 16-bit input gives a 16-bit output (the
PyTorch ops give float32 under autocast): the kernel normalises the same rounded input in float32
and rounds once at the end, so its output is within one rounding (2^-8 relative for bfloat16 on a
GPU; twice that in Triton's interpreter, which truncates) of the PyTorch ops' float32 output (and
float32 rounding), and the parameter gradients, summed in float32 from the same 16-bit output
gradient, agree to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from src.kernels.shared_group_layer_norm import (
    auto_path,
    shared_group_layer_norm,
    shared_group_layer_norm_swish,
)
from src.ops.dextra import DExTra

pytest.importorskip("triton")

from src.kernels.shared_group_layer_norm.triton_kernel import shared_group_layer_norm_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _reference(x: Tensor, groups: int, w: Tensor, b: Tensor, eps: float, swish: bool) -> Tensor:
    y = shared_group_layer_norm(x, groups, w, b, eps)
    return F.silu(y) if swish else y


def _run(
    fn: Callable[..., Tensor], x: Tensor, groups: int, swish: bool, probe_dtype: torch.dtype
) -> list[Tensor]:
    """Output and the gradients of x, weight and bias under the loss sum(output * probe)."""
    gen = torch.Generator().manual_seed(2)
    width = x.shape[-1] // groups
    weight = (1 + 0.5 * torch.randn(width, generator=gen)).to(x.device).requires_grad_()
    bias = (0.5 * torch.randn(width, generator=gen)).to(x.device).requires_grad_()
    x = x.detach().requires_grad_()
    y = fn(x, groups, weight, bias, 1e-5, swish)
    probe = torch.randn(y.shape, generator=gen).to(device=y.device, dtype=probe_dtype).to(y.dtype)
    return [y, *torch.autograd.grad(y, [x, weight, bias], probe)]


@pytest.mark.parametrize("swish", [True, False], ids=["swish", "norm"])
@pytest.mark.parametrize(
    ("shape", "groups"),
    # DExTra's: x0 (g = 1, 160 wide), GLT outputs of 2-16 groups of 24-90 features; a
    # 7-feature group; rows not a multiple of any row block
    [((35, 160), 1), ((3, 7, 96), 2), ((37, 360), 4), ((130, 704), 16), ((5, 21), 3)],
    ids=str,
)
def test_kernel_matches_the_pytorch_ops(
    kernel_device: torch.device, shape: tuple[int, ...], groups: int, swish: bool
) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape, device=kernel_device) * 2 + 0.5
    got = _run(shared_group_layer_norm_triton, x, groups, swish, torch.float32)
    want = _run(_reference, x, groups, swish, torch.float32)
    for name, a, e in zip(["y", "x", "weight", "bias"], got, want, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype, name
        # the parameter gradients sum over every row and group: float32 rounding of their scale
        atol = 1e-5 * max(1.0, float(e.detach().abs().max()))
        torch.testing.assert_close(a, e, rtol=1e-5, atol=atol, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_input_gives_a_16_bit_output_rounded_once(
    kernel_device: torch.device, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    x = (torch.randn(9, 4, 192, device=kernel_device) * 3).to(dtype)
    got = _run(shared_group_layer_norm_triton, x, 4, True, dtype)
    # the PyTorch ops on the same rounded input and output gradient, in float32
    want = _run(_reference, x.float(), 4, True, dtype)
    assert got[0].dtype == got[1].dtype == dtype and got[2].dtype == torch.float32
    ulp = 2.0 ** -(8 if dtype == torch.bfloat16 else 11)
    # one rounding of a float32 value that differs from the PyTorch ops' in summation order; two
    # units: Triton's interpreter truncates float32 to bfloat16 where a GPU rounds to nearest
    bound = 2 * ulp * want[0].abs() + 1e-5 * float(want[0].abs().max())
    assert bool(((got[0].float() - want[0]).abs() <= bound).all())
    for name, a, e in zip(["weight", "bias"], got[2:], want[2:], strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-4, msg=name)
    x_error = (got[1].float() - want[1]).abs().max() / want[1].abs().max()
    assert float(x_error) <= 2 * ulp


def test_constant_group_is_finite_and_gives_the_bias(kernel_device: torch.device) -> None:
    x = torch.randn(3, 16, device=kernel_device)
    x[1, :8] = 1.5
    y, grad_x, grad_w, grad_b = _run(shared_group_layer_norm_triton, x, 2, False, torch.float32)
    want = _run(_reference, x, 2, False, torch.float32)
    assert all(torch.isfinite(t).all() for t in (y, grad_x, grad_w, grad_b))
    torch.testing.assert_close(y, want[0], rtol=1e-5, atol=1e-5)


def test_bad_affine_is_refused(kernel_device: torch.device) -> None:
    x = torch.randn(4, 32, device=kernel_device)
    with pytest.raises(
        ValueError, match=r"32 features in 4 groups with a shared affine of \(16,\)"
    ):
        shared_group_layer_norm_triton(x, 4, torch.ones(16), torch.zeros(16), 1e-5, True)
    with pytest.raises(TypeError, match="weight torch.float64"):
        shared_group_layer_norm_triton(x, 4, torch.ones(8).double(), torch.zeros(8), 1e-5, True)


def test_function_takes_the_kernel_only_where_told(kernel_device: torch.device) -> None:
    x = torch.randn(6, 2, 64, device=kernel_device)
    w, b = torch.rand(16, device=kernel_device) + 0.5, torch.randn(16, device=kernel_device)
    want = F.silu(shared_group_layer_norm(x, 4, w, b))
    for impl in ("triton", "reference", "auto"):
        got = shared_group_layer_norm_swish(x, 4, w, b, impl=impl)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="impl must be one of"):
        shared_group_layer_norm_swish(x, 4, w, b, impl="cuda")


def test_auto_path_times_each_shape_once(kernel_device: torch.device, fresh_choices) -> None:
    x = torch.randn(6, 32, device=kernel_device)
    w, b = torch.ones(8, device=kernel_device), torch.zeros(8, device=kernel_device)
    times = iter([1.0, 3.0])  # the kernel (faster here), then the PyTorch ops
    calls: list[int] = []

    def timer(fn: Callable[[], object]) -> float:
        fn()
        calls.append(1)
        return next(times)

    assert auto_path(x, 4, w, b, 1e-5, timer) == "triton"
    assert auto_path(x, 4, w, b, 1e-5, timer) == "triton"
    assert len(calls) == 2


def test_kernel_compiles_in_one_graph() -> None:
    torch._dynamo.reset()
    w = torch.rand(12, device=DEVICE, requires_grad=True)
    b = torch.randn(12, device=DEVICE, requires_grad=True)

    def fn(x: Tensor) -> Tensor:
        return shared_group_layer_norm_swish(x, 4, w, b, impl="triton")

    x = torch.randn(5, 48, device=DEVICE, requires_grad=True)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    got, want = compiled(x), fn(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(
        torch.autograd.grad(got.square().sum(), (x, w, b)),
        torch.autograd.grad(want.square().sum(), (x, w, b)),
    )
    torch._dynamo.reset()


def test_dextra_under_bf16_autocast_on_the_kernels(kernel_device: torch.device) -> None:
    """A DExTra unit with its norms fused keeps its output dtype (the output LayerNorm is
    PyTorch's) and stays within bfloat16 rounding of its PyTorch path."""
    torch.manual_seed(0)
    sizes = dict(width_multiplier=2.0, depth=4, max_groups=4)
    fused = DExTra(32, 16, 16, **sizes, impl="triton").to(kernel_device)
    reference = DExTra(32, 16, 16, **sizes, impl="reference").to(kernel_device)
    reference.load_state_dict(fused.state_dict())
    x = torch.randn(5, 7, 32, device=kernel_device)
    with torch.autocast(kernel_device.type, dtype=torch.bfloat16):
        got, want = fused(x), reference(x)
    assert got.dtype == want.dtype
    scale = float(want.float().abs().max())
    assert float((got.float() - want.float()).abs().max()) <= 0.05 * scale


def test_dropout_in_the_kernel(kernel_device: torch.device) -> None:
    """The kernel's dropout equals the PyTorch ops times its own mask, forward and backward (the
    backward draws the mask again from the seed), keeps about 1 - p, and follows
    ``torch.manual_seed``."""
    p = 0.3
    x = torch.randn(64, 4, 96, device=kernel_device) * 2 + 0.5

    def fused(x: Tensor, groups: int, w: Tensor, b: Tensor, eps: float, swish: bool) -> Tensor:
        torch.manual_seed(7)
        return shared_group_layer_norm_triton(x, groups, w, b, eps, swish, p)

    got = _run(fused, x, 4, True, torch.float32)
    kept = got[0] != 0
    assert abs(float(kept.float().mean()) - (1 - p)) < 0.02  # 24,576 draws: 6.8 sigma

    def masked(x: Tensor, groups: int, w: Tensor, b: Tensor, eps: float, swish: bool) -> Tensor:
        return _reference(x, groups, w, b, eps, swish) * kept / (1 - p)

    want = _run(masked, x, 4, True, torch.float32)
    for name, a, e in zip(["y", "x", "weight", "bias"], got, want, strict=True):
        atol = 1e-5 * max(1.0, float(e.detach().abs().max()))
        torch.testing.assert_close(a, e, rtol=1e-5, atol=atol, msg=name)
    again = _run(fused, x, 4, True, torch.float32)[0]
    assert torch.equal(again != 0, kept)
    other = shared_group_layer_norm_triton(x, 4, torch.ones(24), torch.zeros(24), 1e-5, True, p)
    assert not torch.equal(other != 0, kept)
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\), got 1.0"):
        shared_group_layer_norm_triton(x, 4, torch.ones(24), torch.zeros(24), 1e-5, True, 1.0)


def test_dextra_drops_out_in_the_kernel_in_training_only(kernel_device: torch.device) -> None:
    unit = DExTra(32, 16, 16, width_multiplier=2.0, depth=4, max_groups=4, dropout=0.5,
                  impl="triton").to(kernel_device)  # fmt: skip
    reference = DExTra(32, 16, 16, width_multiplier=2.0, depth=4, max_groups=4,
                       impl="reference").to(kernel_device)  # fmt: skip
    reference.load_state_dict(unit.state_dict())
    x = torch.randn(6, 32, device=kernel_device)
    assert not torch.allclose(unit(x), reference(x), atol=1e-3)
    unit.eval()
    torch.testing.assert_close(unit(x), reference(x), rtol=1e-5, atol=1e-5)
