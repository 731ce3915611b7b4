"""The attention probabilities of relative-position attention (Transformer-XL, Group-Transformer):
``softmax(mask(-inf, (content + rel_shift(position)) * scale))`` over the keys.

Eagerly this is Transformer-XL's zero pad, a reshaping copy, the add, the scale, the mask and the
softmax, each a pass over a (B, H, T, K) tensor, and about six more passes backward (two of them
zero-filled buffers of the pad's and the slice's gradients). At the enwik8 sizes (8 heads, 512
queries, 1,024 keys) those passes were about 40% of a CPU training step of either model. On the
CPU, ``lightnets_cpu::relative_softmax_forward`` / ``_backward``
(``src/kernels/relative_softmax/relative_softmax.cpp``) do each direction in one pass over the rows,
with ``rel_shift``'s realignment (and its exact adjoint) folded into the indexing; the scores are
rounded as the eager ops round them, so the probabilities differ from the eager ones by the
exponential's rounding only (a few float32 ulp; one bfloat16 ulp at most). On CUDA, a Triton kernel
does the same, one launch each way (:mod:`src.kernels.relative_softmax.triton_kernel`), where it
measures faster than the eager ops; float64 and other mask shapes take the eager ops. All paths are
deterministic.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from src.kernels import (
    Timer,
    check_impl,
    choose,
    declare,
    opaque_op,
    size_bucket,
    use_triton,
)
from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.relative_softmax import contract as contract

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def rel_shift(x: Tensor) -> Tensor:
    """Realign scores against distance keys: ``out[..., i, j] = x[..., i, j + T - 1 - i]``.

    ``x[..., i, c]`` scores query i against the distance key in column c (distance ``K-1-c``);
    the output holds, in column j, the score for the distance ``K - T + i - j`` between query i
    and key j. Entries with ``j > K - T + i`` (future keys, always masked) hold other rows'
    values, as in Transformer-XL's zero-pad-and-reshape trick that this reproduces exactly.

    Shape:
        (..., T, K) -> (..., T, K), K >= T
    """
    *lead, qlen, klen = x.shape
    if klen < qlen:
        raise ValueError(f"rel_shift needs klen >= qlen, got qlen={qlen}, klen={klen}")
    padded = torch.nn.functional.pad(x, (1, 0))  # (..., T, K+1)
    # reading the padded rows with row length T skips one extra element per row
    shifted = padded.view(*lead, klen + 1, qlen)[..., 1:, :]  # (..., K, T)
    return shifted.reshape(*lead, qlen, klen)


def relative_softmax(
    content: Tensor,
    position: Tensor,
    mask: Tensor | None,
    scale: float,
    impl: str = "auto",
    timer: Timer | None = None,
) -> Tensor:
    """``softmax(mask(-inf, (content + rel_shift(position)) * scale))`` over the last axis, in the
    scores' dtype (16-bit scores are normalised in float32, autocast's rule made explicit).

    Args:
        content: the content scores ``(q + u) k^T``.
        position: the position scores ``(q + v) rk^T`` against distances ``K-1 ... 0``.
        mask: True where a query must not see a key, or None.
        scale: the score scale, ``1/sqrt(d_head)``.
        impl: "auto": on the CPU the C++ kernels where they apply, on CUDA the faster of the
            Triton kernels (:mod:`src.kernels.relative_softmax.triton_kernel`) and the eager ops for
            this shape (:func:`auto_path`; while ``torch.compile`` traces, that choice untimed);
            "triton" or "reference" (the eager ops) to fix it.
        timer: times the candidates of ``impl="auto"`` on CUDA (default: CUDA events).

    Shape:
        content, position (B, H, T, K), K >= T; mask (T, K) or broadcastable to (B, H, T, K)
        -> (B, H, T, K)
    """
    if check_impl(impl) != "reference" and (content.is_cuda or impl == "triton"):
        from src.kernels.relative_softmax.triton_kernel import covers, relative_softmax_triton

        kernel = use_triton(impl, content) and covers(content, position, mask)
        if kernel and impl == "auto":
            kernel = auto_path(content, position, mask, scale, timer) == "triton"
        if kernel:
            return relative_softmax_triton(content, position, mask, scale)
        if impl == "triton":
            raise ValueError(
                "impl='triton' but the fused relative softmax does not cover these operands: "
                f"{content.dtype} {tuple(content.shape)}, {position.dtype} {tuple(position.shape)}"
            )
        return relative_softmax_reference(content, position, mask, scale)
    if impl == "auto" and _kernel_applies(content, position, mask):
        if torch.is_grad_enabled() and (content.requires_grad or position.requires_grad):
            return RelativeSoftmaxCpuFunction.apply(content, position, mask, scale)
        rows = (contract.score_rows(t) for t in (content, position))
        return softmax_forward(*rows, mask, scale).view(content.shape)
    return relative_softmax_reference(content, position, mask, scale)


def relative_softmax_reference(
    content: Tensor, position: Tensor, mask: Tensor | None, scale: float
) -> Tensor:
    """:func:`relative_softmax` by PyTorch ops: the oracle of the kernel's tests.

    Shape:
        as :func:`relative_softmax`
    """
    scores = (content + rel_shift(position)).mul_(scale)
    if mask is not None:
        scores = scores.masked_fill_(mask, float("-inf"))
    if scores.dtype in (torch.float16, torch.bfloat16):
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    return torch.softmax(scores, dim=-1)


CHOICE = declare("relative_softmax", ("triton", "reference"))


def auto_path(
    content: Tensor,
    position: Tensor,
    mask: Tensor | None,
    scale: float,
    timer: Timer | None = None,
) -> str:
    """``impl="auto"`` on CUDA: "triton" or "reference", whichever ran faster on the first call
    with this shape (heads x batch by :func:`~src.kernels.size_bucket`), dtype and mode (forward
    and backward when autograd records, forward otherwise; :func:`~src.kernels.choose`). Both are
    deterministic; deterministic mode takes the kernel.

    Shape:
        as :func:`relative_softmax`
    """
    grad = torch.is_grad_enabled() and (content.requires_grad or position.requires_grad)
    rows = content.numel() // max(content.shape[-1] * content.shape[-2], 1)
    key = (
        size_bucket(rows), *content.shape[-2:], content.dtype, grad, mask is not None,
        str(content.device),
    )  # fmt: skip

    def run(impl: str) -> None:
        inputs = [t.detach().requires_grad_(grad) for t in (content, position)]
        with torch.set_grad_enabled(grad):
            prob = relative_softmax(*inputs, mask, scale, impl=impl)
            if grad:
                torch.autograd.grad(prob, inputs, torch.ones_like(prob))

    def candidates() -> dict:
        return {impl: functools.partial(run, impl) for impl in ("triton", "reference")}

    return choose(CHOICE, key, candidates, default="triton", timer=timer)


def _kernel_applies(content: Tensor, position: Tensor, mask: Tensor | None) -> bool:
    """Whether the CPU kernel computes this call: CPU, a kernel dtype shared by both score
    tensors, 4-D scores of one shape with K >= T, a (T, K) bool mask or none, and the kernels
    built."""
    if not content.is_cpu or content.dim() != 4:
        return False
    if content.dtype not in KERNEL_DTYPES or position.dtype != content.dtype:
        return False
    if position.shape != content.shape or content.shape[-1] < content.shape[-2]:
        return False
    if content.shape[-2] == 0 or content.numel() == 0:
        return False
    if mask is not None and (mask.dtype != torch.bool or mask.shape != content.shape[-2:]):
        return False
    return cpu_kernels_loaded()


@opaque_op(
    "lightnets::relative_softmax_forward", contract.FORWARD_SCHEMA, contract.probabilities_like
)
def softmax_forward(content: Tensor, position: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """``lightnets_cpu::relative_softmax_forward``; opaque to ``torch.compile``.

    Shape:
        content, position (N, T, K), mask (T, K) -> (N, T, K)
    """
    mask = None if mask is None else mask.contiguous()
    return torch.ops.lightnets_cpu.relative_softmax_forward(content, position, mask, scale)


@opaque_op(
    "lightnets::relative_softmax_backward", contract.BACKWARD_SCHEMA, contract.score_grads_like
)
def softmax_backward(
    grad_prob: Tensor, prob: Tensor, mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """``lightnets_cpu::relative_softmax_backward``: (grad_content, grad_position); opaque to
    ``torch.compile``.

    Shape:
        grad_prob, prob (N, T, K), mask (T, K) -> ((N, T, K), (N, T, K))
    """
    mask = None if mask is None else mask.contiguous()
    grad_content, grad_position = torch.ops.lightnets_cpu.relative_softmax_backward(
        grad_prob, prob, mask, scale
    )
    return grad_content, grad_position


class RelativeSoftmaxCpuFunction(torch.autograd.Function):
    """:func:`relative_softmax` by the CPU kernels, forward and backward; the backward reads the
    probabilities (in the scores' dtype), not the scores."""

    @staticmethod
    def forward(
        ctx, content: Tensor, position: Tensor, mask: Tensor | None, scale: float
    ) -> Tensor:  # type: ignore[override]
        rows = (contract.score_rows(t) for t in (content, position))
        prob = softmax_forward(*rows, mask, scale).view(content.shape)
        ctx.save_for_backward(prob, mask)
        ctx.scale = scale
        return prob

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_prob: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        prob, mask = ctx.saved_tensors
        grad_content, grad_position = softmax_backward(
            contract.score_rows(grad_prob.to(prob.dtype)),
            contract.score_rows(prob),
            mask,
            ctx.scale,
        )
        return (
            grad_content.view(prob.shape) if ctx.needs_input_grad[0] else None,
            grad_position.view(prob.shape) if ctx.needs_input_grad[1] else None,
            None,
            None,
        )
