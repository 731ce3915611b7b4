"""The PRU's recurrence on CUDA: per step, the grouped context product by cuBLAS and the cell
equations in one Triton launch; backward through time the same way round.

The contract and its oracle are :mod:`src.kernels.pru_recurrence`. Forward, step t is

    context = bmm(h_{t-1} chunks (g, B, w), W)           (g, B, 4w), cuBLAS, no bias
    a = P_t + (context + bias)                           (B, 4, M), gates (f, g, i, o)
    c_t = sigmoid(a_f) c_{t-1} + sigmoid(a_i) tanh(a_g),  h_t = sigmoid(a_o) tanh(c_t)

the second and third lines being :func:`_pru_cell_fwd_kernel`, which keeps the activated gates
(sigmoid f, tanh g, sigmoid i, sigmoid o) and the cells when a gradient is wanted: nothing else is
saved. Backward, from t = T - 1 down to 0, :func:`_pru_cell_bwd_kernel` takes the output gradient
plus the recurrent one (``bmm(dG_{t+1}, W^T)``, the incoming gradient of h_T at the last step) and
the carried cell gradient, and writes the pre-activation gradient dG_t, once as the inputs'
gradient (B, 4, M) and once in the context's group-major layout (g, B, 4w). After the loop the
weight gradient is one product over all T B rows, ``dW_j = Hprev_j^T dG_j`` with
Hprev = (h_0, h_1 .. h_{T-1}), and the bias gradient one sum of dG over T and B.

Storage is float32, bfloat16 or float16 (one dtype for all operands); the cell equations run in
float32 and round once on store, and the carried cell gradient stays float32 across steps. Cells
and activated gates are kept in the storage dtype. float64 stays on the reference path: it is
refused here with a TypeError.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.dispatch import autocast_off, autocast_operands, check_same_dtype
from src.kernels.pru_recurrence.contract import GATES, check_recurrence_operands
from src.kernels.triton.launch import gpu_launch

BLOCK_GPU = 1024  # (b, m) elements per program; the kernels are memory-bound element-wise passes
BLOCK_INTERPRETER = 1 << 16
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _tanh(x):
    """tanh in float32 (Cephes' tanhf, within about 2 ulp): Triton's own (libdevice) does not run
    in the interpreter, and ``2 sigmoid(2x) - 1`` loses the relative precision of small x."""
    ax = tl.abs(x)
    # each branch on its own arguments only: no overflow, and NaN stays NaN
    near = ax < 0.625
    xs = tl.where(near, x, 0.0)
    z = xs * xs
    small = (
        (((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
         + 1.33314422036e-1) * z
        - 3.33332819422e-1
    ) * z * xs + xs  # fmt: skip
    e = tl.exp(-2.0 * ax)  # at most 0.29 here: 1 - e keeps its precision
    large = (1.0 - e) / (1.0 + e)
    large = tl.where(x < 0, -large, large)
    return tl.where(near, small, large)


@triton.jit
def _element(B, M, W, BLOCK: tl.constexpr):
    """This program's flat (b, m) indices n of the (B, M) state and their batch row b, hidden
    position m, group j and position k within the group (m = j W + k)."""
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = n < B * M
    b = n // M
    m = n - b * M
    j = m // W
    k = m - j * W
    return n, inside, b, m, j, k


@triton.jit
def _preactivation(pre_row, ctx_row, bias_row, q, M, W, inside, HAS_BIAS: tl.constexpr):
    """Gate q's a = P + (context + bias) in float32, the reference's order of additions."""
    context = tl.load(ctx_row + q * W, mask=inside, other=0.0).to(tl.float32)
    if HAS_BIAS:
        context += tl.load(bias_row + q * W, mask=inside, other=0.0).to(tl.float32)
    return tl.load(pre_row + q * M, mask=inside, other=0.0).to(tl.float32) + context


@triton.jit
def _store_gates(row, stride, f, g, i, o, inside):
    """The four gates' values (f, g, i, o) at row, row + stride, ..., in row's element type."""
    ty = row.dtype.element_ty
    tl.store(row, f.to(ty), mask=inside)
    tl.store(row + stride, g.to(ty), mask=inside)
    tl.store(row + 2 * stride, i.to(ty), mask=inside)
    tl.store(row + 3 * stride, o.to(ty), mask=inside)


@triton.jit
def _pru_cell_fwd_kernel(
    pre_ptr, ctx_ptr, bias_ptr, c_prev_ptr, h_ptr, c_ptr, gates_ptr,
    B, M, W,
    HAS_BIAS: tl.constexpr, SAVE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One step's cell equations.

    Shape:
        pre (B, 4, M), ctx (g, B, 4w) without bias, bias (g, 4w) (read if HAS_BIAS),
        c_prev (B, M) -> h (B, M), c (B, M), gates (B, 4, M) activated (written if SAVE);
        all contiguous
    """
    n, inside, b, m, j, k = _element(B, M, W, BLOCK)
    pre_row = pre_ptr + b * (4 * M) + m
    ctx_row = ctx_ptr + (j * B + b) * (4 * W) + k
    bias_row = bias_ptr + j * (4 * W) + k
    f = tl.sigmoid(_preactivation(pre_row, ctx_row, bias_row, 0, M, W, inside, HAS_BIAS))
    g = _tanh(_preactivation(pre_row, ctx_row, bias_row, 1, M, W, inside, HAS_BIAS))
    i = tl.sigmoid(_preactivation(pre_row, ctx_row, bias_row, 2, M, W, inside, HAS_BIAS))
    o = tl.sigmoid(_preactivation(pre_row, ctx_row, bias_row, 3, M, W, inside, HAS_BIAS))
    c_prev = tl.load(c_prev_ptr + n, mask=inside, other=0.0).to(tl.float32)
    c = f * c_prev + i * g
    h = o * _tanh(c)
    tl.store(h_ptr + n, h.to(h_ptr.dtype.element_ty), mask=inside)
    tl.store(c_ptr + n, c.to(c_ptr.dtype.element_ty), mask=inside)
    if SAVE:
        _store_gates(gates_ptr + b * (4 * M) + m, M, f, g, i, o, inside)


@triton.jit
def _pru_cell_bwd_kernel(
    grad_h_ptr, rec_ptr, grad_c_ptr, gates_ptr, c_prev_ptr, c_ptr, grad_pre_ptr, grad_ctx_ptr,
    B, M, W, ctx_group_stride,
    REC_GROUPED: tl.constexpr, WRITE_PRE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One step's cell equations backward; grad_c is updated in place to the previous cell's.

    Shape:
        grad_h (B, M), rec (g, B, w) if REC_GROUPED else (B, M), grad_c (B, M) float32,
        gates (B, 4, M) activated, c_prev and c (B, M)
        -> grad_pre (B, 4, M) (written if WRITE_PRE), grad_ctx (g, B, 4w) with group stride
        ``ctx_group_stride``, grad_c (B, M); all contiguous but grad_ctx's group dimension
    """
    n, inside, b, m, j, k = _element(B, M, W, BLOCK)
    gates_row = gates_ptr + b * (4 * M) + m
    f = tl.load(gates_row, mask=inside, other=0.0).to(tl.float32)
    g = tl.load(gates_row + M, mask=inside, other=0.0).to(tl.float32)
    i = tl.load(gates_row + 2 * M, mask=inside, other=0.0).to(tl.float32)
    o = tl.load(gates_row + 3 * M, mask=inside, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + n, mask=inside, other=0.0).to(tl.float32)
    c_prev = tl.load(c_prev_ptr + n, mask=inside, other=0.0).to(tl.float32)
    dh = tl.load(grad_h_ptr + n, mask=inside, other=0.0).to(tl.float32)
    if REC_GROUPED:
        dh += tl.load(rec_ptr + (j * B + b) * W + k, mask=inside, other=0.0).to(tl.float32)
    else:
        dh += tl.load(rec_ptr + n, mask=inside, other=0.0).to(tl.float32)
    tanh_c = _tanh(c)
    dc = tl.load(grad_c_ptr + n, mask=inside, other=0.0) + dh * o * (1.0 - tanh_c * tanh_c)
    d_f = dc * c_prev * f * (1.0 - f)
    d_g = dc * i * (1.0 - g * g)
    d_i = dc * g * i * (1.0 - i)
    d_o = dh * tanh_c * o * (1.0 - o)
    tl.store(grad_c_ptr + n, dc * f, mask=inside)
    if WRITE_PRE:
        _store_gates(grad_pre_ptr + b * (4 * M) + m, M, d_f, d_g, d_i, d_o, inside)
    ctx_row = grad_ctx_ptr + j * ctx_group_stride + b * (4 * W) + k
    _store_gates(ctx_row, W, d_f, d_g, d_i, d_o, inside)


def _launch(elements: int, on_gpu: bool) -> tuple[tuple[int], dict]:
    block = BLOCK_GPU if on_gpu else min(BLOCK_INTERPRETER, triton.next_power_of_2(elements))
    return (triton.cdiv(elements, block),), {"BLOCK": block}


def _chunks(h: Tensor, groups: int) -> Tensor:
    """(B, M) -> (g, B, w): the GLT's group-major view of a state, no copy."""
    return h.view(h.shape[0], groups, -1).transpose(0, 1)


class PRURecurrenceTriton(torch.autograd.Function):
    """All steps of the recurrence, forward and backward, by cuBLAS products and the cell kernels.
    The operands are contiguous and of one dtype in :data:`DTYPES`, with T, B >= 1
    (:func:`pru_recurrence_triton` sees to it)."""

    @staticmethod
    def forward(
        ctx, inputs: Tensor, weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        steps, batch, _, hidden = inputs.shape
        groups, width = weight.shape[0], weight.shape[1]
        save = any(ctx.needs_input_grad)
        grid, meta = _launch(batch * hidden, gpu_launch(inputs))
        output = inputs.new_empty(steps, batch, hidden)
        # without a gradient to come, two cells in turn are enough
        cells = inputs.new_empty(steps if save else 2, batch, hidden)
        # not written without a gradient to come: any tensor of the inputs' dtype stands in
        gates = inputs.new_empty(steps, batch, GATES, hidden) if save else inputs
        context = inputs.new_empty(groups, batch, GATES * width)
        with autocast_off(inputs.device.type):
            h, c = h0, c0
            for t in range(steps):
                torch.bmm(_chunks(h, groups), weight, out=context)
                h, c = output[t], cells[t if save else t % 2]
                _pru_cell_fwd_kernel[grid](
                    inputs[t], context, bias if bias is not None else context,
                    c0 if t == 0 else cells[t - 1 if save else (t - 1) % 2], h, c,
                    gates[t],
                    batch, hidden, width,
                    HAS_BIAS=bias is not None, SAVE=save, **meta,
                )  # fmt: skip
        if save:
            ctx.save_for_backward(output, cells, gates, h0, c0, weight)
        # copies: outputs that are views of another output or of a saved tensor could not be
        # modified in place
        return output, h.clone(), c.clone()

    @staticmethod
    def backward(
        ctx, grad_output: Tensor, grad_h_last: Tensor, grad_c_last: Tensor
    ) -> tuple[Tensor | None, ...]:
        output, cells, gates, h0, c0, weight = ctx.saved_tensors
        want_inputs, want_weight, want_bias, want_h0, want_c0 = ctx.needs_input_grad
        steps, batch, hidden = output.shape
        groups, width = weight.shape[0], weight.shape[1]
        grid, meta = _launch(batch * hidden, gpu_launch(output))
        grad_output = grad_output.contiguous()
        grad_c = grad_c_last.to(torch.float32, copy=True).contiguous()  # carried, in place
        # dG of every step when the weight or bias gradient needs them, else of one step at a time
        kept = steps if want_weight or want_bias else 1
        grad_context = output.new_empty(groups, kept, batch, GATES * width)  # (g, T, B, 4w)
        grad_inputs = output.new_empty(steps, batch, GATES, hidden) if want_inputs else None
        recurrent = output.new_empty(groups, batch, width)
        weight_t = weight.transpose(1, 2)  # (g, 4w, w)
        with autocast_off(output.device.type):
            for t in reversed(range(steps)):
                if t == steps - 1:
                    rec = grad_h_last.contiguous()
                else:
                    torch.bmm(grad_context[:, (t + 1) % kept], weight_t, out=recurrent)
                    rec = recurrent
                _pru_cell_bwd_kernel[grid](
                    grad_output[t], rec, grad_c, gates[t],
                    c0 if t == 0 else cells[t - 1], cells[t],
                    grad_inputs[t] if grad_inputs is not None else grad_output,
                    grad_context[:, t % kept],
                    batch, hidden, width, grad_context.stride(0),
                    REC_GROUPED=t < steps - 1, WRITE_PRE=grad_inputs is not None, **meta,
                )  # fmt: skip
            grad_h0 = grad_weight = grad_bias = None
            if want_h0:
                grad_h0 = torch.bmm(grad_context[:, 0], weight_t)  # (g, B, w)
                grad_h0 = grad_h0.transpose(0, 1).reshape(batch, hidden)
            rows = grad_context.view(groups, kept * batch, GATES * width)  # (g, T B, 4w)
            if want_weight:
                previous = torch.cat([h0.unsqueeze(0), output[:-1]])  # (T, B, M): h_0 .. h_{T-1}
                previous = previous.view(steps * batch, groups, width).permute(1, 2, 0)
                grad_weight = torch.bmm(previous, rows)  # (g, w, T B) @ (g, T B, 4w)
            if want_bias:
                grad_bias = rows.sum(1, dtype=torch.float32).to(output.dtype)
        grad_c0 = grad_c.to(c0.dtype) if want_c0 else None
        return grad_inputs, grad_weight, grad_bias, grad_h0, grad_c0


def pru_recurrence_triton(
    inputs: Tensor, weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """All steps of the recurrence by the cell kernels (:func:`fused_recurrence`).

    Shape:
        as :func:`fused_recurrence`
    """
    return fused_recurrence(
        "the fused PRU recurrence", "pru_recurrence_triton", PRURecurrenceTriton.apply,
        inputs, weight, bias, h0, c0,
    )  # fmt: skip


def fused_recurrence(
    what: str,
    op: str,
    run: Callable[..., tuple[Tensor, Tensor, Tensor]],
    inputs: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    h0: Tensor,
    c0: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """All steps of the recurrence by ``run``, one of the fused paths (``what``, named ``op`` in
    dtype errors), on its operands as :func:`kernel_operands` gives them; the contract of
    :func:`src.kernels.pru_recurrence.pru_recurrence_reference`, differentiable in every operand.

    Under ``torch.autocast`` the operands are first cast to its dtype (float32 parameters keep
    float32 gradients). An empty sequence (T = 0) passes the state through; an empty batch
    (B M = 0) is refused (:func:`src.kernels.pru_recurrence.pru_recurrence` leaves it to the
    reference).

    Shape:
        inputs (T, B, 4, M), weight (g, w, 4w) with M = g w, bias (g, 4w) or None, h0 and c0
        (B, M), all float32, bfloat16 or float16 -> output (T, B, M), h_T (B, M), c_T (B, M)
    """
    steps, operands = kernel_operands(what, op, inputs, weight, bias, h0, c0)
    if steps == 0:  # no step: the state passes through, as the reference's loop leaves it
        inputs, _, _, h0, c0 = operands
        return inputs.new_empty(0, *h0.shape), h0, c0
    return run(*operands)


def kernel_operands(
    what: str, op: str, inputs: Tensor, weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor
) -> tuple[int, tuple[Tensor | None, ...]]:
    """The checks both fused recurrences (``what``, named ``op`` in dtype errors) make of their
    operands, and the operands as their kernels take them: cast as ``torch.autocast`` casts,
    contiguous. Returns T and (inputs, weight, bias, h0, c0)."""
    steps, batch, hidden, *_ = check_recurrence_operands(inputs, weight, bias, h0, c0)
    if batch * hidden == 0:
        raise ValueError(f"{what} needs B, M >= 1, got inputs of shape {tuple(inputs.shape)}")
    operands = autocast_operands(inputs.device.type, inputs, weight, bias, h0, c0)
    dtype = check_same_dtype(op, **dict(zip(("inputs", "weight", "bias", "h0", "c0"), operands)))
    if dtype not in DTYPES:
        raise TypeError(f"{what} takes {DTYPES}, got {dtype}")
    return steps, tuple(t.contiguous() if t is not None else None for t in operands)
