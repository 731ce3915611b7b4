"""Fused Triton GLT: per-group matmul + bias that reads and writes the DeLighT layouts in place.

One strided grouped GEMM kernel, ``C[r, i, c] = sum_t A[r, i, t] B[i, t, c] (+ bias[i, c])``, with
every operand addressed through its own three strides, does all three products of the layer:

- forward: A = the grouped input as it lies in memory, B = W, and C = the output addressed in
  shuffled order (feature ``j * g + i``) or plain order, so the layer needs no transpose, shuffle
  or un-grouping copy before or after it. A may come in two parts walked one after the other:
  DeLighT's input mixer (group i reads chunk i of x0, then chunk i of the previous GLT's output)
  is then read in place too, with no concatenation;
- input gradient: A = the output gradient read back through the shuffled strides, B = W^T;
- weight gradient: A = x^T, B = the output gradient; the same programs also reduce the bias
  gradient (the column sums of B) so no separate pass over the output gradient is needed.

The PyTorch reference is :class:`src.kernels.group_linear.InterleavedGroupLinearFunction`; when
PyTorch computes only the bias gradient (weight frozen), it reduces it itself.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from src.kernels import Timer, autocast_off, choose, declare, opaque_op, size_bucket
from src.kernels.environment import glt_weight_grad
from src.kernels.group_linear import contract as contract
from src.kernels.triton.launch import gpu_launch, multi_processor_count

# The grouped GEMM's launch configuration, read at every launch. On a GPU (a CUDA tensor, or
# launches recorded for one), the fastest of 26 configurations of DExTra(d_m=512, N=8)'s training
# step at 16,384 tokens under bf16 autocast on an H100 (benchmarks/gpu_tune.py, docs/gpu.md):
# 10.5 ms against 16.9 ms with Triton's default 4 warps and reduction blocks of 32. fp32 operands
# take the same configuration, not yet swept.
BLOCK_R_GPU = 64  # output rows of one program (tokens; the weight gradient's input features)
BLOCK_T_MAX_GPU = 64  # the reduction's block (tokens, or input features per group), at most
WARPS_GPU = 8  # warps of one program
STAGES_GPU = 3  # software-pipelining stages of the reduction loop: Triton's default
SPLIT_K_PROGRAMS_PER_SM = 4  # programs of a split-K weight gradient, per SM
# in the interpreter:
BLOCK_R_INTERPRETER = 32
BLOCK_T_MAX_INTERPRETER = 32
SPLIT_K_PROGRAMS_INTERPRETER = 16  # a fixed count, so that the tests split too
# both, as powers of two from 16 up to this:
BLOCK_C_MAX = 64  # output columns of one program (output features per group)


@triton.jit
def _dot_operands(a, b, DOT_16: tl.constexpr):
    """The blocks as the product takes them: under autocast (``DOT_16`` 1: bfloat16, 2: float16)
    float32 operands (parameters, the residual stream) are rounded here as autocast's casts would
    round them; otherwise b takes a's dtype (a no-op where they share one)."""
    if DOT_16 == 1:
        return a.to(tl.bfloat16), b.to(tl.bfloat16)
    elif DOT_16 == 2:
        return a.to(tl.float16), b.to(tl.float16)
    else:
        return a, b.to(a.dtype)


