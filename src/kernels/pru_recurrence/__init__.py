"""The PRU's recurrence as an op: its reference, its paths and the choice among them.

:class:`src.ops.pru.PRUCell` is the concept (the paper's equations over a sequence); this is the
op it runs. Given the pyramid's output P for all steps, what is left per step is sequential:

    a_t = P_t + GLT(h_{t-1})                    (B, 4, M), gates (f, g, i, o)
    c_t = sigmoid(a_f) * c_{t-1} + sigmoid(a_i) * tanh(a_g)
    h_t = sigmoid(a_o) * tanh(c_t)

where the GLT cuts h into g chunks of w = M / g and chunk j gives the 4w outputs
``h_j @ W_j + b_j``, gate q's block being columns ``q w .. (q + 1) w`` (see
:class:`src.ops.pru.GroupedContextTransform`).

Eagerly each step is a batched product and about fifteen element-wise ATen calls, each recorded by
autograd, and its backward as many again: at PTB sizes two thirds of a step is per-call cost. The
paths here:

- :func:`pru_recurrence_reference`: that loop in PyTorch, the oracle of the others;
- on the CPU, ``lightnets_cpu::pru_recurrence_forward`` / ``_backward`` (``pru_recurrence.cpp``):
  one call each way over the whole sequence. Per step, one parallel region whose tasks each
  multiply h_{t-1}'s group by its share of the weight (sgemm, or MKL's packed GEMM; a
  once-per-machine check picks one that runs: :func:`probed_gemm_mode`) and run the cell equations
  on the result while it is in cache; backward through time in the same call, keeping only the
  activated gates and the cells; the weight and bias gradients as one product over all T·B rows
  after the loop;
- on CUDA, Triton: the time loop (:mod:`.triton_time_loop`), one launch each way whose programs
  loop over the steps, or per step the cell kernels between cuBLAS products
  (:mod:`.triton_kernel`); :func:`triton_path` picks one.

The contract every path shares (operand shapes, custom-op schemas, fakes) is :mod:`.contract`.
Every path is deterministic, and its gradients do not depend on the thread count.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from filelock import FileLock
from torch import Tensor
from torch.autograd.function import once_differentiable

from src.kernels.choices import cpu_model
from src.kernels.cpu import cpu_kernels_loaded, current_build_directory, dispatch_mode_active
from src.kernels.dispatch import (
    autocast_dtype,
    choose,
    declare,
    exporting,
    opaque_op,
    size_bucket,
    use_triton,
)
from src.kernels.environment import PRU_GEMM_ENV, cpu_path_mode, pru_gemm
from src.kernels.pru_recurrence.contract import (
    CPU_BACKWARD_SCHEMA,
    CPU_SCHEMA,
    GATES,
    check_recurrence_operands,
    cpu_grads_like,
    cpu_like,
)
from src.kernels.timing import Timer, call_with_backward, detached, needs_backward
from src.utils.files import write_json

log = logging.getLogger(__name__)


def concatenated_shape(levels: Sequence[Tensor]) -> torch.Size:
    """The shape of the levels' concatenation along the units, after checking that they are
    (T, B, 4, m_l) each, with one T and B."""
    shapes = [tuple(level.shape) for level in levels]
    if not shapes or any(len(s) != 4 or s[:3] != shapes[0][:3] or s[2] != GATES for s in shapes):
        raise ValueError(f"the levels must be (T, B, 4, m_l) with one T and B, got {shapes}")
    return torch.Size((*shapes[0][:3], sum(s[3] for s in shapes)))


def context_product(h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The GLT of h in its group-major layout, bias added.

    Shape:
        h (B, M), weight (g, w, 4w), bias (g, 4w) -> (g, B, 4w)
    """
    groups, width = weight.shape[0], weight.shape[1]
    chunks = h.reshape(-1, groups, width).transpose(0, 1)  # (g, B, w)
    if bias is None:
        return torch.bmm(chunks, weight)
    return torch.baddbmm(bias.unsqueeze(1), chunks, weight)


