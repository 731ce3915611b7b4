"""The Triton BatchNorm + PReLU kernels (``src/kernels/batch_norm_prelu/triton_kernel.py``) against
a float64 oracle, the C++ kernels and the two modules: compiled on CUDA when a GPU is present, in
Triton's interpreter otherwise, there also with an H100's tiles (128 channels, 32 rows a tile,
several row tiles summed per program).

Tolerances: float32 within 1e-5 of the oracle relative to each tensor's largest value (float32
sums in another order), the statistics too; 16-bit inputs: the output and input gradient are
rounded once to their dtype (one unit in the last place, relative), from float32 values, and the
float32 parameter gradients within 1e-4.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import Tensor

from benchmarks.cross_compile import H100
from src.kernels import forget
from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import auto_path, batch_norm_prelu
from src.kernels.batch_norm_prelu.triton_kernel import (
    batch_norm_prelu_backward_triton,
    batch_norm_prelu_forward_triton,
)
from src.kernels.prelu import PReLU
from src.kernels.triton.launch import launches_for
from tests.helpers import max_relative_error, require_cpu_kernels

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
FUSED = "BatchNormPReLUFunctionBackward"
# one unit in the last place of the output's dtype, relative: Triton's interpreter truncates
# float32 to bfloat16 (2^-7), where a GPU rounds to nearest (2^-8)
ROUNDING = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-10}


def _tiles(gpu: bool) -> contextlib.AbstractContextManager:
    """An H100's launch configuration for CPU tensors in the interpreter (CUDA has its own)."""
    return launches_for(H100.target) if gpu and not CUDA else contextlib.nullcontext()


def _operands(rows: int, channels: int, dtype: torch.dtype, offset: float = 0.0):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(rows, channels, generator=gen) * 2 + torch.randn(channels, generator=gen)
    grad_y = torch.randn(rows, channels, generator=gen)
    weight = torch.rand(channels, generator=gen) * 3 - 1
    bias, slope = torch.randn(channels, generator=gen), torch.rand(channels, generator=gen) - 0.25
    residual = torch.randn(rows, channels, generator=gen)
    return [t.to(DEVICE) for t in (x + offset, grad_y, weight, bias, slope, residual)], dtype


def _oracle(
    x: Tensor,
    grad_y: Tensor,
    weight: Tensor,
    bias: Tensor,
    slope: Tensor,
    eps: float,
    residual: Tensor | None = None,
):
    """y, mean, 1/std, unbiased variance; the gradients of x, weight, bias, slope (and residual),
    in float64."""
    x, grad_y, weight, bias, slope = (t.double() for t in (x, grad_y, weight, bias, slope))
    leaves = [t.requires_grad_() for t in (x, weight, bias, slope)]
    mean, var = x.mean(0), x.var(0, unbiased=False)
    invstd = (var + eps).rsqrt()
    z = (x - mean) * invstd * weight + bias
    if residual is not None:
        residual = residual.double().requires_grad_()
        leaves.append(residual)
        z = z + residual
    y = torch.where(z > 0, z, slope * z)
    grads = torch.autograd.grad(y, leaves, grad_y)
    rows = x.shape[0]
    return [y, mean, invstd, var * rows / (rows - 1)], list(grads)


