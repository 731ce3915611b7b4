"""GPU speed of the DeLighT transformation, the character LMs and the vision networks, side by side.

Six parts. Within a part the compared entries run in one process, interleaved round-robin so that
drift affects all alike, with CUDA synchronised around every timed call, warm-up calls first, and
the median of ``--repeats`` runs reported:

- ``dextra``: DExTra(d_m=512, w_m=2, N=8, g_max=16) forward+backward on (tokens/512, 512, 512)
  inputs, fp32 and bf16 autocast: ``impl="auto"`` (on CUDA, per GLT shape the faster of the fused
  Triton kernel and the reference, measured on first use) against the same weights with
  ``impl="triton"`` (the kernel everywhere, CUDA only) and ``impl="reference"`` (plain PyTorch),
  and a dense GEMM of equal FLOPs (the rate the hardware reaches on this much arithmetic).
- ``charlm``: a training step (forward with a full memory, cross-entropy, backward, fused Adam as
  the tasks build it) of the
  2- and 4-group Group-Transformers against Transformer-XL (9, 256, 8; pre-norm, untied) at enwik8
  sizes, in tokens/s, fp32 and bf16, eagerly and under ``torch.compile``; on CUDA the eager group
  also runs Transformer-XL and G=4 with their kernels and fused attention off (``*_plain``); a
  compiled entry also reports its first step (the compile time) and dynamo's graphs and graph
  breaks.
- ``vision``: training step (SGD with momentum) and inference (``torch.inference_mode``) of
  DiCENet and ESPNetv2 s=1.0 against torchvision ShuffleNetV2 x1.0, MobileNetV2 and
  MobileNetV3-Large, in images/s, channels-last under autocast (bf16 on CUDA, cuDNN autotuning
  on). A network with kernel switches (an ``impl`` attribute: DimConv in DiCENet, EESP in
  ESPNetv2) also runs with every switch on "reference", so the kernels' effect shows. With
  ``--compile`` each of DiCENet and ESPNetv2 is compiled in a child process under
  ``--compile-timeout`` (its first training step is the compile time).
- ``dice``: one DiCE unit per distinct DiCENet s=1.0 stage shape, training step (forward and
  backward) and inference at the vision batch and precision, channels-last: DimConv and DimFuse's
  local fusion as one Triton pass (``fused``, ``src/kernels/dim_fuse/triton_kernel.py``), DimConv's
  kernel followed by the eager local fusion (``kernel``), plain PyTorch (``reference``) and
  ``auto``; on CUDA each training entry also reports the peak memory its step allocates. On the CPU
  only ``auto`` and ``reference`` are timed. Then DiCENet's activation memory per image (what
  autograd keeps for the backward, fp32) on each path; with ``TRITON_INTERPRET=1`` the CPU run
  includes the kernel paths here too (the figure does not depend on the device).
- ``wgrad``: the GLT weight gradient dW = x^T dy (with dy's column sums, the bias gradient) for
  each weight shape of that DExTra unit, at its token counts, fp32 and bf16: the grouped-GEMM
  kernel in one pass over the tokens, the same kernel split over the tokens (split-K), and
  ``torch.bmm`` on strided views; the GLT's backward takes the faster of the last two per shape
  (``src.kernels.group_linear.triton_kernel.weight_grad_method``). On the CPU only ``bmm`` runs.
- ``amp``: every op and model above runs forward+backward under bf16 autocast (and fp16 on CUDA);
  each case reports ok, nonfinite (loss or a gradient) or the error it raised.

An entry that raises is reported in its row (``"error"``) and the run goes on. Each part prints a
table and one JSON line per measurement; then come a summary of the ratios (> 1: faster than the
baseline) and a JSON line with the machine, torch, CUDA and Triton versions and the date. Compile
times include whatever inductor's on-disk caches hold (``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``
for cold ones). On the CPU the defaults shrink (512 DExTra tokens, 2 x 32-character LM segments,
4 images of 128 x 128 in fp32, 3 repeats, no compile) so that the whole script runs anywhere in
about a minute (one thread, so that OpenMP does not spin against other jobs; ``--threads``).

    python benchmarks/gpu.py [--device cuda|cpu] [--parts dextra charlm vision dice wgrad amp]
        [--repeats 21] [--tokens 4096 16384] [--lm-batch 22] [--lm-len 512]
        [--vision-batch 256] [--image-size 224] [--vision-precision bf16]
        [--compile/--no-compile] [--compile-timeout 600] [--tf32] [--threads N] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import json
import math
import multiprocessing
import os
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.common import (
    D_M,
    IMAGE_SIZE,
    LM_BATCH,
    LM_LEN,
    SEQ,
    VISION_BATCH,
    VOCAB,
    autocast,
    cell,
    cpu_name,
    describe,
    dextra_input_shape,
    dextra_unit,
    dicenet_dice_shapes,
    enwik8_lm,
    enwik8_loss,
    enwik8_memories,
    fmt_ratio,
    forward_backward,
    glt_weight_shapes,
    has_impl,
    progress,
    ratio,
    release,
    rounded,
    run_once,
    synchronize,
    training_step,
    vision_network,
    with_impl,
)
from benchmarks.op_cases.delight import dextra_macs_per_token
from src.kernels.dispatch import triton_available, use_triton
from src.models.dicenet import DiCENet
from src.ops.dice import DiCE

PARTS = ("dextra", "charlm", "vision", "dice", "wgrad", "amp")
PRECISIONS = ("fp32", "bf16")

TXL = "transformer_xl(9,256,8)"
# an LM entry -> its groups (None: Transformer-XL)
LM_GROUPS = {TXL: None, "group_transformer(G=2)": 2, "group_transformer(G=4)": 4}
LM_NAMES = tuple(LM_GROUPS)
SHORT = dict(zip(LM_NAMES, ("TXL", "G=2", "G=4"), strict=True))
PLAIN = "_plain"  # an LM entry with its kernels and fused attention switched off
OURS_CNN = ("dicenet", "espnetv2")
TORCHVISION = ("shufflenet_v2_x1_0", "mobilenet_v2", "mobilenet_v3_large")
BASELINE_CNN = "shufflenet_v2_x1_0"

# per device type: the sizes a run uses unless a flag says otherwise
# (the CPU run is a smoke test: CPU autocast to bf16 is emulated and slow, so its vision runs in
# fp32, and one thread keeps it quick where other jobs share the cores; None: torch's default)
DEFAULTS: dict[str, dict[str, Any]] = {
    "cuda": {
        "repeats": 21,
        "warmup": 3,
        "tokens": [4096, 16384],
        "lm_batch": LM_BATCH,
        "lm_len": LM_LEN,
        "vision_batch": VISION_BATCH,
        "image_size": IMAGE_SIZE,
        "vision_precision": "bf16",
        "threads": None,
    },
    "cpu": {
        "repeats": 3,
        "warmup": 1,
        "tokens": [512],
        "lm_batch": 2,
        "lm_len": 32,
        "vision_batch": 4,
        "image_size": 128,
        "vision_precision": "fp32",
        "threads": 1,
    },
}


@dataclass(frozen=True)
class Settings:
    """What one run measures, after the device's defaults are filled in."""

    device: torch.device
    parts: tuple[str, ...]
    repeats: int
    warmup: int
    tokens: tuple[int, ...]
    lm_batch: int
    lm_len: int
    vision_batch: int
    image_size: int
    vision_precision: str
    compile: bool
    compile_timeout: float
    tf32: bool
    threads: int


