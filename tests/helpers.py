"""Test helpers: networks that drive the training loop into specific situations, the choice of
the CPU inference path (fused kernels or eager calls), and faulty operands for the fused CPU
kernels."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

import src.kernels.dice
import src.kernels.eesp
from src.kernels.cpu import cpu_kernels
from src.ops.eesp import EESP


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """Sets TF32 for PyTorch's CUDA matmuls and cuDNN's convolutions, and restores both on exit.

    ``monkeypatch.setattr`` cannot do this: ``torch.backends.cuda.matmul`` serves ``allow_tf32``
    from ``__getattr__``, so pytest >= 9.2 records no old value and fails to restore it.
    """
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class DivergingNet(nn.Module):
    """A linear classifier whose logits turn NaN from the ``diverge_at``-th training forward on.

    Shape:
        (B, C, H, W) -> (B, num_classes)
    """

    def __init__(self, num_classes: int, in_chans: int, image_size: int, diverge_at: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_chans * image_size * image_size, num_classes)
        self.diverge_at = diverge_at
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        logits = self.linear(x.flatten(1))
        if self.training:
            self.calls += 1
            if self.calls >= self.diverge_at:
                logits = logits * torch.tensor(float("nan"))
        return logits


def require_cpu_kernels() -> None:
    """Skip without a C++ compiler; with one, the fused CPU kernels must build."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler: the fused CPU kernels cannot be built here")
    assert cpu_kernels(), "a C++ compiler is present but the fused CPU kernels did not build"


