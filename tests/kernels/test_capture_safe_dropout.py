"""Dropout masks drawn by the kernels from a seed tensor (``src/kernels/dropout/contract.py``): the
CPU's hashed dropout (C++) and the fused norms' Triton kernels (residual LayerNorm, DExTra's
per-group norm and swish; in Triton's interpreter without CUDA).

Each call draws a new mask, and the backward applies the forward's; ``torch.manual_seed`` fixes
the masks; traced by ``torch.compile(fullgraph=True)`` the seed is drawn by the graph (no host
read: no ``_local_scalar_dense``), so calls of the compiled function draw new masks too, and the
kernels stay custom ops, one node forward and one backward.

The sites of one forward may share one seed (``DropoutSeeds``): one draw between them, each site's
mask its own.

Each case reads its mask off the output (the hashed dropout's and the swish's zeros) or off the
gradient of the input it drops out (the residual norm's branch: the sum's gradient through the
mask); the forward and the backward must then both equal the PyTorch ops with that one mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from src.kernels.dropout import dropout
from src.kernels.dropout.contract import DropoutSeeds
from src.kernels.residual_layer_norm import residual_layer_norm
from src.kernels.shared_group_layer_norm import (
    shared_group_layer_norm,
    shared_group_layer_norm_swish,
)
from src.models.delight_mt import DeLighTEncoderDecoder
from src.ops.dextra import DExTra
from tests.helpers import OpCounter, recording_backend, require_cpu_kernels

P = 0.4
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Case:
    """A dropout in a kernel: ``run(x)`` its output, ``masked(x, kept)`` the PyTorch ops with the
    mask ``kept``, ``mask(y, grad)`` the mask read off the output and x's gradient, the custom ops
    a traced graph must hold, and the device it runs on."""

    run: Callable[[Tensor], Tensor]
    masked: Callable[[Tensor, Tensor], Tensor]
    mask: Callable[[Tensor, Tensor], Tensor]
    ops: tuple[str, str]
    device: str


def _affine(width: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(3)
    weight = 1 + 0.5 * torch.randn(width, generator=gen)
    return weight.to(KERNEL_DEVICE), (0.5 * torch.randn(width, generator=gen)).to(KERNEL_DEVICE)


RESIDUAL = torch.randn(24, 96, generator=torch.Generator().manual_seed(4)).to(KERNEL_DEVICE)
NORM_WEIGHT, NORM_BIAS = _affine(96)
GROUP_WEIGHT, GROUP_BIAS = _affine(32)

CASES = {
    "hashed_dropout": Case(
        run=lambda x: dropout(x, P),
        masked=lambda x, kept: x * kept / (1 - P),
        mask=lambda y, grad: y != 0,
        ops=("lightnets.hashed_dropout.default", "lightnets.hashed_dropout_backward.default"),
        device="cpu",
    ),
    "residual_layer_norm": Case(
        run=lambda x: residual_layer_norm(RESIDUAL, x, NORM_WEIGHT, NORM_BIAS, p=P, impl="triton"),
        masked=lambda x, kept: F.layer_norm(
            RESIDUAL + x * kept / (1 - P), (96,), NORM_WEIGHT, NORM_BIAS, 1e-5
        ),
        mask=lambda y, grad: grad != 0,
        ops=(
            "lightnets.residual_layer_norm.default",
            "lightnets.residual_layer_norm_backward.default",
        ),
        device=KERNEL_DEVICE,
    ),
    "shared_group_layer_norm": Case(
        run=lambda x: shared_group_layer_norm_swish(
            x, 3, GROUP_WEIGHT, GROUP_BIAS, p=P, impl="triton"
        ),
        masked=lambda x, kept: (
            F.silu(shared_group_layer_norm(x, 3, GROUP_WEIGHT, GROUP_BIAS, 1e-5)) * kept / (1 - P)
        ),  # fmt: skip
        mask=lambda y, grad: y != 0,
        ops=(
            "lightnets.shared_group_layer_norm.default",
            "lightnets.shared_group_layer_norm_backward.default",
        ),
        device=KERNEL_DEVICE,
    ),
}


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    if request.param == "hashed_dropout":
        require_cpu_kernels()
    else:
        pytest.importorskip("triton")
    return CASES[request.param]


def _input(case: Case) -> Tensor:
    # no zeros of its own, so a zero gradient is a dropped element
    x = torch.rand(24, 96, generator=torch.Generator().manual_seed(5)) + 0.5
    return x.to(case.device).requires_grad_()


def _probe(y: Tensor) -> Tensor:
    return (torch.rand(y.shape, generator=torch.Generator().manual_seed(6)) + 0.5).to(y)


def _output_and_mask(
    case: Case, fn: Callable[[Tensor], Tensor], x: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(output, the gradient of x under the loss sum(output * probe), the mask)."""
    y = fn(x)
    (grad,) = torch.autograd.grad(y, x, _probe(y))
    return y, grad, case.mask(y, grad)