@dataclass
class Timing:
    """One entry's result: the median milliseconds of the timed runs; the seconds of its first
    call (a compiled entry's compile time) with dynamo's graphs and graph breaks in that call;
    or the error that stopped it."""

    ms: float | None = None
    first_s: float | None = None
    graphs: int = 0
    graph_breaks: int = 0
    error: str | None = None


def time_interleaved(steps: dict[str, Callable[[], object]], s: Settings) -> dict[str, Timing]:
    """Median milliseconds of each step, the steps run round-robin.

    Every step is first called alone (timed, dynamo's counters read around it), then ``warmup - 1``
    more times; a step that raises there or later is dropped with its error, the others go on.
    """
    from torch._dynamo.utils import counters

    timings = {name: Timing() for name in steps}
    live: dict[str, Callable[[], object]] = {}
    for name, step in steps.items():
        try:
            counters.clear()
            timings[name].first_s = run_once(step, s.device)
            timings[name].graphs = int(counters["stats"]["unique_graphs"])
            timings[name].graph_breaks = sum(counters["graph_break"].values())
            for _ in range(s.warmup - 1):
                run_once(step, s.device)
        except Exception as error:  # reported in the entry's row; the other entries still run
            timings[name].error = describe(error)
            release(s.device)
            continue
        live[name] = step
    samples: dict[str, list[float]] = {name: [] for name in live}
    for _ in range(s.repeats):
        for name, step in list(live.items()):
            try:
                samples[name].append(run_once(step, s.device))
            except Exception as error:  # as above
                timings[name].error = describe(error)
                del live[name]
                release(s.device)
    for name in live:
        timings[name].ms = 1e3 * statistics.median(samples[name])
    return timings


# --- dextra -------------------------------------------------------------------------------------


def dextra_part(s: Settings) -> list[dict]:
    rows = []
    for tokens in s.tokens:
        for precision in PRECISIONS:
            progress(f"dextra: {tokens} tokens, {precision}")
            torch.manual_seed(0)
            ours = dextra_unit().to(s.device)
            reference = with_impl(copy.deepcopy(ours), "reference")
            # the kernel forced, where it runs natively (auto picks per shape between it and the
            # reference, src.kernels.group_linear.auto_path)
            kernel = with_impl(copy.deepcopy(ours), "triton") if s.device.type == "cuda" else None
            shape = dextra_input_shape(tokens)
            x = torch.randn(*shape, device=s.device, requires_grad=True)
            flops = 2 * tokens * dextra_macs_per_token(ours)
            # a dense GEMM with the unit's forward FLOPs: (tokens, 1024) @ (1024, n)
            n = math.ceil(flops / (2 * tokens * 1024))
            a = torch.randn(tokens, 1024, device=s.device, requires_grad=True)
            b = torch.randn(1024, n, device=s.device, requires_grad=True)
            steps = {
                "dextra_auto": forward_backward(functools.partial(ours, x), s.device, precision),
                "dextra_reference": forward_backward(
                    functools.partial(reference, x), s.device, precision
                ),
                "dense_gemm": forward_backward(
                    functools.partial(torch.matmul, a, b), s.device, precision
                ),
            }
            paths = {
                "dextra_auto": "measured" if use_triton("auto", x) else "pytorch",
                "dextra_reference": "pytorch",
                "dense_gemm": "gemm",
            }
            entry_flops = {
                "dextra_auto": flops,
                "dextra_reference": flops,
                "dense_gemm": 2 * tokens * 1024 * n,
            }
            if kernel is not None:
                steps["dextra_triton"] = forward_backward(
                    functools.partial(kernel, x), s.device, precision
                )
                paths["dextra_triton"] = "triton"
                entry_flops["dextra_triton"] = flops
            timings = time_interleaved(steps, s)
            for name, t in timings.items():
                rows.append(
                    {
                        "part": "dextra",
                        "name": name,
                        "path": paths[name],
                        "tokens": tokens,
                        "shape": str(shape),
                        "precision": precision,
                        "pass": "fwd+bwd",
                        "ms": rounded(t.ms),
                        # backward: two GEMMs per forward GEMM
                        "tflops": rounded(3 * entry_flops[name] / t.ms / 1e9) if t.ms else None,
                        "speedup_vs_reference": ratio(timings["dextra_reference"].ms, t.ms),
                        "fraction_of_dense": ratio(timings["dense_gemm"].ms, t.ms),
                        "error": t.error,
                    }
                )
            del ours, reference, kernel, x, a, b, steps
            release(s.device)
    return rows