def cell_update(pre: Tensor, context: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """One step's cell equations: the pyramid's pre-activations plus the GLT's, then (h_t, c_t).

    Shape:
        pre (B, 4, M), context (g, B, 4w), c (B, M) -> h (B, M), c (B, M)
    """
    groups, batch, _ = context.shape
    width = c.shape[-1] // groups
    # (g, B, 4w) -> (B, 4, g, w): a strided view, added without a copy
    gates = pre.unflatten(-1, (groups, width)) + context.unflatten(-1, (GATES, width)).permute(
        1, 2, 0, 3
    )
    forget, content, update, output = gates.view(batch, GATES, -1).unbind(1)
    c = torch.sigmoid(forget) * c + torch.sigmoid(update) * torch.tanh(content)
    return torch.sigmoid(output) * torch.tanh(c), c


def pru_recurrence_reference(
    inputs: Tensor, weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """All steps of the recurrence in PyTorch ops, differentiable in every operand.

    Args:
        inputs: P, the pyramid's output for every step (its bias included), gates (f, g, i, o).
        weight: the context GLT's ``W``, group j's (w, 4w) matrix in ``weight[j]``.
        bias: the context GLT's bias, or None.
        h0, c0: the state before the first step.

    Shape:
        inputs (T, B, 4, M), weight (g, w, 4w) with M = g w, bias (g, 4w), h0 and c0 (B, M)
        -> output (T, B, M), h_T (B, M), c_T (B, M)
    """
    check_recurrence_operands(inputs, weight, bias, h0, c0)
    h, c = h0, c0
    outputs = []
    # one unbind, not an index per step: each index's backward would write a zero-filled gradient
    # of all T steps (quadratic in T)
    for pre in inputs.unbind(0):
        h, c = cell_update(pre, context_product(h, weight, bias), c)
        outputs.append(h)
    if not outputs:
        return inputs.new_empty(0, *h0.shape), h0, c0
    return torch.stack(outputs), h, c


GEMM_MODES = ("plain", "packed")  # in the order checked: plain is as fast (pru_recurrence.cpp)
PROBE_FILE = "pru_recurrence_check.json"
# the checked shapes (T, B, g, w, level widths): a tiny one and PTB's (g = 4, w = 350, K = 2)
PROBE_SHAPES = ((3, 2, 2, 4, (8,)), (3, 20, 4, 350, (1050, 350)))


def check_gemm_mode(mode: str, threads: int) -> str | None:
    """Run the C++ recurrence with ``packed`` (MKL's packed GEMM) or ``plain`` (sgemm) products,
    forward and backward at :data:`PROBE_SHAPES` on ``threads`` threads, in this process, against
    the PyTorch loop in float64. Returns None when it agrees, else what went wrong."""
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    for steps, batch, groups, width, widths in PROBE_SHAPES:
        hidden = groups * width
        operands = [
            torch.randn(steps, batch, GATES, hidden, generator=generator),
            torch.randn(groups, width, GATES * width, generator=generator) / width**0.5,
            torch.randn(groups, GATES * width, generator=generator),
            torch.randn(batch, hidden, generator=generator),
            torch.randn(batch, hidden, generator=generator),
        ]
        results = []
        for kernel in (True, False):
            leaves = [(t.clone() if kernel else t.double()).requires_grad_() for t in operands]
            inputs, weight, bias, h0, c0 = leaves
            if kernel:
                out = PRURecurrenceCpu.apply(
                    weight, bias, h0, c0, mode == "packed", *inputs.split(list(widths), -1)
                )
            else:
                out = pru_recurrence_reference(inputs, weight, bias, h0, c0)
            sum(o.sum() for o in out).backward()
            results.append([*out, *(t.grad for t in leaves)])
        for got, want in zip(*results, strict=True):
            got, want = got.detach().double(), want.detach()
            error = float((got - want).abs().max() / want.abs().max().clamp_min(1))
            if not error < 1e-4:  # float32 rounding over a few steps is ~1e-6
                shape = (steps, batch, groups, width)
                return f"{mode} products off by {error:.1e} at (T, B, g, w) = {shape}"
    return None


def check_gemm_mode_or_exit(mode: str, threads: int) -> None:
    """:func:`check_gemm_mode` as a process's exit status: 0 when it agrees, else 1 with what went
    wrong (the child of :func:`_run_check`, and ``benchmarks/pru_gemm_check.py``)."""
    if not (cpu_kernels_loaded() and torch.ops.lightnets_cpu.pru_recurrence_available()):
        sys.exit("the CPU kernels are not built, or PyTorch has no MKL")
    failure = check_gemm_mode(mode, threads)
    if failure:
        sys.exit(failure)


def _run_check(mode: str) -> str | None:
    """:func:`check_gemm_mode` in a child process, which a faulting MKL routine cannot take down
    with this one. Returns None when it agrees, else what went wrong."""
    root = Path(__file__).resolve().parents[3]
    check = f"check_gemm_mode_or_exit({mode!r}, {torch.get_num_threads()})"
    command = [sys.executable, "-c", f"from {__name__} import check_gemm_mode_or_exit; {check}"]
    env = {**os.environ, PRU_GEMM_ENV: mode}
    try:
        child = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False
        )
    except subprocess.TimeoutExpired:
        return f"{mode} products: the check did not end in 300 s"
    if child.returncode < 0:
        return f"{mode} products: the check died of {signal.Signals(-child.returncode).name}"
    if child.returncode:
        lines = (child.stdout + child.stderr).strip().splitlines()
        return f"{mode} products: {lines[-1] if lines else f'exit {child.returncode}'}"
    return None


@functools.cache
def probed_gemm_mode() -> str | None:
    """The recurrent products' mode on this machine: "packed", "plain", or None for the PyTorch
    loop (no kernels, no MKL, or neither mode passed).

    The kernel calls MKL as linked into PyTorch, through symbols PyTorch does not document: on
    an Intel Xeon (PyTorch 2.11) the packed-GEMM kernel died of SIGSEGV where an AMD EPYC runs
    it. So each mode is checked once per machine and build, in a child process that a fault
    cannot take this one down with, against the PyTorch loop (:func:`check_gemm_mode`); the first
    that passes is kept, and the verdict is cached in the build's folder (with the processor it
    was reached on). ``LIGHTNETS_PRU_GEMM`` names a mode and skips the check."""
    if not (cpu_kernels_loaded() and torch.ops.lightnets_cpu.pru_recurrence_available()):
        return None
    forced = pru_gemm()  # "packed" or "plain": this mode, unchecked; "0": the PyTorch loop
    if forced:
        return None if forced == "0" else forced
    record = current_build_directory() / PROBE_FILE
    processor = cpu_model()
    with FileLock(record.with_suffix(".lock")):
        try:
            verdict = json.loads(record.read_text())
            if verdict.get("processor") == processor:
                return verdict["mode"]
        except (OSError, ValueError, KeyError):
            pass  # none yet, or unreadable: check again
        log.info("checking the PRU recurrence's GEMM modes on this machine (once)")
        mode, failures = None, []
        for candidate in GEMM_MODES:
            failure = _run_check(candidate)
            if failure is None:
                mode = candidate
                break
            failures.append(failure)
        if failures:
            fallback = (f"the recurrence uses {mode} products (slower)" if mode else
                        "the recurrence takes the PyTorch loop")  # fmt: skip
            warnings.warn(f"the fused PRU recurrence failed its check: {'; '.join(failures)}; "
                          f"{fallback}", RuntimeWarning, stacklevel=2)  # fmt: skip
        write_json(record, {"processor": processor, "mode": mode, "failures": failures})
    return mode


def cpu_kernel_applies(*operands: Tensor | None) -> bool:
    """Whether the C++ recurrence runs these operands: float32 CPU tensors, outside autocast,
    export and dispatch modes (a flop counter would count nothing inside the kernel), with the
    kernels built (eagerly, or traced by ``torch.compile`` as a custom op)."""
    tensors = [t for t in operands if t is not None]
    return (
        all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        and not exporting()
        and not torch.is_autocast_enabled("cpu")
        and not dispatch_mode_active()
        and _kernel_gemm_mode() is not None
    )


@torch.compiler.assume_constant_result
def _kernel_gemm_mode() -> str | None:
    """:func:`probed_gemm_mode` where the CPU paths are on (``LIGHTNETS_CPU_KERNELS`` not 0),
    else None: a constant of the graph while ``torch.compile`` traces (the machine's check, run
    once, is no part of a step)."""
    return probed_gemm_mode() if cpu_path_mode() != "0" else None


class PRURecurrenceCpu(torch.autograd.Function):
    """:func:`pru_recurrence_reference` by ``lightnets_cpu::pru_recurrence_forward`` /
    ``_backward``, on the pyramid's levels as they are (not concatenated); the backward reads the
    activated gates and the cells, nothing else."""

    @staticmethod
    def forward(ctx, weight, bias, h0, c0, packed, *levels):  # type: ignore[override]
        save = any(ctx.needs_input_grad)
        output, h_last, c_last, gates, cells = kernel_forward(
            weight, bias, h0, c0, levels, save, packed
        )
        if save:
            ctx.save_for_backward(gates, cells, output, weight, h0, c0)
        ctx.set_materialize_grads(False)  # an output without gradient reaches the kernel as None
        ctx.has_bias = bias is not None
        ctx.widths = [level.shape[-1] for level in levels]
        ctx.packed = packed
        return output, h_last, c_last

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output, grad_h, grad_c):  # type: ignore[override]
        gates, cells, output, weight, h0, c0 = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_levels, grad_weight, grad_bias, grad_h0, grad_c0 = kernel_backward(
            grad_output, grad_h, grad_c, gates, cells, output, weight, h0, c0, ctx.widths,
            needs[0], needs[1] and ctx.has_bias, ctx.packed,
        )  # fmt: skip
        return (
            grad_weight if needs[0] else None,
            grad_bias if needs[1] and ctx.has_bias else None,
            grad_h0 if needs[2] else None,
            grad_c0 if needs[3] else None,
            None,
            *(grad if need else None for grad, need in zip(grad_levels, needs[5:], strict=True)),
        )


