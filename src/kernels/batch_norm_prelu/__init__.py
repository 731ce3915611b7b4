"""BatchNorm followed by PReLU in one op for channels-last training: the "BN + PReLU" of every
CBR unit of DiCENet and ESPNetv2.

The map is ``act(norm(x))`` for a :class:`src.kernels.batch_norm.BatchNorm2d` ``norm`` and a
per-channel :class:`src.kernels.prelu.PReLU` ``act``, with the same running statistics (momentum,
cumulative average, ``num_batches_tracked``). Unfused, BN writes its output z, PReLU reads z and
writes y, and autograd keeps x and z; the backward runs BN's two passes after PReLU's one.
``lightnets_cpu::batch_norm_prelu_forward`` (``src/kernels/batch_norm_prelu/batch_norm_prelu.cpp``)
reads x twice (the statistics, then y) and keeps only x; the backward recomputes z and takes two
passes. One autograd node replaces two, which also halves the per-call cost of the small layers.
With a ``residual`` r the map is ``act(norm(x) + r)``, an EESP unit's output (ESPNetv2), r's
gradient PReLU's input gradient: the addition costs no pass of its own either way. The outputs equal
the unfused ones to float32 rounding (the statistics are summed in another order); in bfloat16 z is
not rounded to bfloat16 between the two, and under autocast the slope is not either.

On CUDA the same two ops are Triton kernels (:mod:`src.kernels.batch_norm_prelu.triton_kernel`,
float32, float16 or bfloat16 input), taken where ``impl="auto"`` timed them faster than cuDNN's BN
and ATen's PReLU for the shape (:func:`auto_path`). The fused op applies in training with autograd,
to a channels-last input, an ``nn.BatchNorm2d`` (or ours) with float32 affine parameters, and a
per-channel float32 slope; everywhere else (eval, no autograd, NCHW, a BatchNorm subclass with a
forward of its own, another dtype under autocast) the two modules run as they are. ``torch.compile``
traces the Function with the kernels as opaque nodes: the C++ ones on the CPU, on CUDA the Triton
ones where ``impl="auto"`` chose them (untimed while tracing: the eager steps' choice or the
kernels) or ``impl="triton"``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from src.kernels import (
    Timer,
    autocast_off,
    check_impl,
    choose,
    declare,
    opaque_op,
    size_bucket,
    use_triton,
)
from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import contract as contract
from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.fused_norm import batch_norm_factor
from src.kernels.layout import channel_rows, from_channel_rows, is_channels_last

CPU_DTYPES = (torch.float32, torch.bfloat16)
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def batch_norm_prelu(
    x: Tensor,
    norm: nn.BatchNorm2d,
    act: nn.PReLU,
    impl: str = "auto",
    *,
    residual: Tensor | None = None,
) -> Tensor:
    """``act(norm(x))``, or ``act(norm(x) + residual)``, in one fused op where it applies (module
    docstring).

    ``impl``: ``"auto"`` takes the C++ kernels on the CPU and, on CUDA, the Triton kernels where
    they timed faster than the two modules for this shape and dtype (:func:`auto_path`);
    ``"triton"`` the Triton kernels (on CPU tensors in Triton's interpreter); ``"reference"`` the
    two modules.

    Shape:
        x (B, C, H, W), residual (B, C, H, W) or None -> (B, C, H, W)
    """
    path = _fused_path(x, norm, act, impl, residual)
    if path is None:
        return act(norm(x)) if residual is None else act(norm(x) + residual)
    norm._check_input_dim(x)
    momentum = batch_norm_factor(norm, advance=True)  # counts the batch, as nn.BatchNorm2d
    y, mean, var = BatchNormPReLUFunction.apply(
        x, norm.weight, norm.bias, act.weight, norm.eps, path == "triton", residual
    )
    if norm.track_running_stats:
        with torch.no_grad():
            # (1 - momentum) running + momentum batch, as ATen updates them
            norm.running_mean.lerp_(mean, momentum)
            norm.running_var.lerp_(var, momentum)
    return y


def _fused_path(
    x: Tensor, norm: nn.BatchNorm2d, act: nn.PReLU, impl: str, residual: Tensor | None = None
) -> str | None:
    """The path :func:`batch_norm_prelu` takes: "cpu" (the C++ kernels), "triton", or None (the
    two modules)."""
    if check_impl(impl) == "reference" or not (  # the cheapest tests first
        torch.is_grad_enabled()
        and norm.training
        and type(norm) in (BatchNorm2d, nn.BatchNorm2d)
        and norm.weight is not None
        and norm.bias is not None
        and norm.weight.dtype == torch.float32
        and is_channels_last(x)
        and x.shape[0] * x.shape[2] * x.shape[3] > 1
        and act.weight.dtype == torch.float32
        and act.weight.shape == (x.shape[1],)
        and (
            residual is None
            or (
                residual.shape == x.shape
                and residual.dtype == x.dtype
                and is_channels_last(residual)
            )
        )
    ):
        return None
    if torch.is_autocast_enabled(x.device.type) and x.dtype != torch.get_autocast_dtype(
        x.device.type
    ):
        return None  # PReLU would cast x to autocast's dtype: the unfused pair keeps that
    if use_triton(impl, x):
        if x.dtype not in TRITON_DTYPES:
            return None
        if impl == "triton":
            return "triton"
        return "triton" if auto_path(x, norm, act) == "triton" else None
    if x.is_cpu and x.dtype in CPU_DTYPES and cpu_kernels_loaded():
        return "cpu"
    return None


CHOICE = declare("batch_norm_prelu", ("triton", "reference"))


def auto_path(x: Tensor, norm: nn.BatchNorm2d, act: nn.PReLU, timer: Timer | None = None) -> str:
    """``impl="auto"`` on CUDA: "triton" or "reference" (the two modules), whichever forward and
    backward ran faster on the first call with this size (rows by
    :func:`~src.kernels.size_bucket`), channel count and dtype (:func:`~src.kernels.choose`; the
    fused op applies in training only). Timed on detached copies,
    without running statistics; both paths are deterministic, and deterministic mode takes the
    kernels.

    Shape:
        x (B, C, H, W) channels-last
    """
    rows = x.shape[0] * x.shape[2] * x.shape[3]
    key = (size_bucket(rows), x.shape[1], x.dtype, str(x.device))

    def candidates() -> dict:
        inputs = x.detach().requires_grad_()
        params = [t.detach().requires_grad_() for t in (norm.weight, norm.bias, act.weight)]
        weight, bias, slope = params

        def fused() -> None:
            y = BatchNormPReLUFunction.apply(inputs, weight, bias, slope, norm.eps, True)[0]
            torch.autograd.grad(y, [inputs, *params], torch.ones_like(y))

        def reference() -> None:
            z = F.batch_norm(inputs, None, None, weight, bias, True, 0.0, norm.eps)
            y = F.prelu(z, slope.to(z.dtype))
            torch.autograd.grad(y, [inputs, *params], torch.ones_like(y))

        return {"triton": fused, "reference": reference}

    return choose(CHOICE, key, candidates, default="triton", timer=timer)


@opaque_op("lightnets::batch_norm_prelu_forward", contract.FORWARD_SCHEMA, contract.forward_fake)
def batch_norm_prelu_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    slope: Tensor,
    eps: float,
    residual: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``lightnets_cpu::batch_norm_prelu_forward`` on the (B H W, C) views of a channels-last x
    and residual: (y, batch mean, inverse standard deviation, unbiased variance); opaque to
    ``torch.compile``.

    Shape:
        x (R, C), weight, bias, slope (C,), residual (R, C) or None -> ((R, C), (C,), (C,), (C,))
    """
    y, mean, invstd, var = torch.ops.lightnets_cpu.batch_norm_prelu_forward(
        x, weight, bias, slope, eps, residual
    )
    return y, mean, invstd, var


@opaque_op("lightnets::batch_norm_prelu_backward", contract.BACKWARD_SCHEMA, contract.backward_fake)
def batch_norm_prelu_backward(
    grad_y: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    slope: Tensor,
    save_mean: Tensor,
    save_invstd: Tensor,
    residual: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``lightnets_cpu::batch_norm_prelu_backward``: (grad_x, grad_weight, grad_bias, grad_slope,
    grad_residual) of (B H W, C) views (grad_residual empty without a residual); opaque to
    ``torch.compile``.

    Shape:
        grad_y, x, residual (R, C), the rest (C,) -> ((R, C), (C,), (C,), (C,), (R, C) or (0,))
    """
    grads = torch.ops.lightnets_cpu.batch_norm_prelu_backward(
        grad_y, x, weight, bias, slope, save_mean, save_invstd, residual
    )
    return grads[0], grads[1], grads[2], grads[3], grads[4]


class BatchNormPReLUFunction(torch.autograd.Function):
    """y = PReLU(BN(x) (+ residual)) with batch statistics, by the C++ kernels or (``triton``) the
    Triton ones; returns (y, batch mean, unbiased batch variance), the statistics for the running
    averages (not differentiable)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight: Tensor,
        bias: Tensor,
        slope: Tensor,
        eps: float,
        triton: bool,
        residual: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        if triton:
            from src.kernels.batch_norm_prelu.triton_kernel import (
                batch_norm_prelu_forward_triton as forward,
            )
        else:
            forward = batch_norm_prelu_forward
        rows = None if residual is None else channel_rows(residual)
        with autocast_off(x.device.type):
            y, mean, invstd, var = forward(channel_rows(x), weight, bias, slope, eps, rows)
        ctx.save_for_backward(x, weight, bias, slope, mean, invstd, residual)
        ctx.mark_non_differentiable(mean, var)
        ctx.triton = triton
        return from_channel_rows(y, x.shape), mean, var  # y channels-last as x

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx, grad_y: Tensor, _grad_mean: Tensor | None, _grad_var: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        x, weight, bias, slope, mean, invstd, residual = ctx.saved_tensors
        # the gradient copied to x's layout only if autograd's differs
        grad_y = grad_y.contiguous(memory_format=torch.channels_last)
        if ctx.triton:
            from src.kernels.batch_norm_prelu.triton_kernel import (
                batch_norm_prelu_backward_triton as backward,
            )
        else:
            backward = batch_norm_prelu_backward
        rows = None if residual is None else channel_rows(residual)
        with autocast_off(x.device.type):
            grad_x, grad_w, grad_b, grad_a, grad_r = backward(
                channel_rows(grad_y), channel_rows(x), weight, bias, slope, mean, invstd, rows
            )
        wanted = ctx.needs_input_grad
        return (
            from_channel_rows(grad_x, x.shape) if wanted[0] else None,
            grad_w if wanted[1] else None,
            grad_b if wanted[2] else None,
            grad_a if wanted[3] else None,
            None,
            None,
            from_channel_rows(grad_r, x.shape) if residual is not None and wanted[6] else None,
        )


class FusingSequential(nn.Sequential):
    """``nn.Sequential`` (same children, same state-dict keys) that runs each BatchNorm directly
    followed by a PReLU as :func:`batch_norm_prelu`. The fused pair calls neither module, so their
    forward hooks do not fire where the fused op applies.

    Shape:
        as the layers give
    """

    def forward(self, x: Tensor) -> Tensor:
        norm = None  # a BatchNorm waiting to see whether a PReLU follows
        for layer in self:
            if norm is not None:
                if isinstance(layer, nn.PReLU):
                    x, norm = batch_norm_prelu(x, norm, layer), None
                    continue
                x, norm = norm(x), None
            if isinstance(layer, nn.BatchNorm2d):
                norm = layer
            else:
                x = layer(x)
        return x if norm is None else norm(x)