# --- wgrad --------------------------------------------------------------------------------------


def wgrad_part(s: Settings) -> list[dict]:
    kernels = s.device.type == "cuda" and triton_available()
    if kernels:
        from src.kernels.group_linear.triton_kernel import _grouped_gemm, weight_grad_splitk
    from src.kernels.group_linear.triton_kernel import weight_grad_bmm

    rows = []
    for tokens in s.tokens:
        for precision in PRECISIONS:
            dtype = torch.float32 if precision == "fp32" else torch.bfloat16
            for groups, k, n in glt_weight_shapes():
                progress(f"wgrad: {tokens} tokens, {precision}, {groups}x{k}x{n}")
                xg = torch.randn(tokens, groups, k, device=s.device, dtype=dtype)
                dy = torch.randn(tokens, groups, n, device=s.device, dtype=dtype)
                out = torch.empty(groups, k, n, device=s.device, dtype=dtype)
                colsum = torch.empty(groups, n, device=s.device, dtype=dtype)
                steps: dict[str, Callable[[], object]] = {
                    "bmm": functools.partial(weight_grad_bmm, xg, dy, out, colsum)
                }
                if kernels:
                    steps["split_k"] = functools.partial(weight_grad_splitk, xg, dy, out, colsum)
                    steps["one_pass"] = functools.partial(
                        _grouped_gemm, xg.permute(2, 1, 0), dy.transpose(0, 1),
                        out.transpose(0, 1), colsum=colsum,
                    )  # fmt: skip
                timings = time_interleaved(steps, s)
                live = {name: t.ms for name, t in timings.items() if t.ms is not None}
                fastest = min(live, key=live.__getitem__) if live else None
                for name, t in timings.items():
                    rows.append(
                        {
                            "part": "wgrad", "name": name, "tokens": tokens, "precision": precision,
                            "shape": f"{groups}x{k}x{n}", "ms": rounded(t.ms, 4),
                            "tflops": rounded(2 * tokens * groups * k * n / t.ms / 1e9)
                            if t.ms else None,
                            "speedup_vs_bmm": ratio(timings["bmm"].ms, t.ms),
                            "fastest": name == fastest, "error": t.error,
                        }
                    )  # fmt: skip
                del xg, dy, out, colsum, steps
                release(s.device)
    return rows


# --- charlm -------------------------------------------------------------------------------------


def lm_model(name: str, length: int) -> nn.Module:
    """Table 2's enwik8 model of the entry ``name``, dropout off."""
    net = enwik8_lm(LM_GROUPS[name.removesuffix(PLAIN)], length)
    if name.endswith(PLAIN):  # every kernel switch on PyTorch, attention on the eager ops
        with_impl(net, "reference")
        for module in net.modules():
            if hasattr(module, "attention"):
                module.attention = "eager"
    return net


def lm_train_step(
    net: nn.Module,
    forward: Callable[..., tuple[Tensor, Any]],
    tokens: Tensor,
    memories: list[Tensor],
    device: torch.device,
    precision: str,
) -> Callable[[], None]:
    """Forward over ``tokens[:, :-1]`` with full memories, next-character loss, backward, Adam."""
    optimizer = torch.optim.Adam(net.parameters(), lr=2.5e-4, fused=True)
    return training_step(
        lambda: enwik8_loss(forward, tokens, memories), optimizer, device, precision
    )


def charlm_part(s: Settings) -> list[dict]:
    rows = []
    modes = ("eager", "compiled") if s.compile else ("eager",)
    torch.manual_seed(0)
    tokens = torch.randint(VOCAB, (s.lm_batch, s.lm_len + 1), device=s.device)
    memories = enwik8_memories(s.lm_batch, s.lm_len, s.device)
    for precision in PRECISIONS:
        for mode in modes:
            progress(f"charlm: {precision}, {mode}")
            if mode == "compiled":
                torch._dynamo.reset()  # each compiled group pays its own compile time
            steps = {}
            names = list(LM_NAMES)
            if mode == "eager" and s.device.type == "cuda":
                names += [TXL + PLAIN, LM_NAMES[2] + PLAIN]  # what the kernels and SDPA bring
            for name in names:
                torch.manual_seed(0)
                net = lm_model(name, s.lm_len).to(s.device).train()
                forward = torch.compile(net) if mode == "compiled" else net
                steps[name] = lm_train_step(net, forward, tokens, memories, s.device, precision)
            timings = time_interleaved(steps, s)
            for name, t in timings.items():
                row = {
                    "part": "charlm",
                    "name": name,
                    "precision": precision,
                    "mode": mode,
                    "batch": s.lm_batch,
                    "segment": s.lm_len,
                    "mem_len": s.lm_len,
                    "ms": rounded(t.ms),
                    "tokens_per_s": round(s.lm_batch * s.lm_len / t.ms * 1e3, 1) if t.ms else None,
                    "speedup_vs_txl": ratio(timings[TXL].ms, t.ms),
                }
                if mode == "compiled":
                    row |= {
                        "compile_s": rounded(t.first_s, 2),
                        "graphs": t.graphs,
                        "graph_breaks": t.graph_breaks,
                    }
                rows.append(row | {"error": t.error})
            del steps
            release(s.device)
    return rows


