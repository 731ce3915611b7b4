"""A tensor fed to several layers (src/kernels/fan_out/__init__.py): its gradient is the sum of
theirs, one Triton launch per eight terms (Triton's interpreter on the CPU) against autograd's
adds."""

from __future__ import annotations

import pytest
import torch

from src.kernels.fan_out import fan_out, gradient_sum_reference

pytest.importorskip("triton")

from benchmarks.cross_compile import H100, recorded_launches
from src.kernels.fan_out.triton_kernel import gradient_sum_triton


@pytest.mark.parametrize("count", [2, 5, 8, 11])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sum_equals_autograds_adds(count: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(count)
    terms = [torch.randn(37, 29, generator=g).to(dtype) for _ in range(count)]
    total = gradient_sum_triton(terms)
    assert total.dtype == dtype and total.shape == (37, 29)
    exact = torch.stack([t.double() for t in terms]).sum(0)
    # float32 accumulation and one rounding (the interpreter rounds to bfloat16 towards zero)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(total.double(), exact, rtol=tol, atol=tol)
    torch.testing.assert_close(total, gradient_sum_reference(terms), rtol=tol, atol=4 * tol)


def test_a_fanned_out_tensor_gets_the_sum_of_its_consumers_gradients_in_one_launch() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 10, requires_grad=True)
    weights = [torch.randn(10, 4) for _ in range(5)]

    def loss(copies) -> torch.Tensor:
        return sum(((c @ w) ** 2).sum() for c, w in zip(copies, weights))

    (expected,) = torch.autograd.grad(loss((x,) * 5), x)
    copies = fan_out(x, 5, impl="triton")
    assert len(copies) == 5 and all(torch.equal(c, x) for c in copies)
    (grad,) = torch.autograd.grad(loss(copies), x)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-5)
    value = loss(fan_out(x, 5, impl="triton"))
    with recorded_launches(H100) as launches:  # recorded, not run: counted only
        torch.autograd.grad(value, x)
    assert len(launches) == 1
    # a consumer without a gradient adds nothing
    copies = fan_out(x, 3, impl="triton")
    (grad,) = torch.autograd.grad((copies[0] * 2).sum() + (copies[2] * 3).sum(), x)
    torch.testing.assert_close(grad, torch.full_like(x, 5.0))


def test_fan_out_hands_the_tensor_itself_where_nothing_is_saved() -> None:
    x = torch.randn(3, requires_grad=True)
    assert all(c is x for c in fan_out(x, 4, impl="reference"))
    assert all(c is x for c in fan_out(x, 1, impl="triton"))
    y = torch.randn(3)  # no gradient wanted
    assert all(c is y for c in fan_out(y, 4, impl="triton"))