@triton.jit
def _accumulate(acc, a, b, DOT_16: tl.constexpr, WIDEN: tl.constexpr, IEEE: tl.constexpr):
    """``acc + a @ b`` in float32: the blocks rounded as :func:`_dot_operands` says, widened to
    float32 first where ``WIDEN`` (the interpreter's 16-bit products, :func:`_grouped_gemm`), the
    product in IEEE float32 where ``IEEE`` (no TF32)."""
    a, b = _dot_operands(a, b, DOT_16)
    if WIDEN:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, a1_ptr, b_ptr, bias_ptr, c_ptr, c1_ptr, colsum_ptr,
    R, T, T1, C, n_col_blocks, T_SPLIT, R0, C0,
    s_ar, s_ag, s_at,
    s_a1r, s_a1g, s_a1t,
    s_bg, s_bt, s_bc,
    s_cs, s_cr, s_cg, s_cc,
    s_c1r, s_c1g, s_c1c,
    s_biasg, s_sums, s_sumg,
    HAS_A1: tl.constexpr, HAS_BIAS: tl.constexpr, COLSUM: tl.constexpr, IEEE: tl.constexpr,
    WIDEN: tl.constexpr, DOT_16: tl.constexpr, SPLIT_A: tl.constexpr, SPLIT_C: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    pid_r = tl.program_id(0)
    pid_gc = tl.program_id(1)
    # split-K: program s reduces t in [s T_SPLIT, (s + 1) T_SPLIT) (T_SPLIT a multiple of BLOCK_T)
    # into its own slice of C (and of the column sums); one split reduces all of T (and T1)
    pid_s = tl.program_id(2)
    t_begin = pid_s * T_SPLIT
    group = pid_gc // n_col_blocks
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid_gc % n_col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    red = tl.arange(0, BLOCK_T)
    a_base = a_ptr + group * s_ag + rows[:, None] * s_ar
    b_base = b_ptr + group * s_bg + cols[None, :] * s_bc
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    col_sum = tl.zeros((BLOCK_C,), dtype=tl.float32)
    if SPLIT_A:
        # A's rows (a weight gradient's input features) are a's below R0, then a1's: the two parts
        # of DeLighT's input mixer in one launch
        rows_a = R0
        a1_rows = a1_ptr + group * s_a1g + (rows - R0)[:, None] * s_a1r
    else:
        rows_a = R
    for t0 in range(t_begin, t_begin + T_SPLIT, BLOCK_T):
        t = t0 + red
        a = tl.load(
            a_base + t[None, :] * s_at, mask=(rows[:, None] < rows_a) & (t[None, :] < T), other=0.0
        )
        if SPLIT_A:
            a += tl.load(
                a1_rows + t[None, :] * s_a1t,
                mask=(rows[:, None] >= R0) & (rows[:, None] < R) & (t[None, :] < T),
                other=0.0,
            )
        b = tl.load(
            b_base + t[:, None] * s_bt, mask=(t[:, None] < T) & (cols[None, :] < C), other=0.0
        )
        if COLSUM:
            col_sum += tl.sum(b.to(tl.float32), axis=0)
        acc = _accumulate(acc, a, b, DOT_16, WIDEN, IEEE)
    if HAS_A1:
        # the second part continues the reduction: B rows T .. T + T1
        a1_base = a1_ptr + group * s_a1g + rows[:, None] * s_a1r
        for t0 in range(0, T1, BLOCK_T):
            t = t0 + red
            a = tl.load(
                a1_base + t[None, :] * s_a1t,
                mask=(rows[:, None] < R) & (t[None, :] < T1),
                other=0.0,
            )
            b = tl.load(
                b_base + (T + t)[:, None] * s_bt,
                mask=(t[:, None] < T1) & (cols[None, :] < C),
                other=0.0,
            )
            acc = _accumulate(acc, a, b, DOT_16, WIDEN, IEEE)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + group * s_biasg + cols, mask=cols < C, other=0.0)
        # a float32 bias with a 16-bit output (autocast) is rounded to it first, as autocast's cast
        acc += bias.to(c_ptr.dtype.element_ty).to(tl.float32)[None, :]
    c = c_ptr + pid_s * s_cs + group * s_cg + rows[:, None] * s_cr + cols[None, :] * s_cc
    out = acc.to(c_ptr.dtype.element_ty)
    if SPLIT_C:
        # C's columns below C0 are c's, the rest c1's (an input gradient per mixer part)
        tl.store(c, out, mask=(rows[:, None] < R) & (cols[None, :] < C0))
        c1 = c1_ptr + group * s_c1g + rows[:, None] * s_c1r + (cols - C0)[None, :] * s_c1c
        tl.store(c1, out, mask=(rows[:, None] < R) & (cols[None, :] >= C0) & (cols[None, :] < C))
    else:
        tl.store(c, out, mask=(rows[:, None] < R) & (cols[None, :] < C))
    if COLSUM:
        # only the first row block writes: every row block reduced the same columns of B
        tl.store(colsum_ptr + pid_s * s_sums + group * s_sumg + cols,
                 col_sum.to(colsum_ptr.dtype.element_ty),
                 mask=(cols < C) & (pid_r == 0))  # fmt: skip


def _block(size: int, low: int, high: int) -> int:
    return max(low, min(high, triton.next_power_of_2(size)))