def _assert_backward_applies_the_forwards_mask(
    case: Case, x: Tensor, y: Tensor, grad: Tensor, kept: Tensor
) -> None:
    """The forward and the gradient equal the PyTorch ops' with the mask ``kept``; about 1 - p of
    the elements are kept (2,304 draws: 0.05 is 5 sigma)."""
    assert abs(kept.float().mean().item() - (1 - P)) < 0.05
    want = case.masked(x, kept)
    (want_grad,) = torch.autograd.grad(want, x, _probe(want))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-5)


def test_each_call_draws_a_mask_and_the_backward_applies_it(case: Case) -> None:
    torch.manual_seed(0)
    x = _input(case)
    y, grad, kept = _output_and_mask(case, case.run, x)
    _assert_backward_applies_the_forwards_mask(case, x, y, grad, kept)
    _, _, again = _output_and_mask(case, case.run, x)
    assert not torch.equal(kept, again)


def test_manual_seed_fixes_the_masks(case: Case) -> None:
    x = _input(case)
    torch.manual_seed(11)
    first = _output_and_mask(case, case.run, x)
    torch.manual_seed(11)
    second = _output_and_mask(case, case.run, x)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_a_compiled_step_draws_a_mask_per_call_from_the_graph(case: Case) -> None:
    torch._dynamo.reset()
    backend, graphs = recording_backend()
    compiled = torch.compile(case.run, backend=backend, fullgraph=True)
    x = _input(case)
    torch.manual_seed(0)
    y, grad, kept = _output_and_mask(case, compiled, x)
    _, _, again = _output_and_mask(case, compiled, x)
    torch._dynamo.reset()
    assert not torch.equal(kept, again)
    _assert_backward_applies_the_forwards_mask(case, x, y, grad, kept)
    # one graph each way: the seed drawn in it, the kernels as custom ops, nothing read on the host
    assert len(graphs["forward"]) == len(graphs["backward"]) == 1
    forward, backward = graphs["forward"][0], graphs["backward"][0]
    assert "aten.randint" in forward
    assert case.ops[0] in forward and case.ops[1] in backward
    for graph in (forward, backward):
        assert "_local_scalar_dense" not in graph and "target=item" not in graph
    # the graph draws the seed from the same generator as eager calls: the same masks
    torch.manual_seed(0)
    eager = _output_and_mask(case, case.run, x)
    for a, b in zip((y, grad, kept), eager, strict=True):
        assert torch.equal(a, b)


