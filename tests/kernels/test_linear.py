"""``src.kernels.linear``: an ``nn.Linear`` on the GLT kernel as one group, against
``nn.Linear``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from src.kernels.linear import linear
from src.ops.single_head_attention import SingleHeadAttention
from tests.helpers import CastCounter, path_timer

pytest.importorskip("triton")


def _layer(k: int, n: int, bias: bool, device: torch.device) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(k, n, bias=bias).to(device)
    if bias:
        with torch.no_grad():
            layer.bias.normal_()
    return layer


@pytest.mark.parametrize("widths", [(12,), (8, 5)], ids=["one part", "two parts"])
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_matches_nn_linear(
    widths: tuple[int, ...], bias: bool, kernel_device: torch.device
) -> None:
    """Forward and every gradient, with leading dimensions (T, B), the parts read in place."""
    layer = _layer(sum(widths), 7, bias, kernel_device)
    parts = [torch.randn(9, 4, w, device=kernel_device, requires_grad=True) for w in widths]
    y = linear(parts, layer, impl="triton")
    assert y.shape == (9, 4, 7)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [*parts, *layer.parameters()], dy)
    expected = layer(torch.cat(parts, dim=-1))
    expected_grads = torch.autograd.grad(expected, [*parts, *layer.parameters()], dy)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_reference_is_nn_linear_itself(kernel_device: torch.device) -> None:
    layer = _layer(13, 6, True, kernel_device)
    parts = [torch.randn(5, 8, device=kernel_device), torch.randn(5, 5, device=kernel_device)]
    assert torch.equal(linear(parts, layer, impl="reference"), layer(torch.cat(parts, dim=-1)))
    assert torch.equal(linear(parts[:1], _layer(8, 6, True, kernel_device), impl="reference"),
                       _layer(8, 6, True, kernel_device)(parts[0]))  # fmt: skip


def test_auto_is_nn_linear_on_the_cpu() -> None:
    layer = _layer(10, 4, True, torch.device("cpu"))
    x = torch.randn(3, 10)
    assert torch.equal(linear((x,), layer), layer(x))


def test_kernel_under_autocast_casts_no_parameter(kernel_device: torch.device) -> None:
    """nn.Linear under bf16 autocast casts its weight and bias forward and their gradients
    backward; on the kernel nothing is cast, the output is bf16 and the gradients float32, within
    bf16 rounding of nn.Linear's."""
    layer = _layer(16, 24, True, kernel_device)
    x = torch.randn(2, 37, 16, device=kernel_device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(2, 37, 24, device=kernel_device, dtype=torch.bfloat16)
    counts = {}
    results = {}
    for impl in ("reference", "triton"):
        layer.zero_grad()
        x.grad = None
        casts = CastCounter()
        with casts:
            with torch.autocast(kernel_device.type, dtype=torch.bfloat16):
                y = linear((x,), layer, impl=impl)
            y.backward(dy)
        counts[impl] = casts.count
        results[impl] = (y, x.grad, layer.weight.grad, layer.bias.grad)
    assert counts["triton"] == 0 and counts["reference"] >= 4
    y, dx, dw, db = results["triton"]
    assert y.dtype == dx.dtype == torch.bfloat16 and dw.dtype == db.dtype == torch.float32
    for got, want in zip(results["triton"], results["reference"], strict=True):
        error = (got.double() - want.double()).abs().max() / want.double().abs().max()
        assert error < 5 * 2.0**-8, error


def test_auto_path_is_measured_once_per_shape(fresh_choices, kernel_device: torch.device) -> None:
    from src.kernels import chosen
    from src.kernels import linear as module

    times = {"triton": 1.0, "reference": 2.0}
    outputs: dict = {}
    timer = path_timer(times, outputs)
    layer = _layer(12, 5, True, kernel_device)
    x = torch.randn(40, 12, device=kernel_device)
    assert module.linear_path((x,), layer.weight, layer.bias, timer) == "triton"
    torch.testing.assert_close(outputs["triton"], outputs["reference"], rtol=1e-5, atol=1e-5)
    times["triton"] = 3.0
    assert module.linear_path((x,), layer.weight, layer.bias, timer) == "triton"  # kept
    # another row bucket
    assert module.linear_path((x[:20],), layer.weight, layer.bias, timer) == "reference"
    assert len(chosen(module.CHOICE)) == 2


def test_attention_projections_follow_impl(kernel_device: torch.device) -> None:
    torch.manual_seed(0)
    kernel = SingleHeadAttention(32, 16, cross_attention=True, impl="triton").to(kernel_device)
    reference = SingleHeadAttention(32, 16, cross_attention=True, impl="reference")
    reference.load_state_dict(kernel.state_dict())
    reference.to(kernel_device)
    query = torch.randn(5, 3, 32, device=kernel_device)
    memory = torch.randn(7, 3, 32, device=kernel_device)
    out, _ = kernel(query, memory)
    expected, _ = reference(query, memory)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="impl"):
        SingleHeadAttention(32, 16, impl="fast")