def _grouped_gemm(
    a: Tensor,
    b: Tensor,
    c: Tensor,
    *,
    a1: Tensor | None = None,
    bias: Tensor | None = None,
    colsum: Tensor | None = None,
    splits: int = 1,
    dot_dtype: torch.dtype | None = None,
    a_rows1: Tensor | None = None,
    c1: Tensor | None = None,
) -> None:
    """``c[r, i] = concat(a[r, i], a1[r, i]) @ b[i] (+ bias[i])``; ``colsum[i] = b[i].sum(0)``.

    The products take ``dot_dtype`` operands (default a's): float32 operands of a 16-bit
    ``dot_dtype`` are rounded to it as they are loaded (autocast's casts, without their launches).

    ``splits`` > 1 splits the reduction over T (split-K): each split writes a float32 partial
    product (and column sums), summed afterwards. It is how a long reduction with a small output,
    the weight gradient over thousands of tokens, fills the GPU; it takes no ``a1`` or ``bias``.

    Two parts of DeLighT's input mixer in one launch, for the gradients: ``a_rows1`` continues
    A's rows after a's (a weight gradient's input features: ``c = concat(a, a_rows1) @ b``), and
    ``c1`` takes C's columns after c's (an input gradient per part: ``concat(c, c1) = a @ b``).

    Shape:
        a (R, g, T), a1 (R, g, T1), b (g, T + T1, C), bias (g, C), c (R, g, C), colsum (g, C);
        or a (R0, g, T) and a_rows1 (R - R0, g, T); or c (R, g, C0) and c1 (R, g, C - C0);
        any strides. a1, bias, colsum, a_rows1 and c1 are optional.
    """
    rows, groups, red = a.shape
    rows0, cols0 = rows, c.shape[2]
    if a_rows1 is not None:
        if a1 is not None or a_rows1.dtype != a.dtype or a_rows1.shape[1:] != a.shape[1:]:
            raise ValueError("a_rows1 continues a's rows: no a1, and a's dtype, groups and T")
        rows += a_rows1.shape[0]
    if c1 is not None and (
        splits > 1 or c1.dtype != c.dtype or c.shape[2] + c1.shape[2] != b.shape[2]
    ):
        raise ValueError("c1 takes C's columns after c's: one split, c's dtype, C in all")
    red1 = a1.shape[2] if a1 is not None else 0
    cols = b.shape[2]
    block_r, block_t, block_c = _blocks(a, red, red1, cols)
    # every operand in the product's dtype or float32 (autocast's float32 parameters and residual
    # stream, rounded in the kernel; gradients of float32 tensors written in float32)
    dot_dtype = a.dtype if dot_dtype is None else dot_dtype
    operands = (a, b, c) if a1 is None else (a, a1, b, c)
    if any(t.dtype not in (dot_dtype, torch.float32) for t in operands):
        raise TypeError(
            f"a, b and c must be in the product's dtype ({dot_dtype}) or float32, got "
            f"{[t.dtype for t in operands]}"
        )
    if splits > 1 and (a1 is not None or bias is not None):
        raise ValueError("split-K reduces one operand pair: no a1 or bias")
    # the reduction per split, whole blocks of BLOCK_T so that no block straddles two splits
    t_split = triton.cdiv(triton.cdiv(red, max(splits, 1)), block_t) * block_t
    splits = max(triton.cdiv(red, t_split), 1)
    out, out_sum = c, colsum
    if splits > 1:
        out = torch.empty((splits, *c.shape), dtype=torch.float32, device=c.device)
        out_sum = None
        if colsum is not None:
            out_sum = torch.empty((splits, *colsum.shape), dtype=torch.float32, device=c.device)
    # 16-bit inputs in the interpreter (CPU tensors): its tl.dot multiplies bfloat16 bit patterns
    # as integers (triton-lang/triton#11584), so the operands are widened to float32 first; the
    # products of 16-bit values are exact in float32, which is what the GPU's 16-bit dot gives
    widen = not gpu_launch(a) and dot_dtype != torch.float32
    # fp32 inputs: exact products unless PyTorch itself allows TF32 matmuls
    ieee = widen or (
        dot_dtype == torch.float32 and not (a.is_cuda and torch.backends.cuda.matmul.allow_tf32)
    )
    n_col_blocks = triton.cdiv(cols, block_c)
    # unused pointers (no second part, bias or column sums) are given c; the kernel never reads them
    a1_arg = a1 if a1 is not None else a_rows1 if a_rows1 is not None else a
    c1_arg = c1 if c1 is not None else c
    bias_arg = bias if bias is not None else c
    sum_arg = out_sum if out_sum is not None else c
    # (split stride, then the three of one split) of the output and column sums
    out_strides = out.stride() if splits > 1 else (0, *c.stride())
    split_sums = splits > 1 and out_sum is not None
    sum_strides = sum_arg.stride()[:2] if split_sums else (0, sum_arg.stride(0))
    grid = (triton.cdiv(rows, block_r), groups * n_col_blocks, splits)
    _grouped_gemm_kernel[grid](
        a, a1_arg, b, bias_arg, out, c1_arg, sum_arg,
        rows, red, red1, cols, n_col_blocks, t_split, rows0, cols0,
        *a.stride(), *a1_arg.stride(), *b.stride(), *out_strides, *c1_arg.stride(),
        bias_arg.stride(0), *sum_strides,
        HAS_A1=a1 is not None, HAS_BIAS=bias is not None, COLSUM=colsum is not None, IEEE=ieee,
        WIDEN=widen, DOT_16=_DOT_16.get(dot_dtype, 0), SPLIT_A=a_rows1 is not None,
        SPLIT_C=c1 is not None,
        BLOCK_R=block_r, BLOCK_T=block_t, BLOCK_C=block_c,
        **({"num_warps": WARPS_GPU, "num_stages": STAGES_GPU} if gpu_launch(a) else {}),
    )  # fmt: skip
    if splits > 1:
        # one reduction straight into a float32 output (autocast's weight gradient), else a copy
        _sum_into(out, c)
        if colsum is not None:
            _sum_into(out_sum, colsum)


