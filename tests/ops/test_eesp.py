from __future__ import annotations

import pytest
import torch

from src.ops.eesp import EESP, DepthwiseDilatedSeparableConv, EESPDownsampler, eesp_dilations


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


@pytest.mark.parametrize(
    "branches, r_lim, dilations",
    [
        (4, 9, (1, 2, 3, 4)),
        (4, 7, (1, 1, 2, 3)),
        (4, 11, (1, 2, 3, 4)),
        (4, 5, (1, 1, 1, 2)),
        (1, 3, (1,)),
    ],
)
def test_dilations(branches: int, r_lim: int, dilations: tuple[int, ...]) -> None:
    assert eesp_dilations(branches, r_lim) == dilations


def test_separable_conv_gradcheck() -> None:
    layer = DepthwiseDilatedSeparableConv(4, 6, dilation=2, stride=2, groups=2)
    assert layer(torch.randn(1, 4, 7, 5)).shape == (1, 6, 4, 3)
    assert _gradcheck(layer, _input(1, 4, 5, 6))


@pytest.mark.parametrize(
    "stride, down_method, in_channels, out_channels",
    [(1, "esp", 8, 8), (2, "avg", 8, 8), (2, "esp", 8, 4), (1, "esp", 4, 8)],
    ids=["residual", "strided-avg", "strided-esp", "widening"],
)
def test_eesp_gradcheck(stride: int, down_method: str, in_channels: int, out_channels: int) -> None:
    layer = EESP(
        in_channels, out_channels, stride=stride, branches=2, r_lim=5, down_method=down_method
    )
    assert _gradcheck(layer, _input(2, in_channels, 5, 4))


def test_eesp_shapes_and_residual() -> None:
    layer = EESP(16, 16, branches=4, r_lim=9).eval()
    x = torch.randn(1, 16, 9, 6)
    assert layer(x).shape == x.shape
    strided = EESP(16, 16, stride=2, branches=4, r_lim=9, down_method="avg")
    assert strided(x).shape == (1, 16, 5, 3)


def test_downsampler_gradcheck_non_square() -> None:
    layer = EESPDownsampler(4, 8, branches=2, r_lim=5)
    # features 6x4 -> 3x2; image 24x16 -> 12x8 -> 6x4 -> 3x2
    assert _gradcheck(layer, _input(2, 4, 6, 4), _input(2, 3, 24, 16))


def test_downsampler_image_shortcut_sizes() -> None:
    layer = EESPDownsampler(8, 24, branches=4, r_lim=9)
    x = torch.randn(1, 8, 10, 6)
    assert layer(x).shape == (1, 24, 5, 3)
    assert layer(x, torch.randn(1, 3, 40, 24)).shape == (1, 24, 5, 3)
    assert layer(x, torch.randn(1, 3, 5, 3)).shape == (1, 24, 5, 3)  # already at the output size
    with pytest.raises(ValueError, match=r"cannot average-pool an image of \(40, 40\)"):
        layer(x, torch.randn(1, 3, 40, 40))
    with pytest.raises(ValueError, match="image_channels=None"):
        EESPDownsampler(8, 24, image_channels=None)(x, torch.randn(1, 3, 20, 12))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"in_channels \(6\) must be divisible by branches \(4\)"):
        EESP(6, 16, branches=4)
    with pytest.raises(ValueError, match=r"out_channels \(8\) by branches\*\*2"):
        EESP(8, 8, branches=4)
    with pytest.raises(ValueError, match="down_method"):
        EESP(16, 16, down_method="max")
    with pytest.raises(ValueError, match="must exceed"):
        EESPDownsampler(8, 8)
