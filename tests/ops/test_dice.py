from __future__ import annotations

import pytest
import torch

from src.ops.dice import DiCE, DiCEShuffleUnit, StridedDiCE
from src.ops.dim_fuse import DimFuse

pytest.importorskip("triton")


def _gradcheck(module: torch.nn.Module, *inputs: torch.Tensor) -> bool:
    """float64 gradcheck of ``module`` w.r.t. its inputs and every parameter (train-mode BN).

    ``fast_mode`` checks random projections of the Jacobian, which keeps the many-parameter
    modules quick; DimConv's own check in test_dim_conv.py is the full one."""
    module = module.double()
    params = tuple(module.parameters())
    names = [name for name, _ in module.named_parameters()]

    def run(*args: torch.Tensor) -> torch.Tensor:
        values = dict(zip(names, args[len(inputs) :]))
        return torch.func.functional_call(module, values, args[: len(inputs)])

    return torch.autograd.gradcheck(run, (*inputs, *params), fast_mode=True)


def _input(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


def test_dim_fuse_gradcheck() -> None:
    assert _gradcheck(DimFuse(4, 6), _input(2, 12, 3, 4))


@pytest.mark.parametrize("size", [(4, 5), (3, 7)])  # at the build size, and resized
def test_dice_gradcheck(size: tuple[int, int]) -> None:
    assert _gradcheck(DiCE(4, 6, 4, 5), _input(2, 4, *size))


def test_strided_dice_and_unit_gradcheck() -> None:
    assert _gradcheck(StridedDiCE(4, 2, 3), _input(2, 4, 4, 5))
    assert _gradcheck(DiCEShuffleUnit(8, 10, 3, 2), _input(2, 8, 3, 2))


@pytest.mark.parametrize("size", [(20, 36), (28, 28), (31, 9)])
def test_dice_any_size(size: tuple[int, int]) -> None:
    layer = DiCE(8, 12, 28, 28)
    assert layer(torch.randn(2, 8, *size)).shape == (2, 12, *size)


def test_strided_dice_halves_odd_sizes() -> None:
    assert StridedDiCE(8, 7, 5)(torch.randn(2, 8, 13, 10)).shape == (2, 16, 7, 5)


def test_shuffle_unit_widens_and_rejects_bad_splits() -> None:
    unit = DiCEShuffleUnit(48, 116, 6, 5)
    assert unit.passed == 24
    assert unit(torch.randn(1, 48, 6, 5)).shape == (1, 116, 6, 5)
    with pytest.raises(ValueError, match="split_ratio=1.0"):
        DiCEShuffleUnit(8, 8, 4, 4, split_ratio=1.0)


def test_dice_triton_matches_reference(kernel_device: torch.device) -> None:
    torch.manual_seed(0)
    ours = DiCE(6, 8, 5, 7, impl="triton").to(kernel_device)
    ref = DiCE(6, 8, 5, 7, impl="reference").to(kernel_device)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 6, 5, 7, device=kernel_device, requires_grad=True)
    out, want = ours(x), ref(x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, x, grad)
    (rx,) = torch.autograd.grad(want, x, grad)
    torch.testing.assert_close(gx, rx, rtol=1e-4, atol=1e-4)


def test_dice_exports_at_a_dynamic_size() -> None:
    layer = DiCE(8, 8, 6, 6).eval()
    x = torch.randn(1, 8, 4, 9)
    exported = torch.export.export(layer, (x,))
    torch.testing.assert_close(exported.module()(x), layer(x))


def test_dim_fuse_rejects_narrow_inputs() -> None:
    with pytest.raises(ValueError, match="channels=3"):
        DimFuse(3, 8)
    with pytest.raises(ValueError, match=r"expected \(B, 12, H, W\)"):
        DimFuse(4, 8)(torch.randn(1, 8, 2, 2))
