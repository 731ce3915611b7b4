"""The GLT as a function of its parameters: its reference, its paths and their choice.

:class:`src.ops.group_linear.GroupLinear` is the layer; this is the op it runs,
``y_i = x_i @ W_i + b_i`` per group, with its Triton kernels (:mod:`.triton_kernel`) and the
contract they share with the reference (:mod:`.contract`). :func:`interleaved_group_linear` reads
its input in parts in place (DeLighT's input mixer; :mod:`src.kernels.linear` runs a dense layer on
it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from src.kernels import (
    Timer,
    autocast_known,
    autocast_off,
    autocast_operands,
    candidate_steps,
    check_same_dtype,
    choose,
    declare,
    needs_backward,
    opaque_op,
    size_bucket,
    use_triton,
)
from src.kernels.group_linear import contract as contract

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def group_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, *, shuffle: bool, impl: str = "auto"
) -> Tensor:
    """The GLT of :class:`GroupLinear` as a function of its parameters.

    Shape:
        x (..., g * k), weight (g, k, n), bias (g, n) or None -> (..., g * n)
    """
    groups, _, n = weight.shape
    lead = x.shape[:-1]
    # (..., g*k) -> (N, g*k): a view whenever the leading dims flatten without a copy
    y = interleaved_group_linear(
        (x.reshape(-1, x.shape[-1]),), weight, bias, shuffle=shuffle, impl=impl
    )
    return y.reshape(*lead, groups * n)


def interleaved_group_linear(
    parts: Sequence[Tensor],
    weight: Tensor,
    bias: Tensor | None,
    *,
    shuffle: bool,
    impl: str = "auto",
) -> Tensor:
    """A GLT whose group i reads chunk i of every part in turn: [p0_i, p1_i, ...].

    With one part this is the plain GLT. With parts (x0, y) it is DeLighT's input mixer followed by
    the GLT (README "DExTra semantics"): group i's input is [x0_i, y_i], chunk i of each. The mixed
    vector is never built: both the reference (one BLAS call per group and part, on strided views)
    and the Triton kernel (one or two parts) read the parts in place.

    Under ``torch.autocast`` the products run in its dtype, as ``F.linear``'s do, and the output
    is in that dtype; float32 tensors keep float32 gradients. The PyTorch path casts the operands
    first; the kernel takes float32 ones as they are and rounds them as it loads them (the same
    values, without the casts' launches). Outside autocast the operands must share one dtype.

    Shape:
        parts (N, d_j) with d_j divisible by g and sum_j d_j / g = k, weight (g, k, n),
        bias (g, n) or None -> (N, g * n), feature-shuffled when ``shuffle``
    """
    groups, k, _ = weight.shape
    if not parts or any(
        p.dim() != 2 or p.shape[0] != parts[0].shape[0] or p.shape[1] % groups for p in parts
    ):
        raise ValueError(
            f"parts must be (N, d_j) matrices with d_j divisible by {groups} groups, "
            f"got {[tuple(p.shape) for p in parts]}"
        )
    if sum(p.shape[1] for p in parts) != groups * k:
        raise ValueError(
            f"parts have {sum(p.shape[1] for p in parts)} features, "
            f"the weight {tuple(weight.shape)} expects {groups * k}"
        )
    device_type = parts[0].device.type
    # BLAS and the kernel need unit stride along the features; rows may be strided
    parts = tuple(p if p.stride(1) == 1 else p.contiguous() for p in parts)
    dtype = _product_dtype(device_type, parts)
    kernel = use_triton(impl, parts[0]) and (impl == "triton" or dtype in TRITON_DTYPES)
    # under autocast the kernel takes float32 operands (parameters, the residual stream) as they
    # are and rounds them to the product's dtype as it loads them: no casts, and the float32
    # gradients are written directly
    mixed = (
        kernel
        and dtype != torch.float32
        and all(t is None or t.dtype in (dtype, torch.float32) for t in (weight, bias, *parts))
        and autocast_known(device_type)
        and torch.is_autocast_enabled(device_type)
    )
    if not mixed:
        *parts, weight, bias = autocast_operands(device_type, *parts, weight, bias)
        check_same_dtype("the GLT", parts=parts, weight=weight, bias=bias)
    if kernel and impl == "auto" and len(parts) <= 2:
        kernel = auto_path(parts, weight, bias, shuffle, dtype=dtype) == "triton"
        if not kernel and mixed:
            *parts, weight, bias = autocast_operands(device_type, *parts, weight, bias)
    if kernel:
        if dtype not in TRITON_DTYPES or len(parts) > 2:
            raise TypeError(
                f"the Triton GLT takes one or two parts of dtype {TRITON_DTYPES}, "
                f"got {[p.dtype for p in parts]}"
            )
        from src.kernels.group_linear.triton_kernel import interleaved_group_linear_triton

        return interleaved_group_linear_triton(parts, weight, bias, shuffle, dtype=dtype)
    if not torch.is_grad_enabled() or not any(
        t is not None and t.requires_grad for t in (weight, bias, *parts)
    ):
        return interleaved_group_linear_forward(weight, bias, shuffle, parts)
    return InterleavedGroupLinearFunction.apply(weight, bias, shuffle, *parts)


def _product_dtype(device_type: str, parts: Sequence[Tensor]) -> torch.dtype:
    """The dtype the GLT's products take: autocast's for floating parts autocast casts, else the
    parts' one dtype (``TypeError`` naming them otherwise)."""
    autocast = autocast_known(device_type) and torch.is_autocast_enabled(device_type)
    castable = (torch.float32, torch.float16, torch.bfloat16)
    if autocast and all(p.dtype in castable for p in parts):
        return torch.get_autocast_dtype(device_type)
    return check_same_dtype("the GLT", parts=parts)


CHOICE = declare("group_linear", ("triton", "reference"))


def auto_path(
    parts: Sequence[Tensor],
    weight: Tensor,
    bias: Tensor | None,
    shuffle: bool,
    timer: Timer | None = None,
    *,
    dtype: torch.dtype | None = None,
) -> str:
    """``impl="auto"`` on CUDA: "triton" or "reference", whichever call (a training step when
    autograd wants the backward) ran faster on the first call with these shapes (rows by
    :func:`~src.kernels.size_bucket`), dtype and mode (:func:`~src.kernels.choose`). The kernel is
    not faster everywhere: cuBLAS's GEMMs beat it on some shapes and dtypes, so the choice is
    measured rather than assumed. While ``torch.compile`` traces, that choice untimed (the eager
    steps' or the default), the kernel a custom op of the graph.

    ``dtype`` is the products' (default the parts'); float32 operands of 16-bit products
    (autocast) are cast for the PyTorch path, as it takes them, and not for the kernel.

    Shape:
        as :func:`interleaved_group_linear`
    """
    dtype = parts[0].dtype if dtype is None else dtype
    key = (
        size_bucket(parts[0].shape[0]), tuple(p.shape[1] for p in parts), tuple(weight.shape),
        bias is not None, shuffle, dtype, str(weight.device), needs_backward(weight, bias, *parts),
    )  # fmt: skip

    def run(path: str, w: Tensor, b: Tensor | None, *xs: Tensor) -> Tensor:
        from src.kernels.group_linear.triton_kernel import interleaved_group_linear_triton

        if path == "triton":
            return interleaved_group_linear_triton(xs, w, b, shuffle, dtype=dtype)
        w, b, *xs = (None if t is None else t.to(dtype) for t in (w, b, *xs))
        return InterleavedGroupLinearFunction.apply(w, b, shuffle, *xs)

    def candidates() -> dict:
        return candidate_steps(run, ("triton", "reference"), weight, bias, *parts)

    # both paths sum in a fixed order; the kernel was the rule before choices were measured
    return choose(CHOICE, key, candidates, default="triton", timer=timer)


def interleaved_group_linear_forward(
    weight: Tensor, bias: Tensor | None, shuffle: bool, parts: Sequence[Tensor]
) -> Tensor:
    """The forward of :class:`InterleavedGroupLinearFunction`; called directly where no gradient
    is wanted (a beam search's steps), which skips the Function's per-call cost.

    Shape:
        parts (N, d_j) -> (N, g*n)
    """
    groups = weight.shape[0]
    rows = parts[0].shape[0]
    # functional ops only (no out=), so that torch.export can trace the forward
    with autocast_off(weight.device.type):
        offset, y = 0, None
        for part in parts:
            width = part.shape[1] // groups
            xg = part.unflatten(1, (groups, width)).transpose(0, 1)  # (g, N, d_j/g), a view
            w = weight[:, offset : offset + width]  # (g, d_j/g, n)
            if y is not None:
                y = y.baddbmm_(xg, w)
            elif bias is not None:
                y = torch.baddbmm(bias.unsqueeze(1), xg, w)
            else:
                y = torch.bmm(xg, w)
            offset += width
    # shuffle: (g, N, n) -> (N, n, g); plain: -> (N, g, n); one copy either way
    y = y.permute(1, 2, 0) if shuffle else y.transpose(0, 1)
    return y.reshape(rows, -1)


class InterleavedGroupLinearFunction(torch.autograd.Function):
    """PyTorch reference of :func:`interleaved_group_linear`, with a backward that copies least.

    The products read strided views: chunk i of a part is an (N, d_j/g) matrix with leading
    dimension d_j, so the parts are never gathered. The forward runs one batched product over the
    groups per part, (g, N, d_j/g) @ (g, d_j/g, n), the first adding the bias, and then lays the
    (g, N, n) result out as (N, n, g), which is the feature shuffle, as its one copy (plain:
    (N, g, n)). Batched, not a loop of g products and a stack: 0.08 vs 0.16 ms for a g = 4,
    256 -> 256 layer over 512 rows and 2.7 vs 8.9 ms for a g = 16, 512 -> 1024 one over 4,096 rows
    (fp32, 2 cores), with the same sums. The backward (:func:`glt_backward`) undoes the shuffle with
    one transpose inside each row, (N, n, g) -> (N, g, n), sums the bias gradient over its rows, and
    computes the input and weight gradients of each part as one batched product over the groups
    each, the input gradient written straight into its (N, d_j) chunks (batched products beat a loop
    of g calls there: 7.4 vs 11.0 ms for the weight gradient of a g = 16 layer over 4,096 rows on 2
    cores), except the weight gradient in 16 bits on the CPU, which is one product per group.

    The forward is plain PyTorch, which ``torch.compile`` and ``torch.export`` trace; the backward
    is the custom op ``lightnets::glt_backward``, opaque to them, since its products write into
    strided views of their outputs. Both run with autocast off: the operands already share one
    dtype (:func:`interleaved_group_linear` applied autocast's rule).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, weight: Tensor, bias: Tensor | None, shuffle: bool, *parts: Tensor
    ) -> Tensor:
        """parts (N, d_j) -> (N, g*n)."""
        ctx.save_for_backward(weight, *parts)
        ctx.shuffle = shuffle
        ctx.has_bias = bias is not None
        return interleaved_group_linear_forward(weight, bias, shuffle, parts)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        # inputs (weight, bias, shuffle, *parts)
        return contract.glt_function_backward(ctx, grad_y, glt_backward, options=1)


@opaque_op("lightnets::glt_backward", contract.BACKWARD_SCHEMA, contract.glt_grads_like)
def glt_backward(
    grad_y: Tensor,
    weight: Tensor,
    parts: Sequence[Tensor],
    shuffle: bool,
    weight_grad: bool,
    bias_grad: bool,
    part_grads: Sequence[bool],
) -> list[Tensor]:
    """Backward of :class:`InterleavedGroupLinearFunction`: the wanted gradients of
    (weight, bias, *parts), in that order
    (:func:`src.kernels.group_linear.contract.glt_grads_like`).

    Shape:
        grad_y (N, g*n), weight (g, k, n), parts (N, d_j) -> [(g, k, n)], [(g, n)], [(N, d_j)]...
    """
    groups, _, n = weight.shape
    grad_y = grad_y.contiguous()
    rows = grad_y.shape[0]
    if shuffle:
        # (N, n, g) -> (N, g, n): the one copy of the backward
        dy = grad_y.view(rows, n, groups).transpose(1, 2).contiguous()
    else:
        dy = grad_y.view(rows, groups, n)
    grad_w = torch.empty_like(weight) if weight_grad else None
    grad_b = dy.sum(0) if bias_grad else None  # (N, g, n) -> (g, n)
    grad_parts = [
        part.new_empty(part.shape) if want else None
        for part, want in zip(parts, part_grads, strict=True)
    ]
    dy_g = dy.transpose(0, 1)  # (N, g, n) -> (g, N, n), a view
    # the CPU's batched 16-bit products are slow over long reductions: one product per group
    # is 3-8x faster for the weight gradient over 4,096 rows (bf16, 2 cores), as fast over 512
    per_group_weight_grad = dy.is_cpu and dy.dtype in (torch.bfloat16, torch.float16)
    offset = 0
    for part, grad_part in zip(parts, grad_parts, strict=True):
        width = part.shape[1] // groups
        w = weight[:, offset : offset + width]  # (g, d_j/g, n)
        if grad_part is not None:
            # dx_j,i = dy_i @ W_j,i^T for every group in one batched product, written
            # straight into the (N, d_j/g) chunks: (g, N, n) @ (g, n, d_j/g)
            chunks = grad_part.view(rows, groups, width).transpose(0, 1)  # (g, N, d_j/g)
            torch.bmm(dy_g, w.transpose(1, 2), out=chunks)
        if grad_w is not None and per_group_weight_grad:
            for i in range(groups):
                # dW_j,i = x_j,i^T @ dy_i: (d_j/g, N) @ (N, n), written into its rows of dW
                x_i = part[:, i * width : (i + 1) * width]
                torch.mm(x_i.t(), dy[:, i], out=grad_w[i, offset : offset + width])
        elif grad_w is not None:
            # the same for every group in one batched product: (g, d_j/g, N) @ (g, N, n)
            x_g = part.view(rows, groups, width).permute(1, 2, 0)  # (g, d_j/g, N)
            grad_w[:, offset : offset + width] = torch.bmm(x_g, dy_g)
        offset += width
    return [grad for grad in (grad_w, grad_b, *grad_parts) if grad is not None]


def group_linear_reference(x: Tensor, weight: Tensor, bias: Tensor | None, shuffle: bool) -> Tensor:
    """The GLT written plainly (autograd differentiates it): the oracle of the faster paths.

    Shape:
        x (..., g * k), weight (g, k, n), bias (g, n) or None -> (..., g * n)
    """
    groups, k, n = weight.shape
    lead = x.shape[:-1]
    # (..., g*k) -> (N, g, k) -> (g, N, k)
    xg = x.reshape(-1, groups, k).transpose(0, 1)
    if bias is None:
        y = torch.bmm(xg, weight)
    else:
        y = torch.baddbmm(bias.unsqueeze(1), xg, weight)  # (g, N, n)
    # shuffle: (g, N, n) -> (N, n, g); otherwise (N, g, n)
    y = y.permute(1, 2, 0) if shuffle else y.transpose(0, 1)
    return y.reshape(*lead, groups * n)