@pytest.mark.parametrize("gpu_tiles", [False, True], ids=["own_tiles", "h100_tiles"])
@pytest.mark.parametrize(
    ("rows", "channels", "dtype", "with_residual"),
    [(50, 7, torch.float32, False), (2304, 200, torch.float32, False),
     (9000, 24, torch.float32, False), (2304, 200, torch.float32, True),
     (2304, 200, torch.bfloat16, True), (600, 130, torch.float16, False)],
    ids=str,
)  # fmt: skip
def test_kernels_match_the_float64_oracle(
    rows: int, channels: int, dtype: torch.dtype, with_residual: bool, gpu_tiles: bool
) -> None:
    (x, grad_y, weight, bias, slope, residual), _ = _operands(rows, channels, dtype)
    x, grad_y, residual = x.to(dtype), grad_y.to(dtype), residual.to(dtype)
    residual = residual if with_residual else None
    outputs, grads = _oracle(x, grad_y, weight, bias, slope, 1e-5, residual)
    with _tiles(gpu_tiles):
        got = batch_norm_prelu_forward_triton(x, weight, bias, slope, 1e-5, residual)
        got_grads = batch_norm_prelu_backward_triton(
            grad_y, x, weight, bias, slope, *got[1:3], residual
        )
    assert got[0].dtype == got_grads[0].dtype == dtype
    rounding = ROUNDING[dtype]
    for name, a, b in zip(["y", "grad_x"], (got[0], got_grads[0]), (outputs[0], grads[0]),
                          strict=True):  # fmt: skip
        assert max_relative_error(a, b) < rounding + 1e-5, name
    if with_residual:
        assert got_grads[4].dtype == dtype
        assert max_relative_error(got_grads[4], grads[4]) < rounding + 1e-5, "grad_residual"
    else:
        assert got_grads[4].numel() == 0
    for name, a, b in zip(["mean", "invstd", "var"], got[1:], outputs[1:], strict=True):
        assert a.dtype == torch.float32 and max_relative_error(a, b) < 1e-5, name
    for name, a, b in zip(["weight", "bias", "slope"], got_grads[1:4], grads[1:4], strict=True):
        bound = 1e-5 if dtype == torch.float32 else 1e-4
        assert a.dtype == torch.float32 and max_relative_error(a, b) < bound, name


def test_statistics_of_a_mean_far_from_zero() -> None:
    (x, _, weight, bias, slope, _), _ = _operands(4096, 16, torch.float32, offset=3000.0)
    outputs, _ = _oracle(x, x, weight, bias, slope, 1e-5)
    with _tiles(True):
        got = batch_norm_prelu_forward_triton(x, weight, bias, slope, 1e-5)
    assert max_relative_error(got[3], outputs[3]) < 1e-4  # the variance: 1e-6 of the squares
    assert max_relative_error(got[0], outputs[0]) < 1e-3


@pytest.mark.skipif(CUDA, reason="the C++ kernels are the CPU's")
def test_kernels_equal_the_cpu_kernels_to_float32_rounding() -> None:
    require_cpu_kernels()
    (x, grad_y, weight, bias, slope, residual), _ = _operands(2304, 200, torch.float32)
    cpu = torch.ops.lightnets_cpu.batch_norm_prelu_forward(x, weight, bias, slope, 1e-5, residual)
    cpu_grads = torch.ops.lightnets_cpu.batch_norm_prelu_backward(
        grad_y, x, weight, bias, slope, cpu[1], cpu[2], residual
    )
    with _tiles(True):
        got = batch_norm_prelu_forward_triton(x, weight, bias, slope, 1e-5, residual)
        got_grads = batch_norm_prelu_backward_triton(
            grad_y, x, weight, bias, slope, *got[1:3], residual
        )
    for a, b in zip([*got, *got_grads], [*cpu, *cpu_grads], strict=True):
        assert max_relative_error(a, b.double()) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_function_with_impl_triton_matches_the_two_modules(dtype: torch.dtype) -> None:
    torch.manual_seed(5)
    norm, act = BatchNorm2d(12).to(DEVICE), PReLU(12).to(DEVICE)
    with torch.no_grad():
        norm.weight.uniform_(-1, 2)
        act.weight.uniform_(-0.25, 0.75)
    other_norm, other_act = BatchNorm2d(12).to(DEVICE), PReLU(12).to(DEVICE)
    other_norm.load_state_dict(norm.state_dict())
    other_act.load_state_dict(act.state_dict())
    x = torch.randn(4, 12, 9, 7).to(DEVICE, dtype)
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    probe = torch.randn(4, 12, 9, 7).to(DEVICE, dtype)
    # 16-bit activations reach BN under autocast, which the modules need (PReLU casts its slope)
    autocast = torch.autocast(DEVICE.type, dtype=dtype, enabled=dtype != torch.float32)
    saved = []
    with (
        autocast,
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
    ):
        y = batch_norm_prelu(x, norm, act, impl="triton")
    assert type(y.grad_fn).__name__ == FUSED
    assert sum(t.numel() for t in saved) == x.numel() + 5 * 12  # x and six (C,) vectors
    assert y.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last)
    grads = torch.autograd.grad(y, (x, norm.weight, norm.bias, act.weight), probe)
    with autocast:
        want = other_act(other_norm(x))
    want_grads = torch.autograd.grad(
        want, (x, other_norm.weight, other_norm.bias, other_act.weight), probe
    )
    bound = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16: the modules round BN's output
    for a, b in zip([y, *grads], [want, *want_grads], strict=True):
        assert max_relative_error(a, b.double()) < bound
    stats_bound = 1e-5 if dtype == torch.float32 else 1e-3
    for a, b in ((norm.running_mean, other_norm.running_mean),
                 (norm.running_var, other_norm.running_var)):  # fmt: skip
        assert max_relative_error(a, b.double()) < stats_bound
    assert int(norm.num_batches_tracked) == 1


