"""Test helpers: networks that drive the training loop into specific situations, and the choice of
the CPU inference path (fused kernels or eager calls)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor, nn

import src.ops.dice
import src.ops.eesp
from src.ops.cpu import cpu_kernels
from src.ops.dice import DiCE
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
        monkeypatch.setattr(DiCE, "_folded_forward", _forbid_in_inference(DiCE._folded_forward))
        monkeypatch.setattr(EESP, "_pyramid", _forbid_in_inference(EESP._pyramid))
    elif path == "eager":
        monkeypatch.setattr(src.ops.dice, "cpu_kernels", lambda: False)
        monkeypatch.setattr(src.ops.eesp, "cpu_kernels", lambda: False)
    else:
        raise ValueError(f"path must be 'kernel' or 'eager', got {path!r}")


def path_timer(times: dict[str, float], outputs: dict[str, Tensor]) -> Callable:
    """A timer for the measured kernel choices (``src.ops.triton.fastest``): each candidate is
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
    """A fused unit's arguments (``_local_fusion_args`` / ``_pyramid_args``) with copies of its BN
    running statistics, so that two paths given them update their own."""
    return {**args, **{k: args[k].clone() for k in ("running_mean", "running_var")}}