# --- vision -------------------------------------------------------------------------------------


def vision_net(name: str, s: Settings) -> nn.Module:
    """One network by name: ours (``*_reference``: kernel switches off) or a torchvision one."""
    net = vision_network(name.removesuffix("_reference"), s.image_size)
    if name.endswith("_reference"):
        with_impl(net, "reference")
    return net.to(s.device, memory_format=torch.channels_last)


def vision_names(s: Settings) -> list[str]:
    names = []
    for name in OURS_CNN:
        names.append(name)
        if has_impl(vision_net(name, s)):
            names.append(f"{name}_reference")
    return names + list(TORCHVISION)


def vision_train_step(
    net: nn.Module, forward: Callable[[Tensor], Tensor], x: Tensor, labels: Tensor, s: Settings
) -> Callable[[], None]:
    optimizer = torch.optim.SGD(
        net.parameters(), lr=0.01, momentum=0.9, weight_decay=4e-5, fused=True
    )
    return training_step(
        lambda: F.cross_entropy(forward(x), labels), optimizer, s.device, s.vision_precision
    )


def vision_infer_step(net: nn.Module, x: Tensor, s: Settings) -> Callable[[], None]:
    def step() -> None:
        with torch.inference_mode(), autocast(s.device, s.vision_precision):
            net(x)

    return step


def vision_inputs(s: Settings, batch: int) -> tuple[Tensor, Tensor]:
    torch.manual_seed(0)
    x = torch.randn(batch, 3, s.image_size, s.image_size, device=s.device)
    labels = torch.randint(1000, (batch,), device=s.device)
    return x.contiguous(memory_format=torch.channels_last), labels


def vision_part(s: Settings) -> list[dict]:
    rows = []
    names = vision_names(s)
    x, labels = vision_inputs(s, s.vision_batch)
    nets = {}
    for name in names:
        torch.manual_seed(0)
        nets[name] = vision_net(name, s)
    for pass_ in ("train", "infer"):
        progress(f"vision: {pass_}, {s.vision_precision}")
        steps = {}
        for name, net in nets.items():
            net.train(pass_ == "train")
            if pass_ == "train":
                steps[name] = vision_train_step(net, net, x, labels, s)
            else:
                steps[name] = vision_infer_step(net, x, s)
        timings = time_interleaved(steps, s)
        for name, t in timings.items():
            reference = timings.get(f"{name}_reference")
            rows.append(
                {
                    "part": "vision",
                    "name": name,
                    "pass": pass_,
                    "precision": s.vision_precision,
                    "batch": s.vision_batch,
                    "image_size": s.image_size,
                    "channels_last": True,
                    "ms": rounded(t.ms),
                    "images_per_s": round(s.vision_batch / t.ms * 1e3, 1) if t.ms else None,
                    "speedup_vs_shufflenet": ratio(timings[BASELINE_CNN].ms, t.ms),
                    "speedup_vs_reference": ratio(reference.ms, t.ms) if reference else None,
                    "error": t.error,
                }
            )
        del steps
        release(s.device)
    del nets
    release(s.device)
    if s.compile:
        rows += [vision_compile_row(name, s) for name in OURS_CNN]
    return rows


# --- dice ---------------------------------------------------------------------------------------


def dice_variant(unit: DiCE, name: str) -> DiCE:
    """A copy of ``unit`` on one path: "fused" (DimConv + local fusion in one Triton pass),
    "kernel" (DimConv's Triton kernel, then the eager local fusion), "reference" (PyTorch) or
    "auto" (per shape the measured faster of each choice)."""
    variant = copy.deepcopy(unit)
    variant.dim_conv.impl = {"fused": "triton", "kernel": "triton"}.get(name, name)
    variant.local_fusion = name != "kernel"
    return variant