def test_auto_path_keeps_the_faster_and_deterministic_mode_the_kernels(fresh_choices) -> None:
    norm, act = BatchNorm2d(8).to(DEVICE), PReLU(8).to(DEVICE)
    x = torch.randn(2, 8, 5, 5, device=DEVICE).contiguous(memory_format=torch.channels_last)
    timed = []

    def timer(fn) -> float:
        fn()  # each candidate runs: a forward and backward on detached copies
        timed.append(fn)
        return 2.0 if len(timed) == 1 else 1.0  # the second candidate ("reference") is faster

    state = {k: v.clone() for k, v in norm.state_dict().items()}
    try:
        assert auto_path(x, norm, act, timer) == "reference"
        assert auto_path(x, norm, act, timer) == "reference" and len(timed) == 2  # kept
        assert all(torch.equal(v, norm.state_dict()[k]) for k, v in state.items())
        torch.use_deterministic_algorithms(True)
        forget()
        assert auto_path(x, norm, act) == "triton"
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    ("change", "message"),
    [("rank", "x must be contiguous"), ("float64", "x must be contiguous"),
     ("strided", "x must be contiguous"), ("one_row", "more than one value per channel"),
     ("short_weight", "weight must be a contiguous float32 \\(5,\\) vector"),
     ("half_slope", "slope must be a contiguous float32"),
     ("grad_y", "grad_y must be contiguous rows of x's shape"),
     ("short_residual", "residual must be contiguous rows of x's shape"),
     ("half_residual", "residual must be contiguous rows of x's shape")],
)  # fmt: skip
def test_operands_are_checked_before_any_launch(change: str, message: str) -> None:
    (x, grad_y, weight, bias, slope, residual), _ = _operands(12, 5, torch.float32)
    if change == "rank":
        x = x[None]
    elif change == "float64":
        x = x.double()
    elif change == "strided":
        x = torch.cat((x, x), 1)[:, ::2]
    elif change == "one_row":
        x = x[:1]
    elif change == "short_weight":
        weight = weight[:4]
    elif change == "half_slope":
        slope = slope.half()
    elif change == "grad_y":
        grad_y = grad_y[:6]
    elif change == "short_residual":
        residual = residual[:6]
    elif change == "half_residual":
        residual = residual.half()
    if "residual" not in change:
        residual = None
    stats = (torch.zeros(5, device=DEVICE), torch.ones(5, device=DEVICE))
    with pytest.raises(ValueError, match=message):
        if change == "grad_y":
            batch_norm_prelu_backward_triton(grad_y, x, weight, bias, slope, *stats)
        else:
            batch_norm_prelu_forward_triton(x, weight, bias, slope, 1e-5, residual)


def test_launch_takes_gpu_tiles_under_an_h100_configuration() -> None:
    from src.kernels.batch_norm_prelu.triton_kernel import _launch, _tiles_per_program

    x = torch.empty(2304, 200)
    with launches_for(H100.target):
        tiles, channel_blocks, programs, per_program, meta = _launch(x)
    # 128 channels x 32 rows; 4 x 132 programs over 2 channel blocks: up to 264 row programs
    assert (tiles, channel_blocks, meta["BLOCK_R"], meta["BLOCK_C"]) == (72, 2, 32, 128)
    assert meta["num_warps"] == 8 and per_program == 1 and programs == 72
    assert _tiles_per_program(9000, 2, x.device) == 9000  # in the interpreter: one program
    with launches_for(H100.target):
        assert _tiles_per_program(9000, 2, x.device) == 35  # 9,000 tiles over 264 programs
