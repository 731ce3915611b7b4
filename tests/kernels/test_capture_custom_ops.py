"""The fused kernels as custom ops with autograd rules (:func:`src.kernels.custom_ops.autograd_op`):
``torch.compile(fullgraph=True)`` keeps each one as one node of the forward graph and its backward
kernel as one node of the backward graph, and the compiled forward and backward equal eager's
(the same kernels: bit for bit, AOTAutograd adding no arithmetic of its own around them).

C++ kernels run where they are built; Triton kernels on CUDA, else in Triton's interpreter on CPU
tensors (``impl="triton"``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from src.kernels.pru_recurrence import pru_recurrence
from src.kernels.relative_softmax import relative_softmax
from src.kernels.residual_layer_norm import residual_layer_norm
from src.kernels.shared_group_layer_norm import shared_group_layer_norm_swish
from src.ops.per_group_layer_norm import PerGroupLayerNorm
from tests.helpers import recording_backend, require_cpu_kernels

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Case:
    """``build(device)`` gives the function of the leaves it differentiates and those leaves; the
    forward and backward op the graphs must hold; the back-end it needs."""

    build: Callable[[str], tuple[Callable[..., Tensor], list[Tensor]]]
    ops: tuple[str, str]
    backend: str  # "cpu" (the C++ kernels) or "triton"


def _leaf(*shape: int, device: str, scale: float = 1.0, shift: float = 0.0) -> Tensor:
    return (torch.randn(*shape) * scale + shift).to(device).requires_grad_()


def _per_group_norm(impl: str) -> Callable[[str], tuple[Callable[..., Tensor], list[Tensor]]]:
    def build(device: str) -> tuple[Callable[..., Tensor], list[Tensor]]:
        norm = PerGroupLayerNorm(64, 4, impl=impl).to(device)
        with torch.no_grad():
            norm.weight.normal_(1, 0.5)
            norm.bias.normal_(0, 0.5)
        x = _leaf(3, 5, 64, device=device, scale=3, shift=1)
        return lambda x, weight, bias: norm(x), [x, norm.weight, norm.bias]

    return build


def _residual_norm(impl: str) -> Callable[[str], tuple[Callable[..., Tensor], list[Tensor]]]:
    def build(device: str) -> tuple[Callable[..., Tensor], list[Tensor]]:
        leaves = [
            _leaf(3, 5, 48, device=device), _leaf(3, 5, 48, device=device),
            _leaf(48, device=device, scale=0.5, shift=1), _leaf(48, device=device, scale=0.5),
        ]  # fmt: skip
        return lambda r, x, w, b: residual_layer_norm(r, x, w, b, impl=impl), leaves

    return build


def _shared_group_norm(impl: str) -> Callable[[str], tuple[Callable[..., Tensor], list[Tensor]]]:
    def build(device: str) -> tuple[Callable[..., Tensor], list[Tensor]]:
        leaves = [
            _leaf(7, 96, device=device, scale=2),
            _leaf(32, device=device, scale=0.5, shift=1), _leaf(32, device=device, scale=0.5),
        ]  # fmt: skip
        return lambda x, w, b: shared_group_layer_norm_swish(x, 3, w, b, impl=impl), leaves

    return build


def _relative_softmax(device: str) -> tuple[Callable[..., Tensor], list[Tensor]]:
    # (B, H, T, K) scores of 3 queries against 5 keys (2 of memory), causal
    mask = torch.ones(3, 5, dtype=torch.bool).triu(3).to(device)
    leaves = [_leaf(2, 2, 3, 5, device=device), _leaf(2, 2, 3, 5, device=device)]
    return lambda c, p: relative_softmax(c, p, mask, 0.5, impl="triton"), leaves


def _pru_recurrence(device: str) -> tuple[Callable[..., Tensor], list[Tensor]]:
    # the pyramid's two levels (12 and 4 of 16 units), read in place by the kernel
    leaves = [
        _leaf(5, 3, 4, 16, device=device), _leaf(2, 8, 32, device=device, scale=0.3),
        _leaf(2, 32, device=device, scale=0.3), _leaf(3, 16, device=device),
        _leaf(3, 16, device=device),
    ]  # fmt: skip

    def run(inputs: Tensor, weight: Tensor, bias: Tensor, h0: Tensor, c0: Tensor) -> Tensor:
        output, h_last, c_last = pru_recurrence(inputs.split([12, 4], -1), weight, bias, h0, c0)
        return output + (h_last + c_last)  # (T, B, M): every output's gradient

    return run, leaves


CASES = {
    "per_group_layer_norm_cpu": Case(
        _per_group_norm("auto"),
        (
            "lightnets.per_group_layer_norm_cpu.default",
            "lightnets.per_group_layer_norm_cpu_backward.default",
        ),
        "cpu",
    ),  # fmt: skip
    "pru_recurrence_cpu": Case(
        _pru_recurrence,
        ("lightnets.pru_recurrence_cpu.default", "lightnets.pru_recurrence_cpu_backward.default"),
        "cpu",
    ),
    "per_group_layer_norm_triton": Case(
        _per_group_norm("triton"),
        (
            "lightnets.per_group_layer_norm.default",
            "lightnets.per_group_layer_norm_backward.default",
        ),
        "triton",
    ),  # fmt: skip
    "residual_layer_norm_triton": Case(
        _residual_norm("triton"),
        ("lightnets.residual_layer_norm.default", "lightnets.residual_layer_norm_backward.default"),
        "triton",
    ),  # fmt: skip
    "relative_softmax_triton": Case(
        _relative_softmax,
        (
            "lightnets.relative_softmax_triton_forward.default",
            "lightnets.relative_softmax_triton_backward.default",
        ),
        "triton",
    ),  # fmt: skip
    "shared_group_layer_norm_triton": Case(
        _shared_group_norm("triton"),
        (
            "lightnets.shared_group_layer_norm.default",
            "lightnets.shared_group_layer_norm_backward.default",
        ),
        "triton",
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_step_keeps_the_kernels_and_equals_eager(name: str) -> None:
    case = CASES[name]
    if case.backend == "cpu":
        require_cpu_kernels()
        device = "cpu"
    else:
        pytest.importorskip("triton")
        device = KERNEL_DEVICE
    torch.manual_seed(0)
    fn, leaves = case.build(device)

    def step(f: Callable[..., Tensor]) -> list[Tensor]:
        out = f(*leaves)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        return [out, *torch.autograd.grad(out, leaves, probe)]

    torch._dynamo.reset()
    backend, graphs = recording_backend()
    got = step(torch.compile(fn, backend=backend, fullgraph=True))
    torch._dynamo.reset()
    want = step(fn)
    assert len(graphs["forward"]) == len(graphs["backward"]) == 1
    forward_op, backward_op = case.ops
    assert graphs["forward"][0].count(forward_op) == 1
    assert graphs["backward"][0].count(backward_op) == 1
    # the kernels' work is in the ops: no PyTorch reference traced beside them
    for reference_op in ("native_layer_norm", "aten.mean", "linalg_vector_norm", "aten._softmax"):
        assert reference_op not in graphs["forward"][0]
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def _module_case(
    module: torch.nn.Module, *shape: int, channels_last: bool = False
) -> tuple[Callable[..., Tensor], list[Tensor]]:
    x = torch.randn(*shape)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return lambda x, *_: module(x), [x.requires_grad_(), *module.parameters()]


def _norm_prelu() -> tuple[Callable[..., Tensor], list[Tensor]]:
    from src.kernels.batch_norm import BatchNorm2d
    from src.kernels.batch_norm_prelu import FusingSequential
    from src.kernels.prelu import PReLU

    return _module_case(FusingSequential(BatchNorm2d(8), PReLU(8)), 2, 8, 5, 6, channels_last=True)


def _dense() -> tuple[Callable[..., Tensor], list[Tensor]]:
    from src.kernels.linear import linear

    layer = torch.nn.Linear(24, 16)
    return lambda x, *_: linear([x], layer), [_leaf(5, 24, device="cpu"), *layer.parameters()]


def _dice() -> tuple[Callable[..., Tensor], list[Tensor]]:
    from src.ops.dice import DiCE

    return _module_case(DiCE(4, 4, 5, 6, impl="auto"), 2, 4, 5, 6)


def _eesp() -> tuple[Callable[..., Tensor], list[Tensor]]:
    from src.ops.eesp import EESP

    return _module_case(EESP(16, 16, impl="auto"), 2, 16, 5, 6)


def _glt() -> tuple[Callable[..., Tensor], list[Tensor]]:
    from src.ops.group_linear import GroupLinear

    return _module_case(GroupLinear(24, 16, 4, impl="auto"), 5, 24)


def _dim_conv() -> tuple[Callable[..., Tensor], list[Tensor]]:
    from src.ops.dim_conv import DimConv

    return _module_case(DimConv(4, 5, 6, impl="auto"), 2, 4, 5, 6)


KERNEL_CHOSEN = {"auto_path": "triton"}
# op with impl="auto": (its module, the stand-ins there for the measured choice, which chose the
# kernel, and for anything else that would keep it off a CPU tensor; a builder; the forward op)
AUTO_CASES = {
    "residual_layer_norm": ("src.kernels.residual_layer_norm", KERNEL_CHOSEN,
                            lambda: _residual_norm("auto")("cpu"),
                            "lightnets.residual_layer_norm.default"),
    "shared_group_layer_norm": ("src.kernels.shared_group_layer_norm", KERNEL_CHOSEN,
                                lambda: _shared_group_norm("auto")("cpu"),
                                "lightnets.shared_group_layer_norm.default"),
    "per_group_layer_norm": ("src.kernels.per_group_layer_norm",
                             {**KERNEL_CHOSEN, "cpu_kernels_loaded": lambda: False},
                             lambda: _per_group_norm("auto")("cpu"),
                             "lightnets.per_group_layer_norm.default"),
    "group_linear": ("src.kernels.group_linear", KERNEL_CHOSEN, _glt,
                     "lightnets.glt_triton.default"),
    "linear": ("src.kernels.linear", {"linear_path": "triton"}, _dense,
               "lightnets.glt_triton.default"),
    "dim_conv": ("src.kernels.dim_conv", KERNEL_CHOSEN, _dim_conv,
                 "lightnets.dim_conv_triton.default"),
    "batch_norm_prelu": ("src.kernels.batch_norm_prelu", KERNEL_CHOSEN, _norm_prelu,
                         "lightnets.batch_norm_prelu_forward_triton.default"),
    "dice_local_fusion": ("src.kernels.dice", {"local_fusion_path": "fused"}, _dice,
                          "lightnets.local_fusion_forward.default"),
    "eesp_pyramid": ("src.kernels.eesp", {"pyramid_path": "fused"}, _eesp,
                     "lightnets.eesp_pyramid_forward.default"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(AUTO_CASES))
def test_auto_traces_the_kernel_it_chose(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``impl="auto"`` traced by ``torch.compile`` takes the path its choice names (here the
    kernel; untimed while tracing), where it once took the PyTorch path whenever it was traced.
    The kernels run on CPU tensors in Triton's interpreter: ``use_triton`` stands in for CUDA."""
    pytest.importorskip("triton")
    module_name, choices, build, forward_op = AUTO_CASES[name]
    module = importlib.import_module(module_name)
    monkeypatch.setattr(module, "use_triton", lambda impl, x: impl != "reference")
    for function, choice in choices.items():
        stand_in = choice if callable(choice) else (lambda *args, _c=choice, **kwargs: _c)
        monkeypatch.setattr(module, function, stand_in)
    torch.manual_seed(0)
    fn, leaves = build()
    torch._dynamo.reset()
    backend, graphs = recording_backend()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*leaves)
    torch.autograd.grad(out, [t for t in leaves if t.requires_grad], torch.ones_like(out))
    torch._dynamo.reset()
    assert forward_op in graphs["forward"][0]