def _sum_into(partials: Tensor, out: Tensor) -> None:
    """``out = partials.sum(0)`` in one launch where out is float32 as the partials are."""
    if out.dtype == partials.dtype:
        torch.sum(partials, 0, out=out)
    else:
        out.copy_(partials.sum(0))


# the kernel's DOT_16 code of a 16-bit product dtype
_DOT_16 = {torch.bfloat16: 1, torch.float16: 2}


def _blocks(a: Tensor, red: int, red1: int, cols: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_T, BLOCK_C) of a launch."""
    if gpu_launch(a):
        block_r, block_t = BLOCK_R_GPU, BLOCK_T_MAX_GPU
    else:
        block_r, block_t = BLOCK_R_INTERPRETER, BLOCK_T_MAX_INTERPRETER
    return block_r, _block(max(red, red1), 16, block_t), _block(cols, 16, BLOCK_C_MAX)


def split_k_splits(a: Tensor, cols: int, *, programs: int, rows: int | None = None) -> int:
    """Reduction splits for a grouped GEMM with ``a`` (R, g, T) (``rows`` R when A continues in
    a second part) and C columns: enough for about ``programs`` programs in all, each split
    reducing at least four blocks of T."""
    rows = a.shape[0] if rows is None else rows
    _, groups, red = a.shape
    block_r, block_t, block_c = _blocks(a, red, 0, cols)
    tiles = triton.cdiv(rows, block_r) * groups * triton.cdiv(cols, block_c)
    return max(1, min(triton.cdiv(programs, tiles), red // (4 * block_t)))


def _grouped_view(y: Tensor, groups: int, shuffle: bool) -> Tensor:
    """The (N, g*n) output seen as (N, g, n): unit j of group i at ``j*g + i`` or ``i*n + j``."""
    rows, width = y.shape
    n = width // groups
    if shuffle:
        # (N, g*n) laid out as (N, n, g) -> (N, g, n)
        return y.view(rows, n, groups).transpose(1, 2)
    return y.view(rows, groups, n)


class InterleavedGroupLinearTriton(torch.autograd.Function):
    """Autograd wrapper of the fused GLT: the forward and all gradients are Triton kernels.

    The kernels are launched inside the custom ops ``lightnets::glt_triton`` and
    ``lightnets::glt_triton_backward``, so that ``torch.compile`` traces this Function without
    looking into a launch (it cannot trace one in the interpreter). The products take ``dtype``
    operands; under autocast (a 16-bit ``dtype``) the parts, weight and bias may also come in
    float32 (:func:`src.kernels.group_linear.interleaved_group_linear` casts none of them), and the
    kernels round them to 16 bits as they load them, which saves autocast's casts and the casts of
    their gradients: four launches per parameter or float32 input and layer. Products accumulate in
    float32; the output is in ``dtype``, every gradient in its tensor's dtype.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, weight: Tensor, bias: Tensor | None, shuffle: bool, dtype: torch.dtype, *parts: Tensor
    ) -> Tensor:
        """parts (N, d_j), one or two -> (N, g*n)."""
        with autocast_off(weight.device.type):
            y = glt_triton(parts, weight, bias, shuffle, dtype)
        ctx.save_for_backward(weight, *parts)
        ctx.shuffle = shuffle
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        # inputs (weight, bias, shuffle, dtype, *parts)
        return contract.glt_function_backward(ctx, grad_y, glt_triton_backward, options=2)


