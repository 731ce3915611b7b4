"""Every Triton op run in the interpreter with an H100's launch configuration, against its PyTorch
path, forward and backward.

Elsewhere the interpreter runs its own configuration: a tile covers as much of an image as it
can, the GLT's rows come in blocks of 32 and its weight gradient in 16 split-K programs, the
DimConv weight gradient takes the whole batch per program. On a GPU the tiles are 512 pixels (or
4,096 norm elements), GLT rows come in blocks of 64 with about four split-K programs per SM, and
the DimConv weight gradient sums batch blocks. Those tilings, halos, masks and cross-program sums
are what a GPU runs first; here they run (not only compile, as in ``test_kernel_builds.py``)
before one does. The shapes span several tiles, row blocks, splits and batch blocks each.

Float32, and float16 autocast for the GLT: on a GPU the GLT kernel hands 16-bit operands to
``tl.dot`` as they are, which the interpreter's own configuration never does (there they are
widened to float32 first, since the interpreter multiplies bfloat16 operands as integers,
triton-lang/triton#11584); float16 it multiplies correctly, so that path runs here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor, nn

pytest.importorskip("triton")

from benchmarks.cross_compile import H100
from src.kernels.dim_conv.triton_kernel import _weight_grid
from src.kernels.group_linear.triton_kernel import split_k_splits
from src.kernels.per_group_layer_norm.triton_kernel import _column_launch as _norm_column_launch
from src.kernels.per_group_layer_norm.triton_kernel import _launch as _norm_launch
from src.kernels.residual_layer_norm import residual_layer_norm
from src.kernels.residual_layer_norm.triton_kernel import _column_launch as _residual_column_launch
from src.kernels.shared_group_layer_norm import shared_group_layer_norm_swish
from src.kernels.shared_group_layer_norm.triton_kernel import _column_launch as _group_column_launch
from src.kernels.triton.launch import launches_for
from src.kernels.triton.stencil import launch_config
from src.ops.dextra import DExTra
from src.ops.dice import DiCE
from src.ops.dim_conv import DimConv
from src.ops.eesp import EESP
from src.ops.group_linear import GroupLinear
from src.ops.per_group_layer_norm import PerGroupLayerNorm
from src.ops.shared_group_layer_norm import SharedGroupLayerNorm
from tests.helpers import randomise_norms

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="with CUDA the kernel tests run this configuration for real"
)


@pytest.fixture(autouse=True)
def h100_launches() -> Iterator[None]:
    torch.manual_seed(0)  # the inputs
    with launches_for(H100.target):
        yield


def _step(module: nn.Module, x: Tensor) -> list[Tensor]:
    """Output, input gradient, parameter gradients and buffers (BN's running statistics) after
    one forward and a backward of a fixed probe."""
    x = x.detach().clone().requires_grad_()
    y = module(x)
    probe = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    y.backward(probe)
    return [y, x.grad, *(p.grad for p in module.parameters()), *module.buffers()]


def _assert_paths_agree(
    build: Callable[[str], nn.Module], x: Tensor, training: bool, half: bool = False
) -> None:
    """``build("triton")`` and ``build("reference")``, seeded alike, give the same step (under
    float16 autocast with ``half``)."""
    results = []
    for impl in ("triton", "reference"):
        torch.manual_seed(0)
        module = build(impl).train(training)
        with torch.autocast("cpu", dtype=torch.float16, enabled=half):
            results.append(_step(module, x))
    assert len(results[0]) == len(results[1])
    for i, (got, want) in enumerate(zip(*results, strict=True)):
        assert got.dtype == want.dtype
        if half:
            # float16 roundings, in another order on each path, carried through DExTra's norms:
            # within 2% of the tensor's largest value (at most 0.77% over 30 random inputs,
            # median 0.39%; a GLT alone 0.04%); a wrong tile or mask errs by its whole size
            error = (got.float() - want.float()).abs().max()
            assert error <= 2e-2 * want.float().abs().max(), f"tensor {i}: {error}"
            continue
        # the gradients sum over every pixel or token, in another order than PyTorch's: as the
        # kernel tests, 1e-4 there (4.6e-5 measured for a DimConv weight over 3 x 18 x 34 pixels,
        # in either configuration)
        tolerance = 1e-5 if i == 0 else 1e-4
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance, msg=f"tensor {i}")


def test_group_linear_over_row_blocks_and_split_k() -> None:
    # 512 tokens: 8 row blocks of 64; the weight gradient (k = 16 rows, 4 groups, 16 columns:
    # 4 tiles) would split the tokens for about 4 x 132 programs, but each split reduces at least
    # 4 blocks of 64 tokens (the GPU's reduction block): 2 splits
    x = torch.randn(512, 64)
    assert split_k_splits(x.view(512, 4, 16).permute(2, 1, 0), 16, programs=4 * 132) == 2
    for shuffle in (False, True):
        _assert_paths_agree(
            lambda impl, s=shuffle: GroupLinear(64, 64, 4, shuffle=s, impl=impl), x, True
        )


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16_autocast"])
def test_dextra_two_part_group_linears(half: bool) -> None:
    # the GLTs after the first read two parts (the input mixer); 300 tokens: a partial row block
    x = torch.randn(3, 100, 32)
    _assert_paths_agree(
        lambda impl: DExTra(32, 16, 16, width_multiplier=2.0, depth=3, max_groups=4, impl=impl),
        x, True, half,
    )  # fmt: skip


def test_group_linear_16_bit_dot_operands() -> None:
    x = torch.randn(512, 64)
    _assert_paths_agree(lambda impl: GroupLinear(64, 64, 4, shuffle=True, impl=impl), x, True, True)


@pytest.mark.parametrize("interleave", [True, False])
def test_dim_conv_over_tiles_and_batch_blocks(interleave: bool) -> None:
    # 18 x 34 maps in 8 x 64 tiles: three along H, the last partial, and 34 of 64 columns; 3 images
    # of 12 programs each: the weight gradient sums 3 batch blocks of one image
    x = torch.randn(3, 4, 18, 34)
    grid, meta = launch_config(x.shape, on_gpu=True)
    assert (grid, meta["num_warps"]) == ((3 * 3, 4, 1), 8)
    assert _weight_grid(grid, 3, on_gpu=True) == ((3 * 3, 4, 1), 1)
    _assert_paths_agree(
        lambda impl: DimConv(4, 18, 34, dilation=(1, 2, 1), interleave=interleave, impl=impl),
        x, True,
    )  # fmt: skip


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_fused_dice_over_tiles(training: bool) -> None:
    # DimConv + local fusion in one pass: statistics and output passes in training, the
    # backward's sums and grad-h passes, partial sums of 8 x 64 tiles
    x = torch.randn(2, 4, 18, 34)

    def build(impl: str) -> nn.Module:
        return randomise_norms(DiCE(4, 4, 18, 34, dilation=(1, 2, 1), impl=impl))

    if training:
        _assert_paths_agree(build, x, True)
        return
    outputs = []
    for impl in ("triton", "reference"):
        torch.manual_seed(0)
        with torch.no_grad():
            outputs.append(build(impl).eval()(x))
    torch.testing.assert_close(*outputs, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("stride", [1, 2])
def test_fused_eesp_pyramid_over_tiles(stride: int) -> None:
    x = torch.randn(2, 8, 18, 34)

    def build(impl: str) -> nn.Module:
        return randomise_norms(EESP(8, 16, stride=stride, branches=4, r_lim=9, impl=impl))

    _assert_paths_agree(build, x, True)


def test_per_group_norm_over_row_programs() -> None:
    # 300 rows of 4 groups of 64: 64 rows per 4,096-element program, 5 programs a group; the
    # weight and bias gradients from 8 column programs of 32 features, each summing all 300 rows
    # in blocks of 128
    x = torch.randn(300, 256).mul_(2).add_(0.5)
    assert _norm_launch(300, 64, 4, on_gpu=True)[0] == (5, 4)
    assert _norm_column_launch(300, 256, on_gpu=True) == (
        8, {"COLUMN_ROWS": 128, "COLUMN_BLOCK": 32}
    )  # fmt: skip
    _assert_paths_agree(
        lambda impl: randomise_affine(PerGroupLayerNorm(256, 4, impl=impl)), x, True
    )


def randomise_affine(norm: PerGroupLayerNorm) -> PerGroupLayerNorm:
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.5)
        norm.bias.normal_(0.0, 0.5)
    return norm


class _ResidualNorm(nn.Module):
    """``residual_layer_norm`` of a fixed residual and the input, as a module for :func:`_step`."""

    def __init__(self, residual: Tensor, impl: str) -> None:
        super().__init__()
        self.residual, self.impl = residual, impl
        self.norm = nn.LayerNorm(residual.shape[-1])
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.5)
            self.norm.bias.normal_(0.0, 0.5)

    def forward(self, x: Tensor) -> Tensor:
        n = self.norm
        return residual_layer_norm(self.residual, x, n.weight, n.bias, n.eps, impl=self.impl)


class _GroupNormSwish(nn.Module):
    """``shared_group_layer_norm_swish`` with a random shared affine, as a module."""

    def __init__(self, width: int, groups: int, impl: str) -> None:
        super().__init__()
        self.impl = impl
        self.norm = SharedGroupLayerNorm(width, groups)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.5)
            self.norm.bias.normal_(0.0, 0.5)

    def forward(self, x: Tensor) -> Tensor:
        n = self.norm
        return shared_group_layer_norm_swish(x, n.groups, n.weight, n.bias, impl=self.impl)


def test_residual_norm_weight_gradient_over_column_programs() -> None:
    # 300 rows of 80 features: 75 row programs of 4 rows (2,048-element tiles of 512 columns) and
    # 3 column programs of 32 features, each summing all 300 rows in blocks of 64
    assert _residual_column_launch(300, 80, on_gpu=True) == (
        3, {"COLUMN_ROWS": 64, "COLUMN_BLOCK": 32}
    )  # fmt: skip
    residual = torch.randn(300, 80)
    _assert_paths_agree(lambda impl: _ResidualNorm(residual, impl), torch.randn(300, 80), True)


def test_group_norm_weight_gradient_over_column_programs() -> None:
    # 300 rows of 4 groups of 40: 3 column programs of 16 group features, each summing all 300
    # rows of every group in blocks of 128
    assert _group_column_launch(300, 40, on_gpu=True) == (
        3, {"COLUMN_ROWS": 128, "COLUMN_BLOCK": 16}
    )  # fmt: skip
    x = torch.randn(300, 160).mul_(2).add_(0.5)
    _assert_paths_agree(lambda impl: _GroupNormSwish(160, 4, impl), x, True)
