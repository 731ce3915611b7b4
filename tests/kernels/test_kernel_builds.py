"""Every Triton kernel builds for an H100 at the launches its ops make, in float32 and under
bfloat16 and float16 autocast (``benchmarks/cross_compile.py``): the interpreter, which runs
the other kernel tests here, is lenient where the GPU compiler is not. Each build must compile,
spill no registers and ask for no more shared memory than a block may have.

The launches are recorded from the ops' modules with ``impl="triton"``, forward and backward in
training and forward in inference, with inputs in the autocast dtype (as activations arrive after
a matmul or convolution under autocast), at the feature-map and layer sizes of the models
(DiCENet s=1.0 stages, the EESP units of ESPNetv2, DeLighT's and Group-Transformer's layers) with
a small batch: only the host code runs, so the sizes cost little, and they set the tile sizes the
GPU gets.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from benchmarks.cross_compile import (
    H100,
    Build,
    cross_compile,
    recorded_launches,
    toolchain_missing,
    train_and_infer,
)
from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import batch_norm_prelu
from src.kernels.group_linear import interleaved_group_linear
from src.kernels.linear import linear
from src.kernels.prelu import PReLU
from src.kernels.pru_recurrence import pru_recurrence
from src.kernels.relative_softmax import relative_softmax
from src.kernels.residual_layer_norm import residual_layer_norm
from src.kernels.shared_group_layer_norm import shared_group_layer_norm_swish
from src.ops.dice import DiCE
from src.ops.dim_conv import DimConv
from src.ops.eesp import EESP
from src.ops.group_linear import GroupLinear
from src.ops.per_group_layer_norm import PerGroupLayerNorm
from src.ops.relative_position import causal_memory_mask

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from src.kernels.fan_out.triton_kernel import gradient_sum_triton  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1",
        reason="launches are recorded in Triton's interpreter; with CUDA the kernel tests build "
        "and run every kernel on the GPU itself",
    ),
    pytest.mark.skipif(toolchain_missing() is not None, reason=str(toolchain_missing())),
]

PRECISIONS = (None, torch.bfloat16, torch.float16)  # None: float32, no autocast


def _on(x: torch.Tensor) -> Callable[[torch.nn.Module], torch.Tensor]:
    """The module's forward on ``x``, which asks for its gradient (the input-gradient kernels)."""
    x.requires_grad_()
    return lambda module: module(x if module.training else x.detach())


def _glt(dtype: torch.dtype) -> None:
    for rows, d_in, d_out, groups, shuffle in (
        (4096, 512, 1024, 16, True),
        (600, 256, 1024, 4, False),
    ):
        layer = GroupLinear(d_in, d_out, groups, shuffle=shuffle, impl="triton")
        train_and_infer(layer, _on(torch.randn(rows, d_in, dtype=dtype)))
    # DeLighT's input mixer: group i reads chunk i of both parts
    weight = torch.randn(8, 64 + 32, 64, requires_grad=True)
    parts = (
        torch.randn(4096, 512, requires_grad=True, dtype=dtype),
        torch.randn(4096, 256, requires_grad=True, dtype=dtype),
    )
    y = interleaved_group_linear(parts, weight, None, shuffle=True, impl="triton")
    y.float().sum().backward()
    # an nn.Linear as one group (src/kernels/linear.py): the transposed weight view, with a bias
    layer = torch.nn.Linear(320, 960)
    x = torch.randn(4096, 320, dtype=dtype, requires_grad=True)
    linear((x,), layer, impl="triton").float().sum().backward()


def _dim_conv(dtype: torch.dtype) -> None:
    for channels, size in ((58, 28), (116, 14), (232, 7)):
        train_and_infer(
            DimConv(channels, size, size, impl="triton"),
            _on(torch.randn(2, channels, size, size, dtype=dtype)),
        )


def _dim_fuse(dtype: torch.dtype) -> None:
    for channels, size in ((58, 28), (232, 7)):
        unit = DiCE(channels, channels, size, size, impl="triton")
        train_and_infer(unit, _on(torch.randn(2, channels, size, size, dtype=dtype)))


def _eesp(dtype: torch.dtype) -> None:
    train_and_infer(EESP(128, 128, impl="triton"), _on(torch.randn(2, 128, 28, 28, dtype=dtype)))
    train_and_infer(EESP(256, 256, impl="triton"), _on(torch.randn(2, 256, 7, 7, dtype=dtype)))
    # the strided pyramid of a down-sampling unit
    train_and_infer(
        EESP(64, 64, stride=2, impl="triton"), _on(torch.randn(2, 64, 56, 56, dtype=dtype))
    )