def peak_mib(step: Callable[[], object], device: torch.device) -> float | None:
    """MiB the step allocates above what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    release(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    synchronize(device)
    return round((torch.cuda.max_memory_allocated(device) - before) / 2**20, 1)


def saved_mib(net: nn.Module, x: Tensor) -> float:
    """MiB of the distinct storages autograd keeps for the backward of ``net(x)`` (the training
    step's activation memory, whatever the device's allocator does around it)."""
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(x)
    return round(sum(storages.values()) / 2**20, 2)


def dicenet_saved_rows(names: list[str], s: Settings) -> list[dict]:
    """DiCENet s=1.0's activation memory per image with its DiCE units on each path, fp32 (one
    image; the figure scales with the batch)."""
    rows = []
    x = torch.randn(1, 3, s.image_size, s.image_size, device=s.device)
    x = x.contiguous(memory_format=torch.channels_last)
    for name in names:
        torch.manual_seed(0)
        net = DiCENet(scale=1.0, input_size=s.image_size)
        for unit in net.modules():
            if isinstance(unit, DiCE):
                unit.dim_conv.impl = {"fused": "triton", "kernel": "triton"}.get(name, name)
                unit.local_fusion = name != "kernel"
        net = net.to(s.device, memory_format=torch.channels_last).train()
        mib = saved_mib(net, x)
        rows.append(
            {
                "part": "dice_memory", "name": name, "shape": f"{s.image_size}^2",
                "saved_mib_per_image": mib,
            }
        )  # fmt: skip
    base = next((r for r in rows if r["name"] == "kernel"), rows[-1])["saved_mib_per_image"]
    for row in rows:
        row["fraction_of_base"] = ratio(row["saved_mib_per_image"], base)
    return rows


def dice_part(s: Settings) -> list[dict]:
    """One DiCE unit per DiCENet stage shape: a training step (forward, backward from a ones
    gradient) and inference, batch ``--vision-batch``, channels-last, the vision precision; then
    DiCENet's activation memory per path (:func:`dicenet_saved_rows`)."""
    names = ["auto", "reference"]
    kernels = triton_available() and (
        s.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    )
    if kernels:
        names = ["fused", "kernel", *names]
    rows = dicenet_saved_rows(names, s)
    if s.device.type != "cuda":  # the interpreter's speed means nothing
        names = [name for name in names if name not in ("fused", "kernel")]
    for channels, height, width in dicenet_dice_shapes(s.image_size):
        torch.manual_seed(0)
        unit = DiCE(channels, channels, height, width).to(s.device)
        units = {name: dice_variant(unit, name) for name in names}
        x = torch.randn(s.vision_batch, channels, height, width, device=s.device)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        for pass_ in ("train", "infer"):
            progress(f"dice: {channels}x{height}x{width}, {pass_}")
            steps: dict[str, Callable[[], object]] = {}
            for name, variant in units.items():
                variant.train(pass_ == "train")
                if pass_ == "train":
                    steps[name] = forward_backward(
                        functools.partial(variant, x), s.device, s.vision_precision
                    )
                else:
                    steps[name] = vision_infer_step(variant, x, s)
            timings = time_interleaved(steps, s)
            for name, t in timings.items():
                memory = peak_mib(steps[name], s.device) if t.ms and pass_ == "train" else None
                rows.append(
                    {
                        "part": "dice", "name": name, "pass": pass_,
                        "shape": f"{channels}x{height}x{width}", "batch": s.vision_batch,
                        "precision": s.vision_precision, "ms": rounded(t.ms, 4),
                        "peak_mib": memory,
                        "speedup_vs_reference": ratio(timings["reference"].ms, t.ms),
                        "speedup_vs_kernel": ratio(timings["kernel"].ms, t.ms)
                        if "kernel" in timings else None,
                        "error": t.error,
                    }
                )  # fmt: skip
            del steps
            release(s.device)
        del unit, units, x
        release(s.device)
    return rows


def compile_probe(name: str, s: Settings, results: Connection) -> None:
    """In a child process: compile ``name``'s training step, time its first call and a few more."""
    if hasattr(os, "setpgid"):
        os.setpgid(0, 0)  # its own process group, so that a timeout also stops compile workers
    try:
        configure(s)
        net = vision_net(name, s).train()
        x, labels = vision_inputs(s, s.vision_batch)
        step = vision_train_step(net, torch.compile(net), x, labels, s)
        # a few more untimed calls after the compile: the first ones after it ran several times
        # slower on the CPU (0.2-0.5 s against 60-75 ms later), which a 3-sample median kept
        timed = replace(s, warmup=max(s.warmup, 4))
        results.send(asdict(time_interleaved({name: step}, timed)[name]))
    except Exception as error:  # reported by the parent
        results.send({"error": describe(error)})


