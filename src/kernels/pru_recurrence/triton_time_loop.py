"""The PRU's recurrence on CUDA as one Triton launch each way: the kernels loop over time.

The contract and its oracle are :mod:`src.kernels.pru_recurrence`. The recurrent product is the
context GLT, block-diagonal over the g groups: group j's units of h_t depend on group j's units of
h_{t-1} only (``h_j @ W_j``), and every (b, m) on row b alone. So one program per (group, tile of
batch rows) runs all T steps of its block of the state, and no program waits on another: the grid
is (g, ceil(B / BLOCK_B)). At step t a program

    for each block of BLOCK_N of its w units (columns n):
        a_q = P_t[:, q, n] + (h_{t-1} @ W_j[:, q w + n] + b_j[q w + n])    q = f, g, i, o
        c_t = sigmoid(a_f) c_{t-1} + sigmoid(a_i) tanh(a_g),  h_t = sigmoid(a_o) tanh(c_t)

reading h_{t-1} back from the output it wrote one step earlier (h_0 at t = 0) in blocks of
BLOCK_K, W_j from memory (PTB's group is 350 x 1400, far beyond registers; it stays in L2), and
c_{t-1} from the cells. A barrier between steps makes the step's stores visible to all the
program's threads. Like the per-step kernels (:mod:`src.kernels.pru_recurrence.triton_kernel`) it
keeps the activated gates and the cells when a gradient is wanted, else two cells in turn.

Backward, t = T - 1 .. 0, the same grid: the output gradient plus the recurrent one
(``dG_{t+1} @ W_j^T``, the incoming gradient of h_T at the last step) and the carried cell
gradient give the pre-activation gradient dG_t, written to the inputs' gradient (B, 4, M) of step
t, which the next iteration reads back for its recurrent product. The carried cell gradient
stays float32, in two slots in turn. After the loop the same product of dG_0 gives h_0's
gradient. The weight gradient is one product over all T B rows after the launch,
``dW_j = Hprev_j^T dG_j`` with Hprev = (h_0, h_1 .. h_{T-1}), and the bias gradient one sum of dG:
per step inside the loop they would be T read-modify-writes of every group's w x 4w block.

Storage is float32, bfloat16 or float16 (one dtype for all operands); products accumulate and the
cell equations run in float32, rounding once on store. float32 products are exact unless PyTorch
allows TF32 matmuls. Unlike the per-step path, the context is not rounded to the storage dtype
before the bias and P are added.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from src.kernels.custom_ops import autograd_op
from src.kernels.dispatch import autocast_off, opaque_op
from src.kernels.pru_recurrence import contract as contract
from src.kernels.pru_recurrence.contract import GATES
from src.kernels.pru_recurrence.triton_kernel import _tanh, fused_recurrence
from src.kernels.triton.launch import gpu_launch

BLOCK_B_GPU = 16  # batch rows of one program: tl.dot's smallest tile; more rows, fewer programs
BLOCK_K_GPU = 32  # units of h (or of one gate of dG) reduced per product block
BLOCK_N_GPU = 64  # units of the state written per column block
# the interpreter's blocks are the smallest, so that the tests' widths above 16 run several
# blocks of K and N (the loops the GPU runs at PTB's w = 350)
BLOCK_INTERPRETER = 16
WARPS_GPU = 8  # one program per SM at PTB sizes (g B / 16 = 8): two warps a scheduler hide latency
GATES_ = tl.constexpr(GATES)  # the kernels' copy of the gate count


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr, WIDEN: tl.constexpr):
    """acc + a @ b in float32; WIDEN: 16-bit operands widened first (the interpreter's tl.dot
    multiplies bfloat16 bit patterns as integers, triton-lang/triton#11584); IEEE: float32
    operands without TF32."""
    if WIDEN:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b.to(a.dtype), acc)


@triton.jit
def _preactivation(acc, pre_rows, bias_group, q, ns, M, W, tile, n_in, HAS_BIAS: tl.constexpr):
    """Gate q's a = P + (context + bias) in float32, the reference's order of additions.

    Shape: acc (BLOCK_B, BLOCK_N) the context of columns ns; pre_rows (BLOCK_B,) pointers to the
    group's first unit of P_t's rows."""
    if HAS_BIAS:
        acc += tl.load(bias_group + q * W + ns, mask=n_in, other=0.0).to(tl.float32)[None, :]
    pre = tl.load(pre_rows[:, None] + q * M + ns[None, :], mask=tile, other=0.0)
    return pre.to(tl.float32) + acc


@triton.jit
def _pru_time_loop_fwd_kernel(
    pre_ptr, weight_ptr, bias_ptr, h0_ptr, c0_ptr, out_ptr, cells_ptr, gates_ptr,
    T, B, M, W, cell_slots,
    HAS_BIAS: tl.constexpr, SAVE: tl.constexpr, IEEE: tl.constexpr, WIDEN: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """All T steps of group program_id(0)'s units for batch rows of tile program_id(1).

    Shape:
        pre (T, B, 4, M), weight (g, w, 4w), bias (g, 4w) (read if HAS_BIAS), h0 and c0 (B, M)
        -> out (T, B, M), cells (cell_slots, B, M) (c_t in slot t % cell_slots: T slots if SAVE,
        else 2), gates (T, B, 4, M) activated (written if SAVE); all contiguous, M = g W
    """
    j = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    b_in = b < B
    ks0 = tl.arange(0, BLOCK_K)
    ns0 = tl.arange(0, BLOCK_N)
    unit = j * W  # the group's first unit of M
    w_group = weight_ptr + j * W * (GATES_ * W)
    bias_group = bias_ptr + j * (GATES_ * W)
    for t in range(T):
        if t == 0:
            h_rows = h0_ptr + b * M + unit
            c_rows = c0_ptr + b * M + unit
        else:
            h_rows = out_ptr + ((t - 1) * B + b) * M + unit
            c_rows = cells_ptr + (((t - 1) % cell_slots) * B + b) * M + unit
        pre_rows = pre_ptr + (t * B + b) * (GATES_ * M) + unit
        out_rows = out_ptr + (t * B + b) * M + unit
        cell_rows = cells_ptr + ((t % cell_slots) * B + b) * M + unit
        for n0 in range(0, W, BLOCK_N):
            ns = n0 + ns0
            n_in = ns < W
            tile = b_in[:, None] & n_in[None, :]
            acc_f = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            acc_g = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            acc_i = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            acc_o = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, W, BLOCK_K):
                ks = k0 + ks0
                k_in = ks < W
                # .cg: h_{t-1} was stored by this program's other threads (L2, not L1)
                h = tl.load(h_rows[:, None] + ks[None, :], mask=b_in[:, None] & k_in[None, :],
                            other=0.0, cache_modifier=".cg")  # fmt: skip
                w_cols = w_group + ks[:, None] * (GATES_ * W) + ns[None, :]
                w_mask = k_in[:, None] & n_in[None, :]
                w_f = tl.load(w_cols, mask=w_mask, other=0.0)
                w_g = tl.load(w_cols + W, mask=w_mask, other=0.0)
                w_i = tl.load(w_cols + 2 * W, mask=w_mask, other=0.0)
                w_o = tl.load(w_cols + 3 * W, mask=w_mask, other=0.0)
                acc_f = _dot(h, w_f, acc_f, IEEE, WIDEN)
                acc_g = _dot(h, w_g, acc_g, IEEE, WIDEN)
                acc_i = _dot(h, w_i, acc_i, IEEE, WIDEN)
                acc_o = _dot(h, w_o, acc_o, IEEE, WIDEN)
            a_f = _preactivation(acc_f, pre_rows, bias_group, 0, ns, M, W, tile, n_in, HAS_BIAS)
            a_g = _preactivation(acc_g, pre_rows, bias_group, 1, ns, M, W, tile, n_in, HAS_BIAS)
            a_i = _preactivation(acc_i, pre_rows, bias_group, 2, ns, M, W, tile, n_in, HAS_BIAS)
            a_o = _preactivation(acc_o, pre_rows, bias_group, 3, ns, M, W, tile, n_in, HAS_BIAS)
            f = tl.sigmoid(a_f)
            g = _tanh(a_g)
            i = tl.sigmoid(a_i)
            o = tl.sigmoid(a_o)
            c_prev = tl.load(c_rows[:, None] + ns[None, :], mask=tile, other=0.0,
                             cache_modifier=".cg")  # fmt: skip
            c = f * c_prev.to(tl.float32) + i * g
            h_new = o * _tanh(c)
            tl.store(out_rows[:, None] + ns[None, :], h_new.to(out_ptr.dtype.element_ty), mask=tile)
            tl.store(cell_rows[:, None] + ns[None, :], c.to(cells_ptr.dtype.element_ty), mask=tile)
            if SAVE:
                gate_cols = gates_ptr + ((t * B + b) * (GATES_ * M) + unit)[:, None] + ns[None, :]
                ty = gates_ptr.dtype.element_ty
                tl.store(gate_cols, f.to(ty), mask=tile)
                tl.store(gate_cols + M, g.to(ty), mask=tile)
                tl.store(gate_cols + 2 * M, i.to(ty), mask=tile)
                tl.store(gate_cols + 3 * M, o.to(ty), mask=tile)
        # h_t and c_t, stored by all threads, are read by all at step t + 1
        tl.debug_barrier()


@triton.jit
def _recurrent(dg_rows, w_group, ns, n_in, b_in, M, W, IEEE: tl.constexpr, WIDEN: tl.constexpr,
               BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Columns ns of dG @ W_j^T: the gradient that a step's pre-activations send to the group's
    units of the previous state, in float32.

    Shape: dg_rows (BLOCK_B,) pointers to the group's first unit of dG's (4, M) rows
    -> (BLOCK_B, BLOCK_N)"""
    ks0 = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
    for q in tl.static_range(GATES_):
        for k0 in range(0, W, BLOCK_K):
            ks = k0 + ks0
            k_in = ks < W
            dg = tl.load(dg_rows[:, None] + q * M + ks[None, :], mask=b_in[:, None] & k_in[None, :],
                         other=0.0, cache_modifier=".cg")  # fmt: skip
            # W_j^T's block: element (k, n) is W_j[n, q w + k]
            w_t = tl.load(w_group + ns[None, :] * (GATES_ * W) + q * W + ks[:, None],
                          mask=k_in[:, None] & n_in[None, :], other=0.0)  # fmt: skip
            acc = _dot(dg, w_t, acc, IEEE, WIDEN)
    return acc


@triton.jit
def _pru_time_loop_bwd_kernel(
    grad_out_ptr, grad_h_last_ptr, gates_ptr, cells_ptr, c0_ptr, weight_ptr,
    grad_pre_ptr, grad_c_ptr, grad_h0_ptr,
    T, B, M, W, pre_slots,
    WANT_H0: tl.constexpr, IEEE: tl.constexpr, WIDEN: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """All T steps backward of group program_id(0)'s units for batch rows of tile program_id(1).

    Shape:
        grad_out (T, B, M), grad_h_last (B, M), gates (T, B, 4, M) activated, cells (T, B, M),
        c0 (B, M), weight (g, w, 4w), grad_c (2, B, M) float32 holding h_T's cell gradient in
        slot T % 2 -> grad_pre (pre_slots, B, 4, M) (dG_t in slot t % pre_slots), grad_c (the
        gradient of c_t in slot t % 2, of c_0 in slot 0 at the end), grad_h0 (B, M) (written if
        WANT_H0); all contiguous, M = g W
    """
    j = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    b_in = b < B
    ns0 = tl.arange(0, BLOCK_N)
    unit = j * W
    w_group = weight_ptr + j * W * (GATES_ * W)
    for s in range(T):
        t = T - 1 - s
        if t == 0:
            c_prev_rows = c0_ptr + b * M + unit
        else:
            c_prev_rows = cells_ptr + ((t - 1) * B + b) * M + unit
        rows = (t * B + b) * M + unit  # of grad_out and cells at step t
        gate_rows = gates_ptr + (t * B + b) * (GATES_ * M) + unit
        dg_rows = grad_pre_ptr + ((t % pre_slots) * B + b) * (GATES_ * M) + unit
        dg_next_rows = grad_pre_ptr + (((t + 1) % pre_slots) * B + b) * (GATES_ * M) + unit
        dc_next_rows = grad_c_ptr + (((t + 1) % 2) * B + b) * M + unit
        dc_rows = grad_c_ptr + ((t % 2) * B + b) * M + unit
        for n0 in range(0, W, BLOCK_N):
            ns = n0 + ns0
            n_in = ns < W
            tile = b_in[:, None] & n_in[None, :]
            cols = ns[None, :]
            if t == T - 1:
                dh = tl.load(grad_h_last_ptr + (b * M + unit)[:, None] + cols, mask=tile,
                             other=0.0).to(tl.float32)  # fmt: skip
            else:
                dh = _recurrent(dg_next_rows, w_group, ns, n_in, b_in, M, W, IEEE, WIDEN,
                                BLOCK_B, BLOCK_K, BLOCK_N)  # fmt: skip
            dh += tl.load(grad_out_ptr + rows[:, None] + cols, mask=tile, other=0.0).to(tl.float32)
            f = tl.load(gate_rows[:, None] + cols, mask=tile, other=0.0).to(tl.float32)
            g = tl.load(gate_rows[:, None] + M + cols, mask=tile, other=0.0).to(tl.float32)
            i = tl.load(gate_rows[:, None] + 2 * M + cols, mask=tile, other=0.0).to(tl.float32)
            o = tl.load(gate_rows[:, None] + 3 * M + cols, mask=tile, other=0.0).to(tl.float32)
            c = tl.load(cells_ptr + rows[:, None] + cols, mask=tile, other=0.0).to(tl.float32)
            c_prev = tl.load(c_prev_rows[:, None] + cols, mask=tile, other=0.0).to(tl.float32)
            tanh_c = _tanh(c)
            dc = tl.load(dc_next_rows[:, None] + cols, mask=tile, other=0.0, cache_modifier=".cg")
            dc += dh * o * (1.0 - tanh_c * tanh_c)
            ty = grad_pre_ptr.dtype.element_ty
            dg_cols = dg_rows[:, None] + cols
            tl.store(dg_cols, (dc * c_prev * f * (1.0 - f)).to(ty), mask=tile)
            tl.store(dg_cols + M, (dc * i * (1.0 - g * g)).to(ty), mask=tile)
            tl.store(dg_cols + 2 * M, (dc * g * i * (1.0 - i)).to(ty), mask=tile)
            tl.store(dg_cols + 3 * M, (dh * tanh_c * o * (1.0 - o)).to(ty), mask=tile)
            tl.store(dc_rows[:, None] + cols, dc * f, mask=tile)
        # dG_t and the cell gradient, stored by all threads, are read by all at step t - 1
        tl.debug_barrier()
    if WANT_H0:
        dg_rows = grad_pre_ptr + b * (GATES_ * M) + unit  # dG_0, slot 0
        for n0 in range(0, W, BLOCK_N):
            ns = n0 + ns0
            n_in = ns < W
            dh0 = _recurrent(dg_rows, w_group, ns, n_in, b_in, M, W, IEEE, WIDEN,
                             BLOCK_B, BLOCK_K, BLOCK_N)  # fmt: skip
            tl.store(
                grad_h0_ptr + (b * M + unit)[:, None] + ns[None, :],
                dh0.to(grad_h0_ptr.dtype.element_ty),
                mask=b_in[:, None] & n_in[None, :],
            )


def _launch(x: Tensor, batch: int, groups: int, width: int) -> tuple[tuple[int, int], dict]:
    """The grid (g, batch tiles) and the blocks and products of a launch on ``x``'s dtype."""
    on_gpu = gpu_launch(x)
    if on_gpu:
        block_k = max(16, min(BLOCK_K_GPU, triton.next_power_of_2(width)))
        block_n = max(16, min(BLOCK_N_GPU, triton.next_power_of_2(width)))
        meta = {"BLOCK_B": BLOCK_B_GPU, "BLOCK_K": block_k, "BLOCK_N": block_n,
                "num_warps": WARPS_GPU}  # fmt: skip
    else:
        meta = dict.fromkeys(("BLOCK_B", "BLOCK_K", "BLOCK_N"), BLOCK_INTERPRETER)
    widen = not on_gpu and x.dtype != torch.float32
    ieee = widen or (
        x.dtype == torch.float32 and not (x.is_cuda and torch.backends.cuda.matmul.allow_tf32)
    )
    meta.update(IEEE=ieee, WIDEN=widen)
    return (groups, triton.cdiv(batch, meta["BLOCK_B"])), meta


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    """Keeps what :func:`_backward` reads: the outputs, cells, gates, initial state and weight."""
    _, weight, bias, h0, c0, save = inputs
    output, _, _, cells, gates = output
    ctx.mark_non_differentiable(cells, gates)
    if save:
        ctx.save_for_backward(output, cells, gates, h0, c0, weight)
    ctx.has_bias = bias is not None


def _backward(
    ctx, grad_output: Tensor, grad_h_last: Tensor, grad_c_last: Tensor, *_: Tensor
) -> tuple[Tensor | None, ...]:
    """The gradients of (inputs, weight, bias, h0, c0, save) by the backward launch; the cells' and
    gates' incoming gradients (non-differentiable outputs) are ignored."""
    output, cells, gates, h0, c0, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad
    wanted = [needs[0], needs[1], needs[2] and ctx.has_bias, needs[3], needs[4]]
    incoming = (grad_output, grad_h_last, grad_c_last)
    with autocast_off(output.device.type):
        grads = iter(time_loop_backward(
            *(g.contiguous() for g in incoming), output, cells, gates, h0, c0, weight, wanted
        ))  # fmt: skip
    return (*(next(grads) if want else None for want in wanted), None)


@autograd_op(
    "lightnets::pru_time_loop",
    contract.TIME_LOOP_SCHEMA,
    contract.time_loop_like,
    setup_context=_setup_context,
    backward=_backward,
)
def time_loop_forward(
    inputs: Tensor, weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor, save: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """All steps forward in one launch: (output, h_T, c_T, cells, gates), the last two what the
    backward reads (empty unless ``save``, which the gradient needs).

    Shape:
        inputs (T, B, 4, M), weight (g, w, 4w), bias (g, 4w) or None, h0 and c0 (B, M), all
        contiguous, of one dtype, T, B, M >= 1 -> output (T, B, M), h_T and c_T (B, M),
        cells (T, B, M), gates (T, B, 4, M) activated
    """
    steps, batch, _, hidden = inputs.shape
    groups, width = weight.shape[0], weight.shape[1]
    grid, meta = _launch(inputs, batch, groups, width)
    output = inputs.new_empty(steps, batch, hidden)
    # without a gradient to come, two cells in turn are enough
    cells = inputs.new_empty(steps if save else 2, batch, hidden)
    gates = inputs.new_empty(steps, batch, GATES, hidden) if save else inputs.new_empty(0)
    _pru_time_loop_fwd_kernel[grid](
        inputs, weight, bias if bias is not None else weight, h0, c0, output, cells,
        gates if save else output,
        steps, batch, hidden, width, cells.shape[0],
        HAS_BIAS=bias is not None, SAVE=save, **meta,
    )  # fmt: skip
    c_last = cells[(steps - 1) % cells.shape[0]].clone()
    # a copy: an output may not alias another (h_T is output[-1])
    return output, output[-1].clone(), c_last, cells if save else inputs.new_empty(0), gates


@opaque_op(
    "lightnets::pru_time_loop_backward",
    contract.TIME_LOOP_BACKWARD_SCHEMA,
    contract.time_loop_grads_like,
)
def time_loop_backward(
    grad_output: Tensor,
    grad_h_last: Tensor,
    grad_c_last: Tensor,
    output: Tensor,
    cells: Tensor,
    gates: Tensor,
    h0: Tensor,
    c0: Tensor,
    weight: Tensor,
    wanted: Sequence[bool],
) -> list[Tensor]:
    """All steps backward in one launch, then the weight and bias gradients as one product and
    one sum: the gradients of (inputs, weight, bias, h0, c0) that ``wanted`` asks for, in that
    order.

    Shape:
        grad_output (T, B, M), grad_h_last and grad_c_last (B, M), output and cells (T, B, M),
        gates (T, B, 4, M), h0 and c0 (B, M), weight (g, w, 4w); all contiguous
        -> [(T, B, 4, M)], [(g, w, 4w)], [(g, 4w)], [(B, M)], [(B, M)]
    """
    want_inputs, want_weight, want_bias, want_h0, want_c0 = wanted
    steps, batch, hidden = output.shape
    groups, width = weight.shape[0], weight.shape[1]
    grid, meta = _launch(output, batch, groups, width)
    # dG of every step when the inputs', weight's or bias's gradient needs them, else two in turn
    slots = steps if want_inputs or want_weight or want_bias else 2
    grad_pre = output.new_empty(slots, batch, GATES, hidden)
    grad_c = torch.empty(2, batch, hidden, dtype=torch.float32, device=output.device)
    grad_c[steps % 2] = grad_c_last
    grad_h0 = torch.empty_like(h0) if want_h0 else h0
    _pru_time_loop_bwd_kernel[grid](
        grad_output, grad_h_last, gates, cells, c0, weight, grad_pre, grad_c, grad_h0,
        steps, batch, hidden, width, slots,
        WANT_H0=want_h0, **meta,
    )  # fmt: skip
    grads = []
    if want_inputs:
        grads.append(grad_pre)
    if want_weight or want_bias:
        # (T, B, 4, M) -> (T B, 4, g, w) -> (g, T B, 4, w): dG_j's rows, its columns gate-major
        per_group = grad_pre.view(steps * batch, GATES, groups, width).permute(2, 0, 1, 3)
    if want_weight:
        previous = torch.cat([h0.unsqueeze(0), output[:-1]])  # (T, B, M): h_0 .. h_{T-1}
        previous = previous.view(steps * batch, groups, width).permute(1, 2, 0)  # (g, w, T B)
        rows = per_group.reshape(groups, steps * batch, GATES * width)  # (g, T B, 4w)
        grads.append(torch.bmm(previous, rows))
    if want_bias:
        # (g, T B, 4, w) -> (g, 4, w) -> (g, 4w)
        grads.append(per_group.sum(1, dtype=torch.float32).to(output.dtype).flatten(1))
    if want_h0:
        grads.append(grad_h0)
    if want_c0:
        grads.append(grad_c[0].to(c0.dtype, copy=True))
    return grads


def pru_recurrence_time_loop(
    inputs: Tensor, weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """All steps of the recurrence by the time-loop kernels, one launch each way
    (:func:`~src.kernels.pru_recurrence.triton_kernel.fused_recurrence`).

    Shape:
        as :func:`~src.kernels.pru_recurrence.triton_kernel.fused_recurrence`
    """
    return fused_recurrence(
        "the PRU time loop", "pru_recurrence_time_loop", _time_loop, inputs, weight, bias, h0, c0
    )


def _time_loop(
    inputs: Tensor, weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    # the cells and gates are kept only for a gradient to come
    save = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (inputs, weight, bias, h0, c0)
    )
    with autocast_off(inputs.device.type):
        return time_loop_forward(inputs, weight, bias, h0, c0, save)[:3]