def _per_group_layer_norm(dtype: torch.dtype) -> None:
    for width, groups in ((256, 4), (256, 1), (512, 8), (1024, 2)):
        train_and_infer(
            PerGroupLayerNorm(width, groups, impl="triton"),
            _on(torch.randn(4, 512, width, dtype=dtype)),
        )


def _shared_group_layer_norm(dtype: torch.dtype) -> None:
    # DeLighT's: x0 of a DExTra unit (one group of 160), GLT outputs of 2-16 groups of 24-90
    for width, groups in ((160, 1), (360, 4), (704, 16), (192, 8)):
        x = torch.randn(4096, width, dtype=dtype, requires_grad=True)
        weight = torch.ones(width // groups, requires_grad=True)
        bias = torch.zeros(width // groups, requires_grad=True)
        # in training with DExTra's dropout, drawn in the kernel
        y = shared_group_layer_norm_swish(x, groups, weight, bias, p=0.1, impl="triton")
        y.float().sum().backward()
        with torch.no_grad():
            shared_group_layer_norm_swish(x, groups, weight, bias, impl="triton")


def _residual_layer_norm(dtype: torch.dtype) -> None:
    # DeLighT's post-norm residuals at d_m 320 (IWSLT), 512 and 1024 (WMT'14 En-Fr's largest):
    # the residual stream in float32, the branch in the autocast dtype
    for width in (320, 512, 1024):
        residual = torch.randn(4096, width, requires_grad=True)
        branch = torch.randn(4096, width, dtype=dtype, requires_grad=True)
        weight = torch.ones(width, requires_grad=True)
        bias = torch.zeros(width, requires_grad=True)
        y = residual_layer_norm(residual, branch, weight, bias, p=0.1, impl="triton")
        y.float().sum().backward()
        with torch.no_grad():
            residual_layer_norm(residual, branch, weight, bias, impl="triton")


def _batch_norm_prelu(dtype: torch.dtype) -> None:
    # DiCENet s=1.0's CBR outputs: the stem's, and a unit's at each stage
    for channels, size in ((24, 112), (116, 28), (232, 14), (464, 7)):
        norm, act = BatchNorm2d(channels), PReLU(channels)
        x = torch.randn(2, channels, size, size, dtype=dtype)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        batch_norm_prelu(x, norm, act, impl="triton").float().sum().backward()
    # with a residual, as ESPNetv2's EESP units add their input
    x, residual = (
        torch.randn(2, 128, 28, 28, dtype=dtype)
        .contiguous(memory_format=torch.channels_last)
        .requires_grad_()
        for _ in range(2)
    )
    norm, act = BatchNorm2d(128), PReLU(128)
    y = batch_norm_prelu(x, norm, act, impl="triton", residual=residual)
    y.float().sum().backward()


def _relative_softmax(dtype: torch.dtype) -> None:
    # enwik8 (512 queries, 512 memory), a segment without memory, and the longest row it takes
    for batch, qlen, mlen in ((2, 512, 512), (2, 128, 0), (1, 64, 8128)):
        shape = (batch, 8, qlen, qlen + mlen)
        content, position = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(2))
        prob = relative_softmax(
            content, position, causal_memory_mask(qlen, mlen), 0.17, impl="triton"
        )
        prob.float().sum().backward()
        with torch.no_grad():
            relative_softmax(content, position, None, 0.17, impl="triton")


def _pru_time_loop(dtype: torch.dtype) -> None:
    # the recurrence's time loop (its path off CUDA) at AWD-PRU's layers and PTB's batch (g = 4,
    # M = 1400 and 400) and a small group; under autocast the operands are cast to its dtype
    for batch, groups, width in ((20, 4, 350), (20, 4, 100), (3, 1, 24)):
        hidden = groups * width
        operands = [
            torch.randn(3, batch, 4, hidden, dtype=dtype, requires_grad=True),
            torch.randn(groups, width, 4 * width, requires_grad=True),
            torch.randn(groups, 4 * width, requires_grad=True),
            torch.randn(batch, hidden, dtype=dtype, requires_grad=True),
            torch.randn(batch, hidden, dtype=dtype, requires_grad=True),
        ]
        outputs = pru_recurrence(*operands, impl="triton")
        sum(y.float().sum() for y in outputs).backward()
        with torch.no_grad():
            pru_recurrence(*operands, impl="triton")


def _gradient_sum(dtype: torch.dtype) -> None:
    # x0's gradients in a DExTra unit of DeLighT MT (p = 160, 4,096 tokens): N + 1 = 5 to 9 terms,
    # and a run beyond the kernel's 8
    for count in (5, 9, 12):
        gradient_sum_triton([torch.randn(4096, 160).to(dtype) for _ in range(count)])


# the Triton kernel modules (``src.kernels.<module>``), each with a workload launching its kernels
WORKLOADS: dict[str, Callable[[torch.dtype], None]] = {
    "fan_out.triton_kernel": _gradient_sum,
    "group_linear.triton_kernel": _glt,
    "dim_conv.triton_kernel": _dim_conv,
    "dim_fuse.triton_kernel": _dim_fuse,
    "eesp.triton_kernel": _eesp,
    "per_group_layer_norm.triton_kernel": _per_group_layer_norm,
    "shared_group_layer_norm.triton_kernel": _shared_group_layer_norm,
    "residual_layer_norm.triton_kernel": _residual_layer_norm,
    "relative_softmax.triton_kernel": _relative_softmax,
    "batch_norm_prelu.triton_kernel": _batch_norm_prelu,
    "pru_recurrence.triton_time_loop": _pru_time_loop,
}


def test_every_kernel_module_has_a_workload() -> None:
    """A new Triton kernel module beside an op is built for the H100 too."""
    # (not tests.conftest's ROOT: the compiling child imports this module, and conftest turns
    # Triton's interpreter on)
    kernels = Path(__file__).resolve().parents[2] / "src" / "kernels"
    modules = {f"{path.parent.name}.{path.stem}" for path in kernels.glob("*/triton_*.py")}
    # the per-step PRU kernels run only where the time loop is not chosen (docs/gpu.md); dropout's
    # module holds a device function that the norms' kernels inline, no kernel of its own
    assert modules - set(WORKLOADS) <= {"pru_recurrence.triton_kernel", "dropout.triton_kernel"}
    assert set(WORKLOADS) <= modules


def _kernels_of(module: str) -> set[str]:
    """The kernels (``*_kernel`` Triton functions) defined in ``src.kernels.<module>``."""
    loaded = importlib.import_module(f"src.kernels.{module}")
    return {
        f"{loaded.__name__}:{name}"
        for name, value in vars(loaded).items()
        if name.endswith("_kernel")
        and getattr(getattr(value, "fn", None), "__module__", None) == loaded.__name__
    }


def _describe(build: Build) -> str:
    return (
        f"{build.name} {build.dtypes} {build.constants}: error {build.error}, "
        f"spilled {build.spill_bytes} B, shared {build.shared_bytes} B"
    )


@pytest.mark.parametrize("module", sorted(WORKLOADS))
def test_every_launch_builds_for_h100(module: str) -> None:
    torch.manual_seed(0)
    with recorded_launches(H100) as launches:
        for dtype in PRECISIONS:
            autocast = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
            with autocast:
                WORKLOADS[module](dtype or torch.float32)
    kernels = _kernels_of(module)
    assert kernels, f"no kernels found in src.kernels.{module}"
    launched = {launch.kernel for launch in launches}
    assert kernels <= launched, f"not launched by the workload: {sorted(kernels - launched)}"

    builds = cross_compile(launches, H100)
    assert len(builds) == len({launch.to_json() for launch in launches})
    failed = [
        b for b in builds
        if b.error or b.spill_bytes or b.shared_bytes > H100.shared_per_block or not b.occupancy
    ]  # fmt: skip
    assert not failed, "\n".join(map(_describe, failed))
    # 16-bit operands reach every kernel of the module as 16-bit pointers under autocast
    for kernel in kernels:
        for dtype in ("bfloat16", "float16"):
            assert any(b.kernel == kernel and dtype in b.dtypes for b in builds), (kernel, dtype)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tile = i[:, None] * BLOCK + i[None, :]
    tl.store(c_ptr + tile, tl.dot(tl.load(a_ptr + tile), tl.load(b_ptr + tile)))


def test_a_kernel_the_gpu_rejects_is_reported() -> None:
    """The interpreter runs a ``tl.dot`` of bfloat16 and float32 blocks; the GPU build refuses it,
    and the build says so (the same kernel with one dtype builds)."""
    c = torch.empty(16, 16)
    with recorded_launches(H100) as launches:
        for a_dtype in (torch.bfloat16, torch.float32):
            a, b = torch.randn(16, 16, dtype=a_dtype), torch.randn(16, 16)
            _dot_kernel[(1,)](a, b, c, BLOCK=16)
    mixed, same = cross_compile(launches, H100)
    assert mixed.dtypes == ("bfloat16", "float32", "float32") and same.error is None
    assert mixed.error is not None and "dtype" in mixed.error, mixed.error
    assert same.registers > 0 and same.spill_bytes == 0 and 0 < same.occupancy <= 1