def stop(child: multiprocessing.process.BaseProcess) -> None:
    """Kill a child process with its process group (the compile workers it started)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (AttributeError, OSError):  # no process groups here, or the child has none yet
        child.kill()


def vision_compile_row(name: str, s: Settings) -> dict:
    """The compile time of one network's training step, measured in a child process (spawned, as
    CUDA needs) that is stopped after ``compile_timeout`` seconds."""
    progress(f"vision: compiling {name} (timeout {s.compile_timeout:g} s)")
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=compile_probe, args=(name, s, sender))
    child.start()
    sender.close()  # the child holds the only sending end: its exit reads as end of file here
    deadline = time.monotonic() + s.compile_timeout
    result: dict | None = None
    while result is None:
        if receiver.poll(1.0):
            try:
                result = receiver.recv()
            except EOFError:
                child.join()
                result = {"error": f"the compiling process exited with code {child.exitcode}"}
        elif time.monotonic() > deadline:
            stop(child)
            result = {"error": f"timeout after {s.compile_timeout:g} s"}
    child.join(60.0)
    if child.is_alive():  # sent its result but does not exit
        stop(child)
        child.join()
    receiver.close()
    ms = result.get("ms")
    return {
        "part": "vision_compile",
        "name": name,
        "pass": "train",
        "precision": s.vision_precision,
        "batch": s.vision_batch,
        "image_size": s.image_size,
        "compile_s": rounded(result.get("first_s"), 2),
        "graphs": result.get("graphs"),
        "graph_breaks": result.get("graph_breaks"),
        "compiled_ms": rounded(ms),
        "compiled_images_per_s": round(s.vision_batch / ms * 1e3, 1) if ms else None,
        "error": result.get("error"),
    }


# --- amp ----------------------------------------------------------------------------------------

# (build the module, run it under autocast: (output, scalar loss))
AmpCase = tuple[Callable[[], nn.Module], Callable[[nn.Module], tuple[Tensor, Tensor]]]


def amp_cases(s: Settings) -> dict[str, AmpCase]:
    """name -> (build the module, run it: (output, scalar loss)) for every module above, small."""
    x = torch.randn(1, min(s.tokens[0], SEQ), D_M, device=s.device)
    tokens = torch.randint(VOCAB, (2, s.lm_len + 1), device=s.device)
    memories = enwik8_memories(2, s.lm_len, s.device)
    images, labels = vision_inputs(s, 2)

    def dextra(net: nn.Module) -> tuple[Tensor, Tensor]:
        out = net(x)
        return out, out.float().square().mean()

    def lm(net: nn.Module) -> tuple[Tensor, Tensor]:
        logits, _ = net(tokens[:, :-1], memories)
        return logits, F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def classify(net: nn.Module) -> tuple[Tensor, Tensor]:
        logits = net(images)
        return logits, F.cross_entropy(logits, labels)

    cases: dict[str, AmpCase] = {
        "dextra_auto": (dextra_unit, dextra),
        "dextra_reference": (lambda: with_impl(dextra_unit(), "reference"), dextra),
    }
    for name in LM_NAMES:
        cases[name] = (lambda name=name: lm_model(name, s.lm_len), lm)
    for name in vision_names(s):
        cases[name] = (lambda name=name: vision_net(name, s), classify)
    return cases


def amp_check(
    build: Callable[[], nn.Module],
    run: Callable[[nn.Module], tuple[Tensor, Tensor]],
    precision: str,
    device: torch.device,
) -> tuple[str, str | None, str | None]:
    """(status, output dtype, detail) of one forward+backward under autocast."""
    try:
        torch.manual_seed(0)
        net = build().to(device).train()
        with autocast(device, precision):
            out, loss = run(net)
        loss.backward()
    except Exception as error:  # reported in the case's row
        release(device)
        return "error", None, describe(error)
    bad = [
        name
        for name, p in net.named_parameters()
        if p.grad is not None and not p.grad.isfinite().all()
    ]
    if not loss.isfinite():
        return "nonfinite", str(out.dtype), f"loss {loss.item()}"
    if bad:
        return "nonfinite", str(out.dtype), f"{len(bad)} gradients, e.g. {bad[0]}"
    return "ok", str(out.dtype), None


def amp_part(s: Settings) -> list[dict]:
    precisions = ("bf16", "fp16") if s.device.type == "cuda" else ("bf16",)
    rows = []
    for precision in precisions:
        progress(f"amp: {precision}")
        for name, (build, run) in amp_cases(s).items():
            status, dtype, detail = amp_check(build, run, precision, s.device)
            rows.append(
                {
                    "part": "amp",
                    "name": name,
                    "precision": precision,
                    "status": status,
                    "output_dtype": dtype,
                    "error": detail,
                }
            )
    return rows


# --- output -------------------------------------------------------------------------------------

COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    # part -> (header, row key, format spec)
    "dextra": [
        ("name", "name", ""),
        ("path", "path", ""),
        ("tokens", "tokens", ","),
        ("precision", "precision", ""),
        ("ms", "ms", ".3f"),
        ("TFLOP/s", "tflops", ".3g"),
        ("x reference", "speedup_vs_reference", ".2f"),
        ("of dense", "fraction_of_dense", ".2f"),
    ],
    "charlm": [
        ("model", "name", ""),
        ("precision", "precision", ""),
        ("mode", "mode", ""),
        ("batch", "batch", ""),
        ("T", "segment", ""),
        ("ms", "ms", ".2f"),
        ("tokens/s", "tokens_per_s", ",.1f"),
        ("x TXL", "speedup_vs_txl", ".2f"),
        ("compile s", "compile_s", ".1f"),
        ("graphs", "graphs", ""),
        ("breaks", "graph_breaks", ""),
    ],
    "vision": [
        ("model", "name", ""),
        ("pass", "pass", ""),
        ("precision", "precision", ""),
        ("batch", "batch", ""),
        ("size", "image_size", ""),
        ("ms", "ms", ".2f"),
        ("images/s", "images_per_s", ",.1f"),
        ("x shufflenet", "speedup_vs_shufflenet", ".2f"),
        ("x reference", "speedup_vs_reference", ".2f"),
    ],
    "vision_compile": [
        ("model", "name", ""),
        ("pass", "pass", ""),
        ("batch", "batch", ""),
        ("compile s", "compile_s", ".1f"),
        ("graphs", "graphs", ""),
        ("breaks", "graph_breaks", ""),
        ("compiled ms", "compiled_ms", ".2f"),
        ("images/s", "compiled_images_per_s", ",.1f"),
    ],
    "dice": [
        ("path", "name", ""),
        ("pass", "pass", ""),
        ("C x H x W", "shape", ""),
        ("batch", "batch", ""),
        ("precision", "precision", ""),
        ("ms", "ms", ".3f"),
        ("peak MiB", "peak_mib", ".1f"),
        ("x reference", "speedup_vs_reference", ".2f"),
        ("x kernel", "speedup_vs_kernel", ".2f"),
    ],
    "dice_memory": [
        ("path", "name", ""),
        ("image", "shape", ""),
        ("saved MiB/image", "saved_mib_per_image", ".2f"),
        ("x kernel", "fraction_of_base", ".3f"),
    ],
    "wgrad": [
        ("method", "name", ""),
        ("tokens", "tokens", ","),
        ("precision", "precision", ""),
        ("g x k x n", "shape", ""),
        ("ms", "ms", ".4f"),
        ("TFLOP/s", "tflops", ".3g"),
        ("x bmm", "speedup_vs_bmm", ".2f"),
        ("fastest", "fastest", ""),
    ],
    "amp": [
        ("case", "name", ""),
        ("precision", "precision", ""),
        ("status", "status", ""),
        ("output", "output_dtype", ""),
    ],
}


def print_table(part: str, rows: list[dict]) -> None:
    """Text columns left-aligned, numbers right-aligned, empty columns left out; a row's error
    ends its line."""
    columns = [
        (header, key, spec)
        for header, key, spec in COLUMNS[part]
        if any(row.get(key) is not None for row in rows)
    ]
    cells = [[cell(row.get(key), spec) for _, key, spec in columns] for row in rows]
    widths = [
        max([len(header)] + [len(c[i]) for c in cells]) for i, (header, _, _) in enumerate(columns)
    ]
    numeric = [
        all(isinstance(row.get(key), (int, float, type(None))) for row in rows)
        for _, key, _ in columns
    ]

    def line(values: list[str]) -> str:
        aligned = zip(values, widths, numeric, strict=True)
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in aligned).rstrip()

    header = line([header for header, _, _ in columns])
    print(header)
    print("-" * len(header))
    for row, values in zip(rows, cells, strict=True):
        error = row.get("error")
        print(line(values) + (f"  {row.get('status', 'error')}: {error}" if error else ""))


def fmt_seconds(row: dict) -> str:
    if row.get("compile_s") is None:
        return f"error ({row.get('error')})"
    return f"{row['compile_s']:.1f} s ({row.get('graph_breaks')} breaks)"


def summary(rows: list[dict]) -> list[str]:
    """One line per compared group with the ratios it measures; "n/a" where an entry failed."""
    lines = []
    kernels = {
        (r["tokens"], r["precision"]): r
        for r in rows
        if r["part"] == "dextra" and r["name"] == "dextra_triton"
    }
    for r in rows:
        if r["part"] == "dextra" and r["name"] == "dextra_auto":
            kernel = kernels.get((r["tokens"], r["precision"]))
            forced = (
                f"; triton / reference {fmt_ratio(kernel['speedup_vs_reference'])}"
                if kernel
                else ""
            )
            lines.append(
                f"dextra  {r['tokens']:>6} tokens {r['precision']:<5} auto ({r['path']}) / "
                f"reference {fmt_ratio(r['speedup_vs_reference'])}{forced}; auto runs at "
                f"{fmt_ratio(r['fraction_of_dense'])} a dense GEMM's speed"
            )
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        if r["part"] == "charlm" and r.get("name"):
            groups.setdefault((r["precision"], r["mode"]), {})[r["name"]] = r
    for (precision, mode), group in groups.items():
        text = ", ".join(
            f"{SHORT[name]} / TXL {fmt_ratio(group.get(name, {}).get('speedup_vs_txl'))}"
            for name in LM_NAMES[1:]
        )
        plain = [
            f"{SHORT[base]} {fmt_ratio(ratio(r['ms'], group[base].get('ms')))}"
            for name, r in group.items()
            if name.endswith(PLAIN) and (base := name.removesuffix(PLAIN)) in group
        ]
        if plain:
            text += "; auto / plain " + ", ".join(plain)
        if mode == "compiled":
            text += "; compile " + ", ".join(
                f"{SHORT[name]} {fmt_seconds(r)}" for name, r in group.items()
            )
        lines.append(f"charlm  {precision:<5} {mode:<9} {text}")
    for pass_ in ("train", "infer"):
        vision = [r for r in rows if r["part"] == "vision" and r["pass"] == pass_]
        if not vision:
            continue
        text = ", ".join(
            f"{r['name']} {fmt_ratio(r['speedup_vs_shufflenet'])}"
            for r in vision
            if r["name"] != BASELINE_CNN
        )
        names = {r["name"] for r in vision}
        kernel = "".join(
            f"; {r['name']} auto / reference {fmt_ratio(r['speedup_vs_reference'])}"
            for r in vision
            if f"{r['name']}_reference" in names
        )
        lines.append(
            f"vision  {pass_:<5} {vision[0]['precision']:<5} x {BASELINE_CNN}: {text}{kernel}"
        )
    compiled = [r for r in rows if r["part"] == "vision_compile"]
    if compiled:
        lines.append(
            "vision  compile " + ", ".join(f"{r['name']} {fmt_seconds(r)}" for r in compiled)
        )
    for pass_ in ("train", "infer"):
        dice = {
            (r["shape"], r["name"]): r for r in rows if r["part"] == "dice" and r["pass"] == pass_
        }
        if dice:
            shapes = list(dict.fromkeys(shape for shape, _ in dice))
            best = "fused" if any(name == "fused" for _, name in dice) else "auto"
            text = ", ".join(
                f"{shape} {fmt_ratio(dice.get((shape, best), {}).get('speedup_vs_reference'))}"
                for shape in shapes
            )
            lines.append(f"dice    {pass_:<5} {best} / reference: {text}")
    memory = [r for r in rows if r["part"] == "dice_memory"]
    if memory:
        text = ", ".join(f"{r['name']} {r['saved_mib_per_image']:.2f}" for r in memory)
        lines.append(f"dice    DiCENet activation MiB per image: {text}")
    wgrad: dict[tuple[int, str], list[str]] = {}
    for r in rows:
        if r["part"] == "wgrad" and r["name"] == "split_k":
            wgrad.setdefault((r["tokens"], r["precision"]), []).append(
                f"{r['shape']} {fmt_ratio(r['speedup_vs_bmm'])}"
            )
    for (tokens, precision), shapes in wgrad.items():
        lines.append(
            f"wgrad   {tokens:>6} tokens {precision:<5} split-K / bmm: {', '.join(shapes)}"
        )
    for precision in ("bf16", "fp16"):
        amp = [r for r in rows if r["part"] == "amp" and r.get("precision") == precision]
        if amp:
            by_status = {
                status: [r["name"] for r in amp if r["status"] == status]
                for status in ("ok", "nonfinite", "error")
            }
            text = ", ".join(f"{len(names)} {status}" for status, names in by_status.items())
            failing = by_status["nonfinite"] + by_status["error"]
            lines.append(
                f"amp     {precision:<5} {text}" + (f" ({', '.join(failing)})" if failing else "")
            )
    errors = [r for r in rows if r["part"] != "amp" and r.get("error")]
    if errors:
        names = ", ".join(f"{r['part']}/{r.get('name')}" for r in errors)
        lines.append(f"errors  {len(errors)} timed entries raised (see their rows): {names}")
    return lines


def environment(s: Settings) -> dict:
    cuda = s.device.type == "cuda"
    triton_version = None
    if triton_available():
        import triton

        triton_version = triton.__version__
    return {
        "part": "environment",
        "device": torch.cuda.get_device_name(s.device) if cuda else cpu_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "triton": triton_version,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "threads": torch.get_num_threads(),
        "settings": {k: str(v) if k == "device" else v for k, v in asdict(s).items()},
    }


def by_device(flag: str) -> str:
    """A flag's defaults as help text: "cuda 21, cpu 3"."""
    key = flag.removeprefix("--").replace("-", "_")
    return ", ".join(
        f"{device} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for device, values in DEFAULTS.items()
        for v in (values[key],)
    )


