"""Group-Transformer's per-group layer norm: the fused Triton kernel
(``src/kernels/per_group_layer_norm/triton_kernel.py``) against the PyTorch path, forward and
backward. Without CUDA the kernel runs in Triton's interpreter on CPU tensors.

float32 tolerance 1e-5: the two differ in summation order only. 16-bit inputs are normalised in
float32 by both from the same rounded values, so outputs and parameter gradients agree to float32
rounding too; the input gradient is rounded to the input's dtype at the end (one unit in the last
place, 2^-8 relative for bfloat16).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from src.kernels.per_group_layer_norm import auto_path, per_group_layer_norm_reference
from src.ops.per_group_layer_norm import PerGroupLayerNorm

pytest.importorskip("triton")

from src.kernels.per_group_layer_norm.triton_kernel import per_group_layer_norm_triton

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _run(fn: Callable[..., Tensor], x: Tensor, groups: int, eps: float = 1e-6) -> list[Tensor]:
    """Output and the gradients of x, weight and bias under the loss sum(output * probe)."""
    gen = torch.Generator().manual_seed(2)
    width = x.shape[-1]
    weight = torch.randn(width, generator=gen).to(x.device).requires_grad_()
    bias = torch.randn(width, generator=gen).to(x.device).requires_grad_()
    x = x.detach().requires_grad_()
    y = fn(x, weight, bias, groups, eps)
    probe = torch.randn(y.shape, generator=gen).to(y)
    return [y, *torch.autograd.grad(y, [x, weight, bias], probe)]


@pytest.mark.parametrize(
    ("shape", "groups"),
    [((3, 5, 96), 4), ((7, 64), 1), ((2, 9, 21), 3), ((130, 256), 2)],  # widths 24, 64, 7, 128
    ids=str,
)
def test_kernel_matches_reference(
    kernel_device: torch.device, shape: tuple[int, ...], groups: int
) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape, device=kernel_device) * 2 + 0.5
    got = _run(per_group_layer_norm_triton, x, groups)
    want = _run(per_group_layer_norm_reference, x, groups)
    for name, a, e in zip(["y", "x", "weight", "bias"], got, want, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype, name
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_kernel_normalises_16_bit_inputs_in_float32(
    kernel_device: torch.device, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 6, 128, device=kernel_device).to(dtype)
    got = _run(per_group_layer_norm_triton, x, 2)
    want = _run(per_group_layer_norm_reference, x, 2)
    assert got[0].dtype == torch.float32 and got[1].dtype == dtype
    for name, a, e in zip(["y", "weight", "bias"], got[:1] + got[2:], want[:1] + want[2:],
                          strict=True):  # fmt: skip
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=name)
    ulp = 2.0 ** -(8 if dtype == torch.bfloat16 else 11)
    error = (got[1].float() - want[1].float()).abs().max() / want[1].float().abs().max()
    assert float(error) <= ulp


def test_kernel_gradient_is_finite_on_constant_rows(kernel_device: torch.device) -> None:
    """A constant group has std 0: the output is the bias and the input gradient the first term
    alone, where the PyTorch path's autograd (sqrt at 0) gives NaN."""
    x = torch.randn(3, 8, device=kernel_device)
    x[1, :4] = 1.5
    y, grad_x, _, _ = _run(per_group_layer_norm_triton, x, 2)
    assert torch.isfinite(grad_x).all()
    torch.testing.assert_close(y[1, :4], _run(per_group_layer_norm_reference, x, 2)[0][1, :4])


def test_module_paths_agree_and_check_the_width(kernel_device: torch.device) -> None:
    torch.manual_seed(0)
    kernel = PerGroupLayerNorm(32, 4, impl="triton").to(kernel_device)
    reference = PerGroupLayerNorm(32, 4, impl="reference").to(kernel_device)
    with torch.no_grad():
        for norm in (kernel, reference):
            norm.weight.copy_(torch.linspace(0.5, 1.5, 32))
            norm.bias.copy_(torch.linspace(-1, 1, 32))
    x = torch.randn(5, 3, 32, device=kernel_device)
    torch.testing.assert_close(kernel(x), reference(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 32\)"):
        kernel(torch.randn(2, 16, device=kernel_device))
    # float64 is not the kernel's: the PyTorch path takes it whatever impl says
    x64 = x.double()
    torch.testing.assert_close(kernel.double()(x64), reference.double()(x64))


def test_auto_path_times_each_shape_once(kernel_device: torch.device, fresh_choices) -> None:
    x = torch.randn(6, 32, device=kernel_device)
    weight = torch.ones(32, device=kernel_device)
    bias = torch.zeros(32, device=kernel_device)
    times = iter([3.0, 1.0])  # the kernel, then the PyTorch path (faster here)
    calls: list[int] = []

    def timer(fn: Callable[[], object]) -> float:
        fn()
        calls.append(1)
        return next(times)

    assert auto_path(x, weight, bias, 4, 1e-6, timer) == "reference"
    assert auto_path(x, weight, bias, 4, 1e-6, timer) == "reference"
    assert len(calls) == 2


def test_kernel_compiles_in_one_graph() -> None:
    torch._dynamo.reset()
    norm = PerGroupLayerNorm(48, 3, impl="triton").to(DEVICE)
    x = torch.randn(4, 48, device=DEVICE, requires_grad=True)
    compiled = torch.compile(norm, backend="aot_eager", fullgraph=True)
    got, want = compiled(x), norm(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(
        torch.autograd.grad(got.square().sum(), x)[0],
        torch.autograd.grad(want.square().sum(), x)[0],
    )
    torch._dynamo.reset()


def test_group_transformer_on_the_kernels_matches_its_pytorch_path(
    kernel_device: torch.device,
) -> None:
    """A Group-Transformer training step with every norm and GLT on its Triton kernel against the
    same weights on PyTorch: loss and every parameter's gradient (summation order only)."""
    from src.models.group_transformer import GroupTransformer

    torch.manual_seed(0)
    kernels = GroupTransformer(
        30, n_layer=2, d_model=32, n_head=4, d_inner=64, n_group=2, tgt_len=5, mem_len=5,
        dropout=0.0,
    ).to(kernel_device)  # fmt: skip
    reference = GroupTransformer(
        30, n_layer=2, d_model=32, n_head=4, d_inner=64, n_group=2, tgt_len=5, mem_len=5,
        dropout=0.0,
    ).to(kernel_device)  # fmt: skip
    reference.load_state_dict(kernels.state_dict())
    for model, impl in ((kernels, "triton"), (reference, "reference")):
        for module in model.modules():
            if isinstance(getattr(module, "impl", None), str):
                module.impl = impl
    assert sum(isinstance(m, PerGroupLayerNorm) and m.impl == "triton"
               for m in kernels.modules()) == 10  # fmt: skip
    tokens = torch.randint(0, 30, (2, 5), device=kernel_device)
    results = []
    for model in (kernels, reference):
        _, memories = model(tokens)
        logits, _ = model(tokens, memories)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        results.append([loss, *torch.autograd.grad(loss, list(model.parameters()))])
    for a, e in zip(*results, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