def _forbid_in_inference(method: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def forbidden(self: nn.Module, x: Tensor) -> Tensor:
        if not torch.is_grad_enabled():
            raise AssertionError(
                f"{type(self).__name__}.{method.__name__} ran in CPU inference, where the fused "
                "kernel should have"
            )
        return method(self, x)

    return forbidden


def use_inference_path(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make CPU inference run DiCE units (at their build size) and EESP pyramids through ``path``:
    "kernel" (the fused C++ kernels, which must then be the path taken) or "eager" (the folded
    path in PyTorch calls)."""
    if path == "kernel":
        require_cpu_kernels()
        folded_forward = _forbid_in_inference(src.kernels.dice.folded_forward)
        monkeypatch.setattr(src.kernels.dice, "folded_forward", folded_forward)
        monkeypatch.setattr(EESP, "_pyramid", _forbid_in_inference(EESP._pyramid))
    elif path == "eager":
        monkeypatch.setattr(src.kernels.dice, "cpu_kernels_loaded", lambda: False)
        monkeypatch.setattr(src.kernels.eesp, "cpu_kernels_loaded", lambda: False)
    else:
        raise ValueError(f"path must be 'kernel' or 'eager', got {path!r}")


def path_timer(times: dict[str, float], outputs: dict[str, Tensor]) -> Callable:
    """A timer for the measured kernel choices (:func:`src.kernels.choose`): each candidate is
    ``functools.partial(run, path)``; its output is recorded in ``outputs[path]`` and its time is
    ``times[path]`` (read when called, so a test can change it between choices)."""

    def timer(fn: Callable[[], Tensor]) -> float:
        path = fn.args[0]
        outputs[path] = fn()
        return times[path]

    return timer


def randomise_norms(module: nn.Module) -> nn.Module:
    """Non-trivial BN affine parameters, running statistics and PReLU slopes (the defaults are 1,
    0, 0, 1 and 0.25), drawn from a fixed generator so that two modules built alike match."""
    gen = torch.Generator().manual_seed(3)
    for child in module.modules():
        if isinstance(child, nn.BatchNorm2d):
            n = child.num_features
            child.weight.data = torch.rand(n, generator=gen) + 0.5
            child.bias.data = torch.randn(n, generator=gen) * 0.3
            child.running_mean = torch.randn(n, generator=gen) * 0.2
            child.running_var = torch.rand(n, generator=gen) + 0.5
        if isinstance(child, nn.PReLU):
            child.weight.data = torch.rand(child.weight.shape, generator=gen) * 0.5
    return module


# a dtype's spacing relative to a value's binade top (2^-23 float32, 2^-7 bfloat16, 2^-10 float16
# at the top of [1, 2)): the unit of the ulp bounds below
ULP = {torch.float32: 2.0**-21, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def assert_within_ulps(actual: Tensor, expected: Tensor, ulps: float, dtype: torch.dtype) -> None:
    """Every element of ``actual`` within ``ulps`` x ``ULP[dtype]`` of the largest magnitude in
    ``expected``."""
    expected = expected.double()
    bound = ulps * ULP[dtype] * expected.abs().max().item()
    error = (actual.double() - expected).abs().max().item()
    assert error <= bound, f"max error {error:.3g} over {bound:.3g}"


def saved_bytes(module: nn.Module, x: Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of ``module(x)``."""
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(storages.values())


def own_running_statistics(args: dict) -> dict:
    """A fused unit's arguments (``local_fusion_args`` / ``pyramid_args``) with copies of its BN
    running statistics, so that two paths given them update their own."""
    return {**args, **{k: args[k].clone() for k in ("running_mean", "running_var")}}


# faults of an operand's sizes (every dimension in turn for shrunk and grown), then of its kind
SHAPE_FAULTS = ("shrunk", "grown", "rank", "reshaped", "empty")
KIND_FAULTS = {
    "float64": "must be float32",
    "bfloat16": "must be float32",
    "non_contiguous": "must be contiguous",
    "sparse": "must be a dense",
    "meta": "must be on the CPU",
    "negated": "must not be a negated view",
    "requires_grad": "requires grad",
}


def faulty_copies(t: torch.Tensor, fault: str, fixed: tuple[int, ...]) -> list[torch.Tensor]:
    """Copies of the valid operand ``t``, each with ``fault``; ``fixed`` are the dimensions whose
    sizes the other operands fix (the kernel takes any size in the others)."""
    shape = list(t.shape)
    if fault == "shrunk":  # the operand that read past its end: one size short, in each dimension
        return [t.narrow(d, 0, shape[d] - 1).contiguous() for d in fixed if shape[d] > 1]
    if fault == "grown":
        return [torch.randn(*shape[:d], shape[d] + 1, *shape[d + 1 :]) for d in fixed]
    if fault == "rank":  # one dimension more, or one fewer (a vector: one more another way)
        return [t[None], t.flatten() if t.dim() > 1 else t[:, None]]
    if fault == "reshaped":  # as many elements and dimensions: the sizes rotated by one place ...
        other = shape[-1:] + shape[:-1]
        if other == shape:  # ... or, where that changes nothing, the last folded into the first
            other = [shape[0] * shape[-1], *shape[1:-1], 1]
        assert any(other[d] != shape[d] for d in fixed), f"no fixed size of {shape} changes"
        return [t.reshape(other)]
    if fault == "empty":
        return [t[..., :0]]
    if fault == "float64":
        return [t.double()]
    if fault == "bfloat16":
        return [t.bfloat16()]
    if fault == "non_contiguous":  # the same values, every other element of a wider tensor
        wide = torch.zeros(*shape[:-1], 2 * shape[-1])
        view = wide[..., ::2].copy_(t)
        assert not view.is_contiguous()
        return [view]
    if fault == "sparse":
        return [t.to_sparse()]
    if fault == "meta":
        return [t.to("meta")]
    if fault == "negated":  # the same values, stored negated behind a lazy negation
        return [torch._neg_view(-t)]
    if fault == "requires_grad":
        return [t.detach().clone().requires_grad_()]
    raise ValueError(f"unknown fault {fault!r}")


def assert_rejected(
    kernel_name: str, args: list, name: str, position: int, fault: str, fixed: tuple[int, ...]
) -> None:
    """Each faulty copy of operand ``name`` makes the kernel raise a RuntimeError naming it, with
    the bad shape (shape faults) or what was expected (kind faults)."""
    kernel = getattr(torch.ops.lightnets_cpu, kernel_name)
    with torch.no_grad():
        kernel(*args)  # the valid call runs
    for bad in faulty_copies(args[position], fault, fixed):
        call = list(args)
        call[position] = bad
        with torch.set_grad_enabled(fault == "requires_grad"), pytest.raises(RuntimeError) as error:
            kernel(*call)
        message = str(error.value)
        assert message.startswith(f"{kernel_name}: "), message
        if fault in SHAPE_FAULTS:
            # the operand and its shape, whichever operand's sizes then disagree with it
            assert re.search(rf"\b{name}\b", message), message
            assert str(list(bad.shape)) in message, message
        else:
            assert f"{kernel_name}: {name} {KIND_FAULTS[fault]}" in message, message


def recording_backend() -> tuple[Callable, dict[str, list[str]]]:
    """A ``torch.compile`` backend that runs AOT autograd's graphs as they are and records them:
    (backend, {"forward": [...], "backward": [...]}), each graph as its printed FX code."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: dict[str, list[str]] = {"forward": [], "backward": []}

    def recorder(kind: str) -> Callable:
        def compile_graph(gm: torch.fx.GraphModule, _: object) -> Callable:
            graphs[kind].append(str(gm.graph))
            return make_boxed_func(gm)

        return compile_graph

    return aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward")), graphs


def max_relative_error(got: Tensor, want: Tensor) -> float:
    """max |got - want| / max |want|, in float64 (``want`` the float64 oracle)."""
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def autograd_node_names(y: Tensor) -> list[str]:
    """The class names of the nodes of the autograd graph behind ``y``, each node once."""
    names, seen, stack = [], set(), [y.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(parent for parent, _ in node.next_functions)
    return names


class OpCounter(TorchDispatchMode):
    """Counts the calls of one ATen operator (by name, e.g. ``randint``) dispatched while it is
    active."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.count += func.overloadpacket.__name__ == self.name
        return func(*args, **(kwargs or {}))


class CastCounter(OpCounter):
    """Counts the dtype casts (``_to_copy``) dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__("_to_copy")
