"""``torch.compile`` traces the GLT, DimConv, DExTra and the models built on them in one graph.

The GLT and DimConv have their own autograd Functions; ``torch.compile`` traces them: the GLT
reference's forward as plain PyTorch, its backward and every Triton launch as the custom ops
``lightnets::*`` (opaque nodes; without CUDA the kernels run in the interpreter inside them).
``fullgraph=True`` turns any graph break into an error. The ``aot_eager`` backend traces the
forward and backward graphs through AOTAutograd and runs them with the very kernels eager mode
uses, so compiled values and gradients equal the eager ones to float32 rounding (AOTAutograd's
decompositions of a few ops round in their own order); on a GPU the DimConv kernel also sums its
weight gradients with float atomics in a run-dependent order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.models.dicenet import DiCENet
from src.models.group_transformer import GroupTransformer
from src.ops.dextra import DExTra
from src.ops.dim_conv import DimConv
from src.ops.group_linear import GroupLinear
from src.ops.per_group_layer_norm import PerGroupLayerNorm
from tests.helpers import tf32

pytest.importorskip("triton")

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    # TF32 off on CUDA: eager and compiled runs may take different paths (a fused Triton pass
    # eagerly, cuDNN's convolutions under compile), which TF32 would set 1e-3 apart
    torch._dynamo.reset()
    with tf32(False):
        yield
    torch._dynamo.reset()


def assert_same(got: Sequence[Tensor], want: Sequence[Tensor]) -> None:
    """Equal to float32 rounding: on the CPU within 1e-5 relative (AOTAutograd's decompositions of
    a few ops, e.g. the layer norms' backward, round in another order than eager's kernels on
    some CPUs: an AMD EPYC put the Group-Transformer's gradients 1e-7 apart), on a GPU also
    within float32 atomics' reordering (module docstring)."""
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 if CUDA else 1e-7)


def check_compiles(fn: Callable[..., Tensor], inputs: Sequence[Tensor], module: nn.Module) -> None:
    """``fn`` compiles in one graph and gives eager's output and gradients (inputs and
    parameters, under the loss ``sum(output * probe)``)."""
    leaves = [*(x for x in inputs if x.requires_grad), *module.parameters()]

    def run(f: Callable[..., Tensor]) -> list[Tensor]:
        out = f(*inputs)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        return [out, *torch.autograd.grad(out, leaves, probe)]

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    assert_same(run(compiled), run(fn))


@pytest.mark.parametrize("impl, bias", [("reference", True), ("triton", False)])
def test_group_linear_compiles(impl: str, bias: bool) -> None:
    torch.manual_seed(0)
    glt = GroupLinear(24, 16, 4, bias=bias, shuffle=True, impl=impl).to(DEVICE)
    x = torch.randn(3, 7, 24, device=DEVICE, requires_grad=True)
    check_compiles(glt, [x], glt)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_group_linear_compiles_under_autocast(impl: str) -> None:
    torch.manual_seed(0)
    glt = GroupLinear(24, 16, 4, shuffle=True, impl=impl).to(DEVICE)
    x = torch.randn(21, 24, device=DEVICE, requires_grad=True)

    def fn(x: Tensor) -> Tensor:
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            return glt(x)

    check_compiles(fn, [x], glt)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_dextra_compiles(impl: str) -> None:
    # the GLTs after the first read two parts: x0 and the previous output (the input mixer)
    torch.manual_seed(0)
    unit = DExTra(32, 16, 16, width_multiplier=2.0, depth=3, max_groups=4, impl=impl).to(DEVICE)
    x = torch.randn(2, 5, 32, device=DEVICE, requires_grad=True)
    check_compiles(unit, [x], unit)