def kernel_forward(
    weight: Tensor,
    bias: Tensor | None,
    h0: Tensor,
    c0: Tensor,
    levels: Sequence[Tensor],
    save: bool,
    packed: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``lightnets_cpu::pru_recurrence_forward``: (output, h_T, c_T, gates, cells), the last two
    empty unless ``save``; ``packed``: MKL's packed products, else sgemm's."""
    output, c_last, gates, cells = torch.ops.lightnets_cpu.pru_recurrence_forward(
        [level.contiguous() for level in levels],
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        h0.contiguous(),
        c0.contiguous(),
        save,
        packed,
    )
    h_last = output[-1].clone() if output.shape[0] else h0.clone()
    return output, h_last, c_last, gates, cells


@opaque_op("lightnets::pru_recurrence_cpu_backward", CPU_BACKWARD_SCHEMA, cpu_grads_like)
def kernel_backward(
    grad_output: Tensor | None, grad_h_last: Tensor | None, grad_c_last: Tensor | None,
    gates: Tensor, cells: Tensor, output: Tensor, weight: Tensor, h0: Tensor, c0: Tensor,
    widths: list[int], weight_grad: bool, bias_grad: bool, packed: bool,
) -> tuple[list[Tensor], Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``lightnets_cpu::pru_recurrence_backward``: the levels', weight's, bias's (each of these two
    empty unless wanted), h0's and c0's gradients, from the outputs' (None: no gradient).

    Shape:
        grad_output (T, B, M), grad_h_last and grad_c_last (B, M), gates (T, B, 4, M), cells and
        output (T, B, M), weight (g, w, 4w), h0 and c0 (B, M)
        -> ([(T, B, 4, m_l)], (g, w, 4w), (g, 4w), (B, M), (B, M))
    """
    grads = (None if g is None else g.contiguous() for g in (grad_output, grad_h_last, grad_c_last))
    grad_levels, grad_weight, grad_bias, grad_h0, grad_c0 = (
        torch.ops.lightnets_cpu.pru_recurrence_backward(
            *grads,
            gates,
            cells,
            output,
            weight.contiguous(),
            h0.contiguous(),
            c0.contiguous(),
            widths,
            weight_grad,
            bias_grad,
            packed,
        )  # fmt: skip
    )
    return list(grad_levels), grad_weight, grad_bias, grad_h0, grad_c0


def _keep_for_backward(ctx, inputs: tuple, output: tuple) -> None:
    levels, weight, bias, h0, c0, _, packed = inputs
    out, _, _, gates, cells = output
    ctx.mark_non_differentiable(gates, cells)
    ctx.set_materialize_grads(False)  # an output without gradient reaches the kernel as None
    ctx.save_for_backward(gates, cells, out, weight, h0, c0)
    ctx.widths = [level.shape[-1] for level in levels]
    ctx.weight_grad = weight.requires_grad
    ctx.bias_grad = bias is not None and bias.requires_grad
    ctx.packed = packed


def _recurrence_grads(
    ctx, grad_output: Tensor | None, grad_h: Tensor | None, grad_c: Tensor | None, *_: Tensor
) -> tuple:
    gates, cells, output, weight, h0, c0 = ctx.saved_tensors
    grad_levels, grad_weight, grad_bias, grad_h0, grad_c0 = kernel_backward(
        grad_output, grad_h, grad_c, gates, cells, output, weight, h0, c0, ctx.widths,
        ctx.weight_grad, ctx.bias_grad, ctx.packed,
    )  # fmt: skip
    return (
        grad_levels,
        grad_weight if ctx.weight_grad else None,
        grad_bias if ctx.bias_grad else None,
        grad_h0,
        grad_c0,
        None,
        None,
    )


def _traced_recurrence(
    levels: list[Tensor], weight: Tensor, bias: Tensor | None, h0: Tensor, c0: Tensor,
    save: bool, packed: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    output, h_last, c_last, gates, cells = kernel_forward(
        weight, bias, h0, c0, levels, save, packed
    )
    return output, h_last, c_last, gates, cells


# the C++ recurrence as ``torch.compile`` traces it: one node each way (eagerly the Function above,
# whose autograd tracks the levels one by one, runs the same kernels)
_recurrence_op = torch.library.custom_op(
    "lightnets::pru_recurrence_cpu", _traced_recurrence, mutates_args=(), schema=CPU_SCHEMA
)
_recurrence_op.register_fake(cpu_like)
_recurrence_op.register_autograd(_recurrence_grads, setup_context=_keep_for_backward)


def pru_recurrence(
    inputs: Tensor | Sequence[Tensor],
    weight: Tensor,
    bias: Tensor | None,
    h0: Tensor,
    c0: Tensor,
    impl: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`pru_recurrence_reference` on the fastest path that applies (module docstring).

    Args:
        inputs: P, or the pyramid's levels (:meth:`src.ops.pyramidal.PyramidalTransform.
            level_outputs`), P being their concatenation along the units: the C++ kernel reads
            them in place, the other paths concatenate them.
        impl: "auto": the C++ kernel on float32 CPU tensors (:func:`cpu_kernel_applies`; traced
            by ``torch.compile``, the custom op ``lightnets::pru_recurrence_cpu``), the Triton
            kernels on CUDA (:func:`triton_path` picks which), the reference elsewhere (float64,
            autocast on the CPU, export); "triton" or "reference" to fix it.

    Shape:
        inputs (T, B, 4, M) or [(T, B, 4, m_l)] with sum m_l = M, weight (g, w, 4w), bias (g, 4w),
        h0 and c0 (B, M) -> output (T, B, M), h_T (B, M), c_T (B, M)
    """
    levels = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    check_recurrence_operands(concatenated_shape(levels), weight, bias, h0, c0)
    if impl == "auto" and cpu_kernel_applies(*levels, weight, bias, h0, c0):
        operands = (weight, bias, h0, c0, *levels)
        packed = _kernel_gemm_mode() == "packed"
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in operands)
        if torch.compiler.is_compiling():
            return _recurrence_op(list(levels), weight, bias, h0, c0, grad, packed)[:3]
        if grad:
            return PRURecurrenceCpu.apply(weight, bias, h0, c0, packed, *levels)
        # no gradient to come: the kernel keeps no gates or cells (the Function, even under
        # no_grad, sees its parameters' requires_grad and would)
        return kernel_forward(weight, bias, h0, c0, levels, False, packed)[:3]
    inputs = levels[0] if len(levels) == 1 else torch.cat(levels, dim=-1)
    # the kernels take neither float64 nor an empty batch (B M = 0)
    rows = inputs.shape[1] * inputs.shape[3]
    if use_triton(impl, inputs) and inputs.dtype != torch.float64 and rows:
        return triton_recurrence(triton_path(inputs, weight, bias, h0, c0))(
            inputs, weight, bias, h0, c0
        )
    return pru_recurrence_reference(inputs, weight, bias, h0, c0)


TRITON_PATHS = ("time_loop", "per_step")
TRITON_CHOICE = declare("pru_recurrence", TRITON_PATHS)


def triton_recurrence(path: str) -> Callable[..., tuple[Tensor, Tensor, Tensor]]:
    """The recurrence on Triton ``path``, with the contract of :func:`pru_recurrence_reference`."""
    if path == "time_loop":
        from src.kernels.pru_recurrence.triton_time_loop import pru_recurrence_time_loop

        return pru_recurrence_time_loop
    from src.kernels.pru_recurrence.triton_kernel import pru_recurrence_triton

    return pru_recurrence_triton


def triton_path(
    inputs: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    h0: Tensor,
    c0: Tensor,
    timer: Timer | None = None,
) -> str:
    """The Triton path of these operands: "time_loop" (one launch each way, the programs looping
    over the steps) or "per_step" (each step a cuBLAS product and a cell launch, each way).

    The time loop is the default: one launch each way is what a captured CUDA graph replays and
    what a launch-bound step wants. ``torch.compile`` always traces it (a custom op, one node each
    way; the per-step path's Function, a loop of launches, breaks a full graph), and so do CPU
    tensors (Triton's interpreter, or launches recorded for a GPU). Eagerly on CUDA the two are
    timed on the first call of each shape (a training step's forward and backward when autograd
    records) and the faster kept (:func:`choose`); a CUDA stream capturing takes a choice already
    made, else the time loop, untimed. Both are deterministic.

    Shape:
        as :func:`pru_recurrence_reference`
    """
    if timer is None and (torch.compiler.is_compiling() or not inputs.is_cuda):
        return "time_loop"
    operands = (inputs, weight, bias, h0, c0)
    steps, batch, _, hidden = inputs.shape
    key = (
        size_bucket(steps), size_bucket(batch), hidden, weight.shape[0], inputs.dtype,
        autocast_dtype(inputs.device.type), bias is not None, needs_backward(*operands),
    )  # fmt: skip

    def candidates() -> dict:
        leaves = detached(*operands)
        wanted = [t for t in leaves if t is not None]

        def output(path: str) -> Tensor:
            # the carried state's gradients are zeros in training (it is detached between
            # windows): the output's alone
            return triton_recurrence(path)(*leaves)[0]

        return {path: call_with_backward(functools.partial(output, path), wanted)
                for path in TRITON_PATHS}  # fmt: skip

    return choose(
        TRITON_CHOICE, key, candidates, default="time_loop", reference="per_step", timer=timer
    )
