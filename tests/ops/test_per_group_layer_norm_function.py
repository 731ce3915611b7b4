"""The per-group norm's written-out backward (``PerGroupLayerNormFunction``, the eager PyTorch path
of ``PerGroupLayerNorm``) against autograd through the plain passes
(``per_group_layer_norm_reference``):
float64 gradcheck, float32 values and gradients within 1e-5 relative, 16-bit inputs normalised in
float32 with gradients in their own dtype, and finite gradients on constant groups."""

from __future__ import annotations

import pytest
import torch

from src.kernels.per_group_layer_norm import (
    PerGroupLayerNormFunction,
    per_group_layer_norm_cpu,
    per_group_layer_norm_reference,
)
from tests.helpers import require_cpu_kernels


def _leaves(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    width = shape[-1]
    x = torch.randn(*shape, dtype=dtype).mul_(3).add_(1).requires_grad_()
    weight = torch.randn(width, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    bias = torch.randn_like(weight)
    return x, weight.requires_grad_(), bias.requires_grad_()


@pytest.mark.parametrize("groups", [1, 4])
def test_gradcheck(groups: int) -> None:
    torch.manual_seed(0)
    leaves = _leaves((2, 3, 16), torch.float64)
    assert torch.autograd.gradcheck(
        lambda x, w, b: PerGroupLayerNormFunction.apply(x, w, b, groups, 1e-6), leaves
    )


@pytest.mark.parametrize("shape,groups", [((4, 7, 64), 4), ((9, 32), 1), ((2, 5, 96), 8)])
def test_values_and_gradients_match_autograd(shape: tuple[int, ...], groups: int) -> None:
    results = []
    for fn in (PerGroupLayerNormFunction.apply, per_group_layer_norm_reference):
        torch.manual_seed(0)  # the same leaves and probe for both
        leaves = _leaves(shape, torch.float32)
        probe = torch.randn(shape)
        y = fn(*leaves, groups, 1e-6)
        (y * probe).sum().backward()
        results.append([y, *(leaf.grad for leaf in leaves)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_inputs(dtype: torch.dtype) -> None:
    results = []
    for fn in (PerGroupLayerNormFunction.apply, per_group_layer_norm_reference):
        torch.manual_seed(0)
        x, weight, bias = _leaves((3, 5, 32), dtype)
        y = fn(x, weight, bias, 2, 1e-6)
        y.sum().backward()
        assert y.dtype == torch.float32 and x.grad.dtype == dtype
        results.append([y, x.grad, weight.grad])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["pytorch", "cpu_kernels"])
def test_constant_groups_get_finite_gradients(path: str) -> None:
    if path == "cpu_kernels":
        require_cpu_kernels()
    function = {"pytorch": PerGroupLayerNormFunction.apply, "cpu_kernels": per_group_layer_norm_cpu}
    x = torch.randn(2, 8)
    x[0, :4] = 2.5  # the first group of the first row is constant
    x.requires_grad_()
    weight, bias = torch.randn(8), torch.randn(8)
    probe = torch.randn(2, 8)
    y = function[path](x, weight, bias, 2, 1e-6)
    (y * probe).sum().backward()
    assert torch.equal(y[0, :4], bias[:4])
    g = (probe * weight)[0, :4]
    torch.testing.assert_close(x.grad[0, :4], (g - g.mean()) / 1e-6)
    assert torch.isfinite(x.grad).all()