@pytest.mark.parametrize(
    "impl, interleave, size",
    [
        ("triton", True, (5, 6)),  # at the build size: the kernel
        ("triton", False, (5, 6)),
        ("reference", True, (5, 6)),
        ("reference", True, (7, 4)),  # off it: the resizing reference, whatever impl says
    ],
    ids=str,
)
def test_dim_conv_compiles(impl: str, interleave: bool, size: tuple[int, int]) -> None:
    torch.manual_seed(0)
    layer = DimConv(4, 5, 6, dilation=(1, 2, 1), interleave=interleave, impl=impl).to(DEVICE)
    x = torch.randn(2, 4, *size, device=DEVICE, requires_grad=True)
    check_compiles(layer, [x], layer)


@pytest.mark.parametrize("norm_impl", ["reference", "auto"])
def test_group_transformer_training_step_compiles(norm_impl: str) -> None:
    # a segment after the first: memories in, new memories out
    torch.manual_seed(0)
    model = GroupTransformer(
        40, n_layer=2, d_model=32, n_head=4, d_inner=64, n_group=2, tgt_len=6, mem_len=6,
        dropout=0.0,
    ).to(DEVICE)  # fmt: skip
    for module in model.modules():
        if isinstance(module, PerGroupLayerNorm):
            module.impl = norm_impl
    tokens = torch.randint(0, 40, (2, 6), device=DEVICE)
    _, memories = model(tokens)

    def loss_fn(tokens: Tensor, *memories: Tensor) -> Tensor:
        logits, _ = model(tokens, list(memories))
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    params = list(model.parameters())
    got = compiled(tokens, *memories)
    want = loss_fn(tokens, *memories)
    got, want = [got, *torch.autograd.grad(got, params)], [want, *torch.autograd.grad(want, params)]
    if norm_impl == "auto" and not CUDA:
        # eagerly the per-group norms run their fused C++ kernels, compiled their PyTorch passes
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        assert_same(got, want)


def _dicenet_training_step_compiles(
    model: nn.Module, inputs: Sequence[Tensor], labels: Tensor
) -> None:
    def loss_fn(*inputs: Tensor) -> Tensor:
        out = model(*inputs)
        return F.cross_entropy(out.mean((2, 3)) if out.dim() == 4 else out, labels)

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    params = list(model.parameters())
    got = compiled(*inputs)
    got = [got, *torch.autograd.grad(got, params)]
    # On a GPU eager DiCE units take the fused Triton pass when it timed faster and compiled ones
    # the unfused ops, and a whole network of batch-2 training-mode BNs over 2 x 2 maps amplifies
    # that float32 difference (on an H200 to 4e-3): the eager run takes the compiled paths
    with (
        mock.patch.object(torch.compiler, "is_compiling", return_value=True)
        if CUDA
        else (contextlib.nullcontext())
    ):
        want = loss_fn(*inputs)
        want = [want, *torch.autograd.grad(want, params)]
    assert_same(got, want)


def test_dicenet_stage_training_step_compiles() -> None:
    # DiCENet's last stage (strided DiCE, three DiCE shuffle units; DimConvs built for 2 x 2),
    # training-mode BN (batch statistics): every kind of unit the network has, traced in seconds
    torch.manual_seed(0)
    stage = DiCENet(0.5, num_classes=10, input_size=64, dropout=0.0).backbone.level5.to(DEVICE)
    x = torch.randn(2, stage[0].in_channels, 4, 4, device=DEVICE)
    _dicenet_training_step_compiles(stage, [x], torch.tensor([3, 7], device=DEVICE))


@pytest.mark.slow
def test_dicenet_training_step_compiles() -> None:
    # the whole network built for 64 x 64 (DimConvs at 16, 8, 4 and 2 pixels): about half a
    # minute of tracing on 2 cores, hence slow
    torch.manual_seed(0)
    model = DiCENet(0.5, num_classes=10, input_size=64, dropout=0.0).to(DEVICE)
    images = torch.randn(2, 3, 64, 64, device=DEVICE)
    _dicenet_training_step_compiles(model, [images], torch.tensor([3, 7], device=DEVICE))