@opaque_op("lightnets::glt_triton", contract.FORWARD_SCHEMA, contract.forward_fake)
def glt_triton(
    parts: Sequence[Tensor], weight: Tensor, bias: Tensor | None, shuffle: bool, dtype: torch.dtype
) -> Tensor:
    """Forward of :class:`InterleavedGroupLinearTriton`: one kernel launch, products and output
    in ``dtype``.

    Shape:
        parts (N, d_j), one or two (unit feature stride), weight (g, k, n), bias (g, n) or None
        -> (N, g*n)
    """
    groups, _, n = weight.shape
    rows = parts[0].shape[0]
    # (N, d_j) -> (N, g, d_j/g), views
    grouped = [p.unflatten(1, (groups, -1)) for p in parts]
    y = parts[0].new_empty(rows, groups * n, dtype=dtype)
    a1 = grouped[1] if len(grouped) > 1 else None
    _grouped_gemm(
        grouped[0], weight, _grouped_view(y, groups, shuffle), a1=a1, bias=bias, dot_dtype=dtype
    )
    return y


@opaque_op("lightnets::glt_triton_backward", contract.BACKWARD_SCHEMA, contract.glt_grads_like)
def glt_triton_backward(
    grad_y: Tensor,
    weight: Tensor,
    parts: Sequence[Tensor],
    shuffle: bool,
    weight_grad: bool,
    bias_grad: bool,
    part_grads: Sequence[bool],
) -> list[Tensor]:
    """Backward of :class:`InterleavedGroupLinearTriton`: the reference's
    (:func:`src.kernels.group_linear.glt_backward`) by the kernels, into the gradients the
    contract lays out (:func:`~src.kernels.group_linear.contract.glt_grads_like`)."""
    groups = weight.shape[0]
    # (N, g*n) read in place as (N, g, n)
    dy = _grouped_view(grad_y.contiguous(), groups, shuffle)
    grads = contract.glt_grads_like(
        grad_y, weight, parts, shuffle, weight_grad, bias_grad, part_grads
    )
    given = iter(grads)
    grad_w = next(given) if weight_grad else None
    grad_b = next(given) if bias_grad else None
    grouped = [p.unflatten(1, (groups, -1)) for p in parts]  # (N, g, d_j/g)
    dx = [next(given).unflatten(1, (groups, -1)) if want else None for want in part_grads]
    # the input mixer's two parts: one launch for both input gradients, one for the weight's
    pair = len(parts) == 2 and parts[0].dtype == parts[1].dtype
    if pair and all(part_grads) and dx[0].dtype == dx[1].dtype:
        _grouped_gemm(dy, weight.transpose(1, 2), dx[0], c1=dx[1], dot_dtype=dy.dtype)
    else:
        _input_grads(dy, weight, grouped, dx)
    if grad_w is None:
        if grad_b is not None:
            grad_b.copy_(dy.sum(0, dtype=torch.float32))
    elif pair and weight_grad_method(grouped[0], dy) == "splitk":
        weight_grad_splitk(grouped[0], dy, grad_w, grad_b, xg1=grouped[1])
    else:
        offset = 0
        for j, xg in enumerate(grouped):
            width = xg.shape[2]
            # the first part's weight gradient also gives the bias gradient (column sums of dy)
            weight_grad_into(xg, dy, grad_w[:, offset : offset + width], grad_b if j == 0 else None)
            offset += width
    return grads


def _input_grads(
    dy: Tensor, weight: Tensor, grouped: Sequence[Tensor], dx: Sequence[Tensor | None]
) -> None:
    """dx_j = dy @ W_j^T into each wanted ``dx[j]``, one launch each.

    Shape:
        dy (N, g, n), weight (g, k, n), grouped[j] and dx[j] (N, g, d_j/g)
    """
    offset = 0
    for part, grad in zip(grouped, dx, strict=True):
        width = part.shape[2]
        if grad is not None:
            # W_j seen as (g, n, d_j/g)
            w = weight[:, offset : offset + width].transpose(1, 2)
            _grouped_gemm(dy, w, grad, dot_dtype=dy.dtype)
        offset += width