def parse_settings(argv: list[str] | None = None) -> tuple[Settings, str | None]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cuda (default where available) or cpu",
    )
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS), help="parts to run (default: all)"
    )
    for flag, kind, text in (
        ("--repeats", int, "timed runs per entry"),
        ("--warmup", int, "untimed calls per entry first, at least 1"),
        ("--lm-batch", int, "LM sub-streams per training step"),
        ("--lm-len", int, "LM segment length, also the memory length"),
        ("--vision-batch", int, "images per step"),
        ("--image-size", int, "image height and width"),
    ):
        parser.add_argument(flag, type=kind, help=f"{text} ({by_device(flag)})")
    parser.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        help=f"DExTra tokens per call, below 512 or multiples of it ({by_device('--tokens')})",
    )
    parser.add_argument(
        "--vision-precision",
        choices=("bf16", "fp16", "fp32"),
        help=f"vision autocast, fp32 for none ({by_device('--vision-precision')})",
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="also time the LMs under torch.compile and compile DiCENet and "
        "ESPNetv2 (default: on with cuda)",
    )
    parser.add_argument(
        "--compile-timeout",
        type=float,
        default=600.0,
        help="seconds a vision network may take to compile and run (default 600)",
    )
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="TF32 for fp32 matmuls, in torch and in the Triton kernels",
    )
    parser.add_argument(
        "--threads", type=int, help="torch intra-op threads (cuda: torch's default, cpu 1)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every row (JSON lines) to PATH")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but CUDA is not available")
    if device.type not in DEFAULTS:
        parser.error(f"--device must be cuda or cpu, got {args.device!r}")
    defaults = DEFAULTS[device.type]

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return defaults[name] if value is None else value

    tokens = tuple(pick("tokens"))
    bad = [t for t in tokens if t < 1 or t % min(t, SEQ)]
    if bad:
        parser.error(f"--tokens must be below {SEQ} or multiples of it, got {bad}")
    settings = Settings(
        device=device,
        parts=tuple(args.parts),
        repeats=pick("repeats"),
        warmup=max(1, pick("warmup")),
        tokens=tokens,
        lm_batch=pick("lm_batch"),
        lm_len=pick("lm_len"),
        vision_batch=pick("vision_batch"),
        image_size=pick("image_size"),
        vision_precision=pick("vision_precision"),
        compile=device.type == "cuda" if args.compile is None else args.compile,
        compile_timeout=args.compile_timeout,
        tf32=args.tf32,
        threads=pick("threads") or torch.get_num_threads(),
    )
    if settings.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {settings.repeats}")
    return settings, args.json