def _captured(case: Case, capture: str, x: Tensor) -> Callable[[Tensor], Tensor]:
    """``case.run`` replayed from CUDA graphs: ``torch.cuda.make_graphed_callables`` (forward and
    backward graphs) or ``torch.compile``'s ``cudagraphs`` backend."""
    if capture == "graphed_callable":
        return torch.cuda.make_graphed_callables(case.run, (x,))
    return torch.compile(case.run, backend="cudagraphs", fullgraph=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("capture", ["graphed_callable", "cudagraphs"])
@pytest.mark.parametrize("name", ["residual_layer_norm", "shared_group_layer_norm"])
def test_cuda_graph_replays_draw_new_masks(name: str, capture: str) -> None:
    """Replayed, the seed's draw is part of the graph (the CUDA generator's offset advances at each
    replay), so each replay drops other elements, and the backward replay applies its forward's
    mask. A replay's outputs live in the graph's buffers: each is copied before the next."""
    pytest.importorskip("triton")
    case = CASES[name]
    x = _input(case)
    torch.manual_seed(0)
    torch._dynamo.reset()
    replayed = _captured(case, capture, x)
    runs = []
    for _ in range(3):  # the cudagraphs backend records on its second call and replays after
        y, grad, kept = _output_and_mask(case, replayed, x)
        runs.append((y.clone(), grad.clone(), kept.clone()))
    torch._dynamo.reset()
    for y, grad, kept in runs:
        _assert_backward_applies_the_forwards_mask(case, x, y, grad, kept)
    assert not torch.equal(runs[1][2], runs[2][2])


# the kernels' cases as sites of one forward
SITES = {
    "residual_layer_norm": lambda x, seeds: residual_layer_norm(
        RESIDUAL, x, NORM_WEIGHT, NORM_BIAS, p=P, seeds=seeds, impl="triton"
    ),
    "shared_group_layer_norm": lambda x, seeds: shared_group_layer_norm_swish(
        x, 3, GROUP_WEIGHT, GROUP_BIAS, p=P, seeds=seeds, impl="triton"
    ),
}


def _two_sites(name: str) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    """A forward with two dropout sites of kind ``name`` on one input, sharing one seed."""

    def run(x: Tensor) -> tuple[Tensor, Tensor]:
        seeds = DropoutSeeds()
        return SITES[name](x, seeds), SITES[name](x, seeds)

    return run


def _sites_and_masks(
    case: Case, run: Callable[[Tensor], tuple[Tensor, ...]], x: Tensor
) -> list[tuple[Tensor, Tensor, Tensor]]:
    """(output, x's gradient under sum(output * probe), mask) of each output of ``run(x)``."""
    found = []
    # a compiled forward is one autograd node for all its outputs: kept for each output's grad
    for y in run(x):
        (grad,) = torch.autograd.grad(y, x, _probe(y), retain_graph=True)
        found.append((y, grad, case.mask(y, grad)))
    return found


@pytest.mark.parametrize("name", list(SITES))
def test_sites_sharing_a_seed_draw_it_once_and_their_own_masks(name: str) -> None:
    """Two sites handed one :class:`DropoutSeeds` draw one seed between them (one launch, not
    one a site); each draws its own mask and each backward applies its own forward's; the next
    forward draws new masks, ``torch.manual_seed`` fixes them, and site 0 draws what a site with
    a seed of its own draws."""
    pytest.importorskip("triton")
    case, run, x = CASES[name], _two_sites(name), _input(CASES[name])
    torch.manual_seed(0)
    with OpCounter("randint") as draws:
        sites = _sites_and_masks(case, run, x)
    assert draws.count == 1
    (_, _, kept0), (_, _, kept1) = sites
    assert not torch.equal(kept0, kept1)
    for y, grad, kept in sites:
        _assert_backward_applies_the_forwards_mask(case, x, y, grad, kept)
    assert not torch.equal(_sites_and_masks(case, run, x)[0][2], kept0)
    torch.manual_seed(0)
    for a, b in zip(sites, _sites_and_masks(case, run, x), strict=True):
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    torch.manual_seed(0)
    alone = _sites_and_masks(case, lambda x: (SITES[name](x, None),), x)
    assert torch.equal(alone[0][2], kept0)


@pytest.mark.parametrize("name", list(SITES))
def test_a_compiled_forward_draws_one_seed_for_its_sites(name: str) -> None:
    """Traced with ``fullgraph=True``, the shared seed is one draw of the forward graph and the
    site indices constants of it: the same masks as eager under the same ``torch.manual_seed``,
    new ones at the next call."""
    pytest.importorskip("triton")
    case, run, x = CASES[name], _two_sites(name), _input(CASES[name])
    torch._dynamo.reset()
    backend, graphs = recording_backend()
    compiled = torch.compile(run, backend=backend, fullgraph=True)
    torch.manual_seed(0)
    sites = _sites_and_masks(case, compiled, x)
    again = _sites_and_masks(case, compiled, x)
    torch._dynamo.reset()
    assert len(graphs["forward"]) == 1
    assert graphs["forward"][0].count("aten.randint") == 1
    assert not torch.equal(sites[0][2], again[0][2])
    torch.manual_seed(0)
    for a, b in zip(sites, _sites_and_masks(case, run, x), strict=True):
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def test_dextra_draws_one_seed_a_call() -> None:
    """DExTra's N + 2 norms on the kernel drop out with one seed drawn per call between them."""
    pytest.importorskip("triton")
    unit = DExTra(32, 16, 16, width_multiplier=2.0, depth=4, max_groups=4, dropout=0.3,
                  impl="triton").to(KERNEL_DEVICE)  # fmt: skip
    x = torch.randn(6, 32, device=KERNEL_DEVICE)
    with OpCounter("randint") as draws:
        unit(x).sum().backward()
    assert draws.count == 1


def test_a_delight_translation_step_draws_one_seed_per_side() -> None:
    """DeLighT MT on the kernels: the encoder's dropouts (its embedding's DExTra and every
    block's) share one seed, the decoder's another: two draws a training step, not one a site."""
    pytest.importorskip("triton")
    torch.manual_seed(0)
    net = DeLighTEncoderDecoder(40, 40, d_model=32, n_min=2, n_max=3, width_multiplier=1.0,
                                dextra_dropout=0.1).to(KERNEL_DEVICE)  # fmt: skip
    for module in net.modules():
        if hasattr(module, "impl"):
            module.impl = "triton"
    net.train()
    src = torch.randint(4, 40, (2, 5), device=KERNEL_DEVICE)
    prev = torch.randint(4, 40, (2, 6), device=KERNEL_DEVICE)
    with OpCounter("randint") as draws:
        net(src, None, prev).float().sum().backward()
    assert draws.count == 2
