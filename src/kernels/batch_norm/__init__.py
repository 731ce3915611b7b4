"""BatchNorm (Ioffe & Szegedy, 2015) with a two-pass training backward on the CPU for
channels-last inputs: the norm of every CBR unit of DiCENet, ESPNetv2 and their detection and
segmentation heads, which train channels-last.

The map, the running statistics and the forward are ``nn.BatchNorm2d``'s (ATen's
``native_batch_norm``). Only the CPU training backward of a channels-last input differs: ATen's
CPU kernel is 2.5-6x slower there than for a contiguous input (2.1-2.9 vs 1.2 ms for a
(4, 116, 56, 56) float32 gradient on 2 cores). ``lightnets_cpu::batch_norm_backward``
(``src/kernels/batch_norm/batch_norm.cpp``) reads x as rows of channels, sums both per-channel
reductions in one pass and writes the input gradient in a second, with the sums in a fixed order
(independent of the thread count). The gradients equal ATen's up to float32 summation order. For
contiguous inputs ATen's backward was as fast or faster, so they keep it; for channels-last ones the
faster of the two is measured per shape on first use (:func:`_path`).

ATen's kernels also run on CUDA, in eval mode and without autograd, without an affine transform,
for float16 or float64 inputs, a 16-bit weight, and where the CPU kernels cannot be built.
``torch.compile`` traces the same Function, the kernel an opaque node of the backward graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from src.kernels import ATEN, OURS, candidate_steps, choose, declare, opaque_op
from src.kernels.batch_norm import contract as contract
from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.environment import cpu_path_mode
from src.kernels.fused_norm import batch_norm_factor
from src.kernels.layout import channel_rows, from_channel_rows, is_channels_last

KERNEL_DTYPES = (torch.float32, torch.bfloat16)


class BatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` (same parameters, buffers, state-dict keys and statistics) whose CPU
    training backward for a channels-last input is :class:`BatchNormCpuFunction`'s.

    Shape:
        (B, C, H, W) -> (B, C, H, W)
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self._kernel_applies(x):
            return super().forward(x)
        self._check_input_dim(x)
        momentum = batch_norm_factor(self, advance=True)  # counts the batch, as nn.BatchNorm2d
        return BatchNormCpuFunction.apply(
            x, self.weight, self.bias, self.running_mean, self.running_var, momentum, self.eps
        )

    # (x's shape, strides, dtype, requires_grad, CPU path mode) of the last call, and whether the
    # kernel applied: the tests after the cheap ones cost ~4 us a call, 5% of a 464 x 7² step
    _last: tuple[tuple, bool] | None = None

    def _kernel_applies(self, x: Tensor) -> bool:
        if not (
            self.training and torch.is_grad_enabled() and x.is_cpu and x.dtype in KERNEL_DTYPES
        ):
            return False
        if torch.compiler.is_compiling():
            return self._kernel_takes(x)
        signature = (x.shape, x.stride(), x.dtype, x.requires_grad, cpu_path_mode())
        last = self._last
        if last is None or last[0] != signature:
            last = self._last = (signature, self._kernel_takes(x))
        return last[1]

    def _kernel_takes(self, x: Tensor) -> bool:
        weight, bias = self.weight, self.bias
        return (
            weight is not None
            and bias is not None
            and weight.dtype == torch.float32
            and is_channels_last(x)
            and x.numel() > x.shape[1]  # more than one value per channel
            and cpu_kernels_loaded()
            and _path(x, weight, bias, self.eps) == OURS
        )

    def _apply(self, fn, *args, **kwargs):  # .to(), .double(), ...: the parameters change
        self._last = None
        return super()._apply(fn, *args, **kwargs)


CPU_CHOICE = declare("batch_norm", (OURS, ATEN), device="cpu")


def _path(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> str:
    """The kernel's backward or ATen's for a channels-last training call, measured per shape on
    this machine (:func:`~src.kernels.choose`): the kernel's two passes split the rows into
    fixed blocks, which pays on large maps (1.3x at 24 x 112²) and not on the last stage's
    (0.84-0.87x at 464 x 7², batch 8, on an AMD EPYC). Timed without running statistics, which
    the candidates must not update."""
    key = (x.shape, x.dtype, x.requires_grad)

    def run(path: str, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        if path == OURS:
            return BatchNormCpuFunction.apply(x, weight, bias, None, None, 0.0, eps)
        return F.batch_norm(x, None, None, weight, bias, True, 0.0, eps)

    def candidates() -> dict:
        return candidate_steps(run, (OURS, ATEN), x, weight, bias)

    return choose(CPU_CHOICE, key, candidates, default=OURS, reference=ATEN, device="cpu")


@opaque_op("lightnets::batch_norm_backward", contract.BACKWARD_SCHEMA, contract.backward_fake)
def batch_norm_backward(
    grad_y: Tensor, x: Tensor, weight: Tensor, save_mean: Tensor, save_invstd: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``lightnets_cpu::batch_norm_backward`` on (B H W, C) views of a channels-last output
    gradient and x; opaque to ``torch.compile``.

    Shape:
        grad_y, x (R, C), weight and the statistics (C,) -> ((R, C), (C,), (C,))
    """
    grad_x, grad_weight, grad_bias = torch.ops.lightnets_cpu.batch_norm_backward(
        grad_y, x, weight, save_mean, save_invstd
    )
    return grad_x, grad_weight, grad_bias


class BatchNormCpuFunction(torch.autograd.Function):
    """Training-mode BatchNorm: ATen's ``native_batch_norm`` forward (which updates the running
    statistics), the backward by ``lightnets_cpu::batch_norm_backward``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight: Tensor,
        bias: Tensor,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        momentum: float,
        eps: float,
    ) -> Tensor:
        y, save_mean, save_invstd = torch.native_batch_norm(
            x, weight, bias, running_mean, running_var, True, momentum, eps
        )
        ctx.save_for_backward(x, weight, save_mean, save_invstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight, save_mean, save_invstd = ctx.saved_tensors
        # the gradient copied to x's layout only if autograd's differs
        grad_y = grad_y.contiguous(memory_format=torch.channels_last)
        grad_x, grad_w, grad_b = batch_norm_backward(
            channel_rows(grad_y), channel_rows(x), weight, save_mean, save_invstd
        )
        grad_x = from_channel_rows(grad_x, x.shape)  # channels-last as x
        wanted = ctx.needs_input_grad
        return (
            grad_x if wanted[0] else None,
            grad_w if wanted[1] else None,
            grad_b if wanted[2] else None,
            None,
            None,
            None,
            None,
        )