def configure(s: Settings) -> None:
    """Threads, cuDNN autotuning (on CUDA) and TF32, in this process."""
    torch.set_num_threads(s.threads)
    if s.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    if s.tf32:
        torch.set_float32_matmul_precision("high")  # the GLT kernel follows it too


def main() -> None:
    s, json_path = parse_settings()
    configure(s)
    run = {
        "dextra": dextra_part, "charlm": charlm_part, "vision": vision_part, "dice": dice_part,
        "wgrad": wgrad_part, "amp": amp_part,
    }  # fmt: skip
    titles = {
        "dextra": f"DExTra(d_m={D_M}, w_m=2, N=8) forward+backward",
        "charlm": f"enwik8 LM training step (Adam), {s.lm_batch} x {s.lm_len} characters, "
        f"memory {s.lm_len}",
        "vision": f"training and inference, {s.vision_batch} x {s.image_size}^2 images, "
        f"{s.vision_precision}, channels-last",
        "dice": f"DiCE units of DiCENet s=1.0, batch {s.vision_batch}, {s.vision_precision}, "
        "channels-last",
        "wgrad": "GLT weight gradient x^T dy (+ column sums) of the DExTra unit's shapes",
        "amp": "mixed precision forward+backward",
    }
    rows: list[dict] = []
    for part in s.parts:
        print(f"\n== {part}: {titles[part]}; {s.device.type}, median of {s.repeats} ==")
        try:
            part_rows = run[part](s)
        except Exception as error:  # a part that cannot even be set up; the next part still runs
            part_rows = [{"part": part, "name": None, "error": describe(error)}]
            print(f"error: {part_rows[0]['error']}")
        else:
            for table in dict.fromkeys(r["part"] for r in part_rows):
                print_table(table, [r for r in part_rows if r["part"] == table])
        for row in part_rows:
            print(json.dumps(row))
        rows += part_rows
        release(s.device)

    env = environment(s)
    print("\n== summary (ratios > 1: faster than the baseline) ==")
    for line in summary(rows):
        print(line)
    print(json.dumps(env))
    if json_path:
        with open(json_path, "w") as file:
            for row in rows + [env]:
                file.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