def weight_grad_splitk(
    xg: Tensor, dy: Tensor, out: Tensor, colsum: Tensor | None, *, xg1: Tensor | None = None
) -> None:
    """dW = x^T dy by the grouped-GEMM kernel, split over the tokens (:func:`split_k_splits`);
    with ``xg1``, x is the input mixer's two parts, [xg, xg1] per group, in the same launch.

    Shape:
        xg (N, g, k0), xg1 (N, g, k - k0), dy (N, g, n) -> out (g, k, n), colsum (g, n); any
        strides
    """
    a = xg.permute(2, 1, 0)  # (k0, g, N)
    a1 = None if xg1 is None else xg1.permute(2, 1, 0)  # (k - k0, g, N)
    programs = _split_k_programs(xg.device)
    splits = split_k_splits(a, dy.shape[2], programs=programs, rows=out.shape[1])
    _grouped_gemm(
        a, dy.transpose(0, 1), out.transpose(0, 1), colsum=colsum, splits=splits,
        dot_dtype=dy.dtype, a_rows1=a1,
    )  # fmt: skip


def _split_k_programs(device: torch.device) -> int:
    """``SPLIT_K_PROGRAMS_PER_SM`` programs per SM on a GPU, ``SPLIT_K_PROGRAMS_INTERPRETER`` in
    the interpreter."""
    sms = multi_processor_count(device)
    return SPLIT_K_PROGRAMS_PER_SM * sms if sms else SPLIT_K_PROGRAMS_INTERPRETER


def weight_grad_bmm(xg: Tensor, dy: Tensor, out: Tensor, colsum: Tensor | None) -> None:
    """dW = x^T dy by ``torch.bmm`` on strided views (cuBLAS's batched GEMM), as
    :func:`weight_grad_splitk`; the column sums are a separate reduction."""
    # (g, k, N) @ (g, N, n), in dy's dtype (x may be float32 under autocast)
    out.copy_(torch.bmm(xg.permute(1, 2, 0).to(dy.dtype), dy.transpose(0, 1)))
    if colsum is not None:
        colsum.copy_(dy.sum(0, dtype=torch.float32))


WEIGHT_GRAD_METHODS = {"splitk": weight_grad_splitk, "bmm": weight_grad_bmm}
WEIGHT_GRAD_CHOICE = declare("group_linear.weight_grad", tuple(WEIGHT_GRAD_METHODS))


def weight_grad_method(xg: Tensor, dy: Tensor, timer: Timer | None = None) -> str:
    """The weight-gradient method for these operands (:func:`src.kernels.choose`):
    ``LIGHTNETS_GLT_WGRAD`` when it names one; on CUDA the committed table's (bmm on an H100 at
    DExTra's shapes) or whichever of split-K and bmm measured faster on the first backward of this
    shape (tokens by :func:`src.kernels.size_bucket`) and dtype; split-K on CPU tensors (the
    interpreter; a ``timer`` measures there too, for tests).
    """
    if not xg.is_cuda and timer is None and glt_weight_grad() == "auto":
        return "splitk"
    key = (size_bucket(xg.shape[0]), *xg.shape[1:], dy.shape[2], xg.dtype)

    def candidates() -> dict:
        out = xg.new_empty(xg.shape[1], xg.shape[2], dy.shape[2])
        colsum = torch.empty(dy.shape[1:], dtype=dy.dtype, device=dy.device)
        return {
            name: functools.partial(method, xg, dy, out, colsum)
            for name, method in WEIGHT_GRAD_METHODS.items()
        }

    return choose(
        WEIGHT_GRAD_CHOICE, key, candidates, default="splitk", reference="bmm", timer=timer
    )


def weight_grad_into(xg: Tensor, dy: Tensor, out: Tensor, colsum: Tensor | None) -> None:
    """dW_j = x_j^T @ dy into ``out`` (and dy's column sums into ``colsum``) by the method of
    :func:`weight_grad_method`.

    Shape:
        xg (N, g, k), dy (N, g, n) -> out (g, k, n), colsum (g, n) or None
    """
    WEIGHT_GRAD_METHODS[weight_grad_method(xg, dy)](xg, dy, out, colsum)


def interleaved_group_linear_triton(
    parts: Sequence[Tensor],
    weight: Tensor,
    bias: Tensor | None,
    shuffle: bool,
    *,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The fused GLT over one or two parts read in place, its products and output in ``dtype``
    (default the parts'); see :class:`InterleavedGroupLinearTriton`.

    Shape:
        parts (N, d_j) (unit feature stride), weight (g, k, n), bias (g, n) or None -> (N, g*n)
    """
    dtype = parts[0].dtype if dtype is None else dtype
    return InterleavedGroupLinearTriton.apply(weight, bias, shuffle, dtype, *parts)
