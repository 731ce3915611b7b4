"""Launch configurations of the fused Triton kernels on a GPU: per kernel and shape, the time of
every configuration swept, and which won.

Each kernel module reads its GPU launch configuration (tile elements, block shapes, warps,
pipelining stages, split-K programs) from module globals at every launch. Here, case by case, a
training step (forward, then backward from a ones gradient) of an op forced onto its Triton path
(``impl="triton"``) at the models' shapes is timed under each configuration of a small grid of
those globals, under bf16 autocast and in fp32. The cases, most important first:

- ``glt``: DExTra(d_m=512, w_m=2, N=8, g_max=16), the unit of ``benchmarks/gpu.py``, on
  ``--tokens`` tokens (16,384); ``group_linear``'s BLOCK_R_GPU x BLOCK_T_MAX_GPU x BLOCK_C_MAX x
  WARPS_GPU at the default STAGES_GPU, then STAGES_GPU at the best of those (26 configurations).
- ``glt_wgrad``: the GLT weight gradient x^T dy (with dy's column sums) alone, per weight shape of
  that unit at those tokens: split-K (``weight_grad_splitk``) at each SPLIT_K_PROGRAMS_PER_SM, then
  ``torch.bmm`` on strided views (``weight_grad_bmm``, method "bmm").
- ``dice``: one DiCE unit per distinct DiCENet s=1.0 stage shape, DimConv and the local fusion as
  one pass; ``dim_conv``'s TILE_GPU x WARPS_GPU (they configure the DimConv, DimFuse and EESP
  kernels alike).
- ``eesp``: each distinct stride-1 EESP unit of ESPNetv2 s=1.0 at its level's size, the fused
  pyramid; the same globals.
- ``bn_prelu``: the fused BatchNorm + PReLU on DiCENet's CBR maps (24 x 112^2, 116 x 28^2,
  464 x 7^2 at 224^2 images); ELEMENTS_GPU x WARPS_GPU, then CHANNELS_GPU at the best.
- ``grouped_norm``: Group-Transformer's per-group layer norm on 22 x 512 rows of width 256 in 2
  and 4 groups; ELEMENTS_GPU x WARPS_GPU.
- ``relative_softmax``: the relative-attention softmax of (22, 8, 512, 1024) scores under the
  causal memory mask; ELEMENTS_PER_THREAD.
- ``dextra_norm``: DeLighT's per-group LayerNorm and swish on ``--tokens`` rows of DExTra GLT
  outputs (360 features in 4 groups, 704 in 16); ELEMENTS_GPU x WARPS_GPU.
- ``residual_norm``: DeLighT's post-norm residual ``LayerNorm(residual + dropout(branch))`` on
  ``--tokens`` rows of d_m 320 and 512 (a float32 residual, the branch in the precision);
  ELEMENTS_GPU x WARPS_GPU.

The vision cases take ``--vision-batch`` (256) images of ``--image-size`` (224), channels-last,
nets and inputs alike; the defaults are ``benchmarks/gpu.py``'s on CUDA.

A configuration's first call compiles its kernels (its seconds are reported as ``first_s``),
``--warmup`` - 1 more calls follow, and its time is the median of ``--repeats`` calls, CUDA
synchronised around each. The globals are set before and restored after every configuration,
whatever happens; one that raises (a build asking for more shared memory than a block may have)
is reported with its error and the sweep goes on. The default configuration is timed first, so
every shape reports its time and the best one's speed-up over it. Shapes and precisions are swept
in turn, bf16 first (the models train under bf16 autocast), each through all its stages. Before
a stage is timed, ``--compile-jobs`` worker processes run each of its configurations once, so
that Triton compiles them in parallel into its on-disk cache and the timed first calls only load
them (0: each compiles in its first call).

Cases run in order until ``--budget`` seconds have passed since the start; the sweep then stops
between two configurations and reports what it measured: the case it stopped in as cut (with
the shape and precision it stopped in, whose best so far is no winner) and the cases after it as
skipped.

Output: one JSON line per configuration timed on stdout, then per case a Markdown table (shape,
precision, default ms, best configuration, best ms, speed-up = default / best). ``--json PATH``
writes every row, the tables' rows, ``winners`` ({case: {"shape/precision": configuration}},
the globals by ``module.NAME``) and the finished, cut ({case: "shape/precision"}) and skipped
cases; ``--md PATH`` the Markdown.

``--dry`` runs the sweep on the CPU in Triton's interpreter (``TRITON_INTERPRET=1``) at tiny
shapes, one per case, with at most two values per global and one repeat, every launch configured
as for an H100 (:func:`src.kernels.triton.launch.launches_for`) so that the globals reach the
launches. Its times mean nothing: it checks the plumbing (``tests/test_gpu_tune.py``).

    python benchmarks/gpu_tune.py [--budget 120] [--cases glt glt_wgrad dice eesp bn_prelu
        grouped_norm relative_softmax dextra_norm residual_norm] [--precisions bf16 fp32]
        [--repeats 10] [--warmup 2]
        [--tokens 16384] [--vision-batch 256] [--image-size 224] [--compile-jobs 8]
        [--json PATH] [--md PATH] [--dry]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import datetime
import functools
import itertools
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

# --dry runs the kernels in Triton's interpreter, which is chosen when a kernel is defined: before
# the kernel modules are imported
if __name__ == "__main__" and "--dry" in sys.argv[1:]:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
from torch import nn

from benchmarks.common import (
    D_M,
    IMAGE_SIZE,
    LM_BATCH,
    LM_LEN,
    LM_WIDTH,
    SEQ,
    VISION_BATCH,
    cell,
    cpu_name,
    describe,
    dextra_unit,
    dicenet_dice_shapes,
    fmt_ratio,
    forward_backward,
    glt_weight_shapes,
    progress,
    ratio,
    release,
    run_once,
    synchronize,
    with_impl,
)
from benchmarks.cross_compile import H100
from src.kernels.batch_norm_prelu import batch_norm_prelu
from src.kernels.batch_norm_prelu import triton_kernel as bn_prelu_kernels
from src.kernels.group_linear import triton_kernel as glt_kernels
from src.kernels.per_group_layer_norm import triton_kernel as grouped_norm_kernels
from src.kernels.relative_softmax import relative_softmax
from src.kernels.relative_softmax import triton_kernel as softmax_kernels
from src.kernels.residual_layer_norm import residual_layer_norm
from src.kernels.residual_layer_norm import triton_kernel as residual_norm_kernels
from src.kernels.shared_group_layer_norm import shared_group_layer_norm_swish
from src.kernels.shared_group_layer_norm import triton_kernel as dextra_norm_kernels
from src.kernels.triton import stencil as dim_conv_kernels
from src.kernels.triton.launch import launches_for
from src.models.espnetv2 import ESPNetv2Backbone
from src.ops.dextra import DExTra
from src.ops.dice import DiCE
from src.ops.eesp import EESP
from src.ops.per_group_layer_norm import PerGroupLayerNorm
from src.ops.relative_position import causal_memory_mask

PRECISIONS = ("bf16", "fp32")  # bf16 first: the models train under bf16 autocast
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LM_HEADS = 8  # Transformer-XL (9, 256, 8), gpu.py's LM baseline, and the Group-Transformers
# DiCENet s=1.0's CBR maps: (channels, stride); 24 x 112^2, 116 x 28^2, 464 x 7^2 at 224^2 images
CBR_MAPS = ((24, 2), (116, 8), (464, 32))
NORM_GROUPS = (2, 4)  # the Group-Transformers of gpu.py's charlm part

# per run kind: the sizes a run uses unless a flag says otherwise
DEFAULTS: dict[str, dict[str, Any]] = {
    "cuda": {
        "repeats": 10, "warmup": 2, "tokens": 16384,
        "vision_batch": VISION_BATCH, "image_size": IMAGE_SIZE, "lm_batch": LM_BATCH,
        "lm_len": LM_LEN,
        "compile_jobs": min(8, max(1, (os.cpu_count() or 2) - 1)),
    },
    # the interpreter's cost grows with the programs of a launch: one tile, a few, at most
    "dry": {
        "repeats": 1, "warmup": 1, "tokens": 64, "vision_batch": 1, "image_size": 32,
        "lm_batch": 1, "lm_len": 8, "compile_jobs": 0,
    },
}  # fmt: skip

Config = dict[str, Any]  # knob name -> value
Run = Callable[[Config], object]  # one step under a configuration


@dataclass(frozen=True)
class Knob:
    """A launch setting swept: a kernel module's global ``module.NAME``, read at every launch, or
    (``module`` None) a choice that the case's step reads from the configuration."""

    name: str
    values: tuple[Any, ...]
    dry: tuple[Any, ...]  # the values --dry sweeps
    module: ModuleType | None = None
    default: Any = None  # without a module; a global's default is its value when a case starts

    @property
    def attribute(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    def current(self) -> Any:
        return self.default if self.module is None else getattr(self.module, self.attribute)


BLOCK_R = Knob("group_linear.BLOCK_R_GPU", (32, 64, 128), (32, 64), glt_kernels)
BLOCK_T = Knob("group_linear.BLOCK_T_MAX_GPU", (32, 64), (32,), glt_kernels)
BLOCK_C = Knob("group_linear.BLOCK_C_MAX", (64, 128), (64,), glt_kernels)
GLT_WARPS = Knob("group_linear.WARPS_GPU", (4, 8), (8,), glt_kernels)
GLT_STAGES = Knob("group_linear.STAGES_GPU", (2, 3, 4), (2, 3), glt_kernels)
SPLIT_K = Knob("group_linear.SPLIT_K_PROGRAMS_PER_SM", (1, 2, 4, 8, 16), (1, 4), glt_kernels)
METHODS = tuple(glt_kernels.WEIGHT_GRAD_METHODS)
WGRAD_METHOD = Knob("method", METHODS, METHODS, default="splitk")  # glt_wgrad's: splitk or bmm
TILE = Knob("dim_conv.TILE_GPU", (256, 512, 1024, 2048), (256, 512), dim_conv_kernels)
CONV_WARPS = Knob("dim_conv.WARPS_GPU", (4, 8, 16), (8,), dim_conv_kernels)
BN_ELEMENTS = Knob(
    "batch_norm_prelu.ELEMENTS_GPU", (2048, 4096, 8192, 16384), (2048, 4096), bn_prelu_kernels
)
BN_WARPS = Knob("batch_norm_prelu.WARPS_GPU", (4, 8, 16), (8,), bn_prelu_kernels)
BN_CHANNELS = Knob("batch_norm_prelu.CHANNELS_GPU", (64, 128, 256), (64, 128), bn_prelu_kernels)
NORM_ELEMENTS = Knob(
    "grouped_norm.ELEMENTS_GPU", (2048, 4096, 8192), (2048, 4096), grouped_norm_kernels
)
NORM_WARPS = Knob("grouped_norm.WARPS_GPU", (4, 8, 16), (8,), grouped_norm_kernels)
DEXTRA_NORM_ELEMENTS = Knob(
    "shared_group_layer_norm.ELEMENTS_GPU", (1024, 2048, 4096), (1024, 2048), dextra_norm_kernels
)
DEXTRA_NORM_WARPS = Knob("shared_group_layer_norm.WARPS_GPU", (4, 8, 16), (8,), dextra_norm_kernels)
RESIDUAL_NORM_ELEMENTS = Knob(
    "residual_layer_norm.ELEMENTS_GPU", (1024, 2048, 4096), (1024, 2048), residual_norm_kernels
)
RESIDUAL_NORM_WARPS = Knob("residual_layer_norm.WARPS_GPU", (4, 8, 16), (8,), residual_norm_kernels)
SOFTMAX_ELEMENTS = Knob(
    "relative_softmax.ELEMENTS_PER_THREAD", (2, 4, 8, 16), (4, 8), softmax_kernels
)


@dataclass(frozen=True)
class Settings:
    """What one run measures, after the defaults are filled in."""

    device: torch.device
    dry: bool
    cases: tuple[str, ...]
    precisions: tuple[str, ...]
    budget: float
    repeats: int
    warmup: int
    tokens: int
    vision_batch: int
    image_size: int
    lm_batch: int
    lm_len: int
    compile_jobs: int


Stage = Callable[[Config, Settings], list[Config]]  # the best configuration so far -> the next


def grid(*knobs: Knob) -> Stage:
    """A stage: every combination of ``knobs``' values, the other knobs as in the best
    configuration so far."""

    def configs(best: Config, s: Settings) -> list[Config]:
        axes = [knob.dry if s.dry else knob.values for knob in knobs]
        return [
            {**best, **{knob.name: value for knob, value in zip(knobs, combo, strict=True)}}
            for combo in itertools.product(*axes)
        ]

    return configs


def other_methods(best: Config, s: Settings) -> list[Config]:
    """A stage: the weight-gradient methods other than split-K, which take no split-K programs."""
    methods = WGRAD_METHOD.dry if s.dry else WGRAD_METHOD.values
    return [{WGRAD_METHOD.name: method} for method in methods if method != "splitk"]


@dataclass(frozen=True)
class Shape:
    """One shape of a case: its label and ``build(precision)``, which makes the inputs and
    returns the step."""

    label: str
    build: Callable[[str], Run]


@dataclass(frozen=True)
class Case:
    """An op to tune: the knobs its configurations set, the stages that sweep them (the default
    configuration is timed before the first) and its shapes for a run."""

    title: str
    knobs: tuple[Knob, ...]
    stages: tuple[Stage, ...]
    shapes: Callable[[Settings], list[Shape]]


def training_step(fn: Callable[[], torch.Tensor], s: Settings, precision: str) -> Run:
    """``fn()`` under the precision's autocast, then backward from a ones gradient."""
    step = forward_backward(fn, s.device, precision)
    return lambda config: step()


def channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last).requires_grad_()


# --- glt, glt_wgrad -----------------------------------------------------------------------------


def glt_unit(s: Settings) -> DExTra:
    """gpu.py's DExTra unit; under --dry one of width 64, depth 4 and g_max 4."""
    if s.dry:
        return DExTra(64, 32, 32, width_multiplier=2.0, depth=4, max_groups=4)
    return dextra_unit()


def glt_shapes(s: Settings) -> list[Shape]:
    def build(precision: str) -> Run:
        torch.manual_seed(0)
        unit = with_impl(glt_unit(s), "triton").to(s.device)
        seq = min(s.tokens, SEQ)
        # (tokens / seq, seq, d_m)
        x = torch.randn(s.tokens // seq, seq, unit.in_features, device=s.device, requires_grad=True)
        return training_step(lambda: unit(x), s, precision)

    return [Shape(f"dextra(d_m={glt_unit(s).in_features}) x {s.tokens} tokens", build)]


def wgrad_shapes(s: Settings) -> list[Shape]:
    def shape(groups: int, k: int, n: int) -> Shape:
        def build(precision: str) -> Run:
            dtype = DTYPES[precision]
            xg = torch.randn(s.tokens, groups, k, device=s.device, dtype=dtype)
            dy = torch.randn(s.tokens, groups, n, device=s.device, dtype=dtype)
            out = torch.empty(groups, k, n, device=s.device, dtype=dtype)
            colsum = torch.empty(groups, n, device=s.device, dtype=dtype)
            methods = glt_kernels.WEIGHT_GRAD_METHODS
            return lambda config: methods[config[WGRAD_METHOD.name]](xg, dy, out, colsum)

        return Shape(f"{groups}x{k}x{n} x {s.tokens} tokens", build)

    shapes = glt_weight_shapes()
    return [shape(*weight) for weight in (shapes[:1] if s.dry else shapes)]


# --- dice, eesp, bn_prelu -----------------------------------------------------------------------


def vision_unit(unit: nn.Module, s: Settings, precision: str, shape: Sequence[int]) -> Run:
    """A training step of ``unit`` on a channels-last (B, C, H, W) input, both on the device."""
    torch.manual_seed(0)
    unit = unit.to(s.device, memory_format=torch.channels_last).train()
    x = channels_last(torch.randn(s.vision_batch, *shape, device=s.device))
    return training_step(lambda: unit(x), s, precision)


def dice_shapes(s: Settings) -> list[Shape]:
    def shape(channels: int, height: int, width: int) -> Shape:
        def build(precision: str) -> Run:
            unit = DiCE(channels, channels, height, width, impl="triton")
            return vision_unit(unit, s, precision, (channels, height, width))

        return Shape(f"{channels}x{height}x{width} b{s.vision_batch}", build)

    shapes = dicenet_dice_shapes(s.image_size)
    return [shape(*dims) for dims in (shapes[:1] if s.dry else shapes)]


def eesp_units(image_size: int) -> dict[tuple[int, int, int], EESP]:
    """The distinct stride-1 EESP units of ESPNetv2 s=1.0 by (C_in, C_out, size at
    ``image_size``), in level order (the units of level l see size / 2^l)."""
    units: dict[tuple[int, int, int], EESP] = {}
    for name, module in ESPNetv2Backbone(scale=1.0).named_modules():
        if isinstance(module, EESP) and module.stride == 1:
            level = int(name.removeprefix("level").split(".")[0])  # "level4.2" -> 4
            size = math.ceil(image_size / 2**level)
            units.setdefault((module.in_channels, module.out_channels, size), module)
    return units


def eesp_shapes(s: Settings) -> list[Shape]:
    def shape(key: tuple[int, int, int], unit: EESP) -> Shape:
        c_in, c_out, size = key

        def build(precision: str) -> Run:
            fused = copy.deepcopy(unit)
            fused.impl = "triton"
            return vision_unit(fused, s, precision, (c_in, size, size))

        return Shape(f"{c_in}->{c_out}x{size}x{size} b{s.vision_batch}", build)

    units = list(eesp_units(s.image_size).items())
    return [shape(*item) for item in (units[:1] if s.dry else units)]


def bn_prelu_shapes(s: Settings) -> list[Shape]:
    def shape(channels: int, stride: int) -> Shape:
        size = math.ceil(s.image_size / stride)

        def build(precision: str) -> Run:
            torch.manual_seed(0)
            norm = nn.BatchNorm2d(channels).to(s.device)
            act = nn.PReLU(channels).to(s.device)
            x = channels_last(
                torch.randn(
                    s.vision_batch, channels, size, size, device=s.device, dtype=DTYPES[precision]
                )
            )
            return training_step(lambda: batch_norm_prelu(x, norm, act, "triton"), s, precision)

        return Shape(f"{channels}x{size}x{size} b{s.vision_batch}", build)

    return [shape(*cbr) for cbr in (CBR_MAPS[:1] if s.dry else CBR_MAPS)]


# --- grouped_norm, relative_softmax -------------------------------------------------------------


def grouped_norm_shapes(s: Settings) -> list[Shape]:
    rows = s.lm_batch * s.lm_len

    def shape(groups: int) -> Shape:
        def build(precision: str) -> Run:
            torch.manual_seed(0)
            norm = PerGroupLayerNorm(LM_WIDTH, groups, impl="triton").to(s.device)
            x = torch.randn(
                rows, LM_WIDTH, device=s.device, dtype=DTYPES[precision], requires_grad=True
            )
            return training_step(lambda: norm(x), s, precision)

        return Shape(f"{rows}x{LM_WIDTH} g{groups}", build)

    return [shape(groups) for groups in (NORM_GROUPS[:1] if s.dry else NORM_GROUPS)]


def relative_softmax_shapes(s: Settings) -> list[Shape]:
    # queries of one segment against a memory of one segment
    heads = 1 if s.dry else LM_HEADS
    shape = (s.lm_batch, heads, s.lm_len, 2 * s.lm_len)  # (B, H, T, K)
    scale = (LM_WIDTH // LM_HEADS) ** -0.5

    def build(precision: str) -> Run:
        torch.manual_seed(0)
        content, position = (
            torch.randn(shape, device=s.device, dtype=DTYPES[precision], requires_grad=True)
            for _ in range(2)
        )
        mask = causal_memory_mask(s.lm_len, s.lm_len, device=s.device)
        return training_step(
            lambda: relative_softmax(content, position, mask, scale, impl="triton"), s, precision
        )

    return [Shape("x".join(map(str, shape)), build)]


# DeLighT's GLT outputs (width, groups): 4 groups of 90 and 16 of 44 features
DEXTRA_NORMS = ((360, 4), (704, 16))


def dextra_norm_shapes(s: Settings) -> list[Shape]:
    def shape(width: int, groups: int) -> Shape:
        def build(precision: str) -> Run:
            torch.manual_seed(0)
            x = torch.randn(
                s.tokens, width, device=s.device, dtype=DTYPES[precision], requires_grad=True
            )
            weight = torch.ones(width // groups, device=s.device, requires_grad=True)
            bias = torch.zeros(width // groups, device=s.device, requires_grad=True)
            return training_step(
                lambda: shared_group_layer_norm_swish(x, groups, weight, bias, impl="triton"),
                s,
                precision,
            )

        return Shape(f"{s.tokens}x{width} g{groups}", build)

    return [shape(*norm) for norm in (DEXTRA_NORMS[:1] if s.dry else DEXTRA_NORMS)]


# DeLighT's model widths: IWSLT's d_m 320 and WMT'16 En-Ro's 512
RESIDUAL_WIDTHS = (320, 512)


def residual_norm_shapes(s: Settings) -> list[Shape]:
    def shape(width: int) -> Shape:
        def build(precision: str) -> Run:
            torch.manual_seed(0)
            residual = torch.randn(s.tokens, width, device=s.device, requires_grad=True)
            branch = torch.randn(
                s.tokens, width, device=s.device, dtype=DTYPES[precision], requires_grad=True
            )
            weight = torch.ones(width, device=s.device, requires_grad=True)
            bias = torch.zeros(width, device=s.device, requires_grad=True)
            return training_step(
                lambda: residual_layer_norm(residual, branch, weight, bias, impl="triton"),
                s,
                precision,
            )

        return Shape(f"{s.tokens}x{width}", build)

    return [shape(width) for width in (RESIDUAL_WIDTHS[:1] if s.dry else RESIDUAL_WIDTHS)]


CASES: dict[str, Case] = {
    "glt": Case(
        f"DExTra(d_m={D_M}, w_m=2, N=8) forward+backward, every GLT on the Triton kernel",
        (BLOCK_R, BLOCK_T, BLOCK_C, GLT_WARPS, GLT_STAGES),
        (grid(BLOCK_R, BLOCK_T, BLOCK_C, GLT_WARPS), grid(GLT_STAGES)),
        glt_shapes,
    ),
    "glt_wgrad": Case(
        "GLT weight gradient x^T dy (+ column sums) of the DExTra unit's weight shapes",
        (WGRAD_METHOD, SPLIT_K),
        (grid(SPLIT_K), other_methods),
        wgrad_shapes,
    ),
    "dice": Case(
        "DiCE units of DiCENet s=1.0 forward+backward, DimConv + local fusion in one pass",
        (TILE, CONV_WARPS),
        (grid(TILE, CONV_WARPS),),
        dice_shapes,
    ),
    "eesp": Case(
        "EESP units (stride 1) of ESPNetv2 s=1.0 forward+backward, the fused pyramid",
        (TILE, CONV_WARPS),
        (grid(TILE, CONV_WARPS),),
        eesp_shapes,
    ),
    "bn_prelu": Case(
        "fused BatchNorm + PReLU forward+backward on DiCENet's CBR maps",
        (BN_ELEMENTS, BN_WARPS, BN_CHANNELS),
        (grid(BN_ELEMENTS, BN_WARPS), grid(BN_CHANNELS)),
        bn_prelu_shapes,
    ),
    "grouped_norm": Case(
        "Group-Transformer's per-group layer norm forward+backward",
        (NORM_ELEMENTS, NORM_WARPS),
        (grid(NORM_ELEMENTS, NORM_WARPS),),
        grouped_norm_shapes,
    ),
    "relative_softmax": Case(
        "relative-attention softmax forward+backward, causal memory mask",
        (SOFTMAX_ELEMENTS,),
        (grid(SOFTMAX_ELEMENTS),),
        relative_softmax_shapes,
    ),
    "dextra_norm": Case(
        "DeLighT's per-group LayerNorm and swish forward+backward on DExTra's GLT outputs",
        (DEXTRA_NORM_ELEMENTS, DEXTRA_NORM_WARPS),
        (grid(DEXTRA_NORM_ELEMENTS, DEXTRA_NORM_WARPS),),
        dextra_norm_shapes,
    ),
    "residual_norm": Case(
        "DeLighT's post-norm residual (dropout, sum, LayerNorm) forward+backward",
        (RESIDUAL_NORM_ELEMENTS, RESIDUAL_NORM_WARPS),
        (grid(RESIDUAL_NORM_ELEMENTS, RESIDUAL_NORM_WARPS),),
        residual_norm_shapes,
    ),
}
KNOBS = tuple(dict.fromkeys(knob for case in CASES.values() for knob in case.knobs))


@contextlib.contextmanager
def applied(knobs: Sequence[Knob], config: Config) -> Iterator[None]:
    """Within the context the module globals named in ``config`` take its values; on exit every
    global of ``knobs`` gets back the value it had, whatever happened."""
    saved = {knob: knob.current() for knob in knobs if knob.module is not None}
    try:
        for knob in saved:
            if knob.name in config:
                setattr(knob.module, knob.attribute, config[knob.name])
        yield
    finally:
        for knob, value in saved.items():
            setattr(knob.module, knob.attribute, value)


def config_key(config: Config) -> tuple:
    return tuple(sorted(config.items()))


def config_text(config: Config) -> str:
    """``BLOCK_R_GPU=64 WARPS_GPU=4``: the globals without their module."""
    return " ".join(f"{name.rsplit('.', 1)[-1]}={value}" for name, value in config.items())


# --- timing, and compiling ahead in worker processes --------------------------------------------


def launch_targets(s: Settings) -> contextlib.AbstractContextManager:
    """--dry: launches on CPU tensors configured as for an H100, so that the swept globals reach
    them (the interpreter's own configuration ignores them)."""
    return launches_for(H100.target) if s.dry else contextlib.nullcontext()


def measure(run: Run, config: Config, knobs: Sequence[Knob], s: Settings) -> dict:
    """The seconds of the first call under ``config`` and the median milliseconds of the timed
    ones, or the error that stopped it."""
    result: dict[str, Any] = {"ms": None, "first_s": None, "error": None}
    call = functools.partial(run, config)
    try:
        with applied(knobs, config):
            result["first_s"] = round(run_once(call, s.device), 3)
            for _ in range(s.warmup - 1):
                run_once(call, s.device)
            samples = [run_once(call, s.device) for _ in range(s.repeats)]
        result["ms"] = round(1e3 * statistics.median(samples), 4)
    except Exception as error:  # reported in the row (a build the GPU rejects); the sweep goes on
        result["error"] = describe(error)
        release(s.device)
    return result


# in a worker process: the step it last built, by (case, shape index, precision)
_worker_run: dict[tuple[str, int, str], Run] = {}


def compile_in_worker(name: str, index: int, precision: str, config: Config, s: Settings) -> None:
    """In a worker process: one call of the step under ``config``, which compiles its kernels
    into Triton's on-disk cache. An error is left to the timed run, which meets it again."""
    key = (name, index, precision)
    if key not in _worker_run:
        _worker_run.clear()
        release(s.device)
        _worker_run[key] = CASES[name].shapes(s)[index].build(precision)
    with contextlib.suppress(Exception), launch_targets(s), applied(CASES[name].knobs, config):
        _worker_run[key](config)
        synchronize(s.device)


class Compiler:
    """``jobs`` worker processes that run configurations once before they are timed; none with
    ``jobs`` 0. A pool that breaks (a worker died) is dropped, and the first calls compile."""

    def __init__(self, jobs: int) -> None:
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.running = False  # whether the last stage left configurations compiling
        if jobs > 0:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                jobs, mp_context=multiprocessing.get_context("spawn")
            )

    def ahead(
        self, name: str, index: int, precision: str, configs: list[Config], s: Settings,
        deadline: float,
    ) -> None:  # fmt: skip
        """Run ``configs`` of one shape and precision in the workers, in parallel, until they
        are done or ``deadline`` has passed."""
        if self.pool is None or len(configs) < 2:
            return
        try:
            futures = [
                self.pool.submit(compile_in_worker, name, index, precision, config, s)
                for config in configs
            ]
        except concurrent.futures.BrokenExecutor as error:
            progress(f"compile workers stopped ({describe(error)}); compiling in turn")
            self.close()
            return
        _, pending = concurrent.futures.wait(futures, timeout=max(0.0, deadline - time.monotonic()))
        for future in pending:
            future.cancel()
        self.running = any(future.running() for future in pending)

    def close(self) -> None:
        """Shut the workers down; at the deadline, stop those still compiling rather than wait
        for them."""
        if self.pool is None:
            return
        if self.running:
            # ProcessPoolExecutor offers no way to stop a running task before Python 3.14
            for process in list(self.pool._processes.values()):
                process.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool = None


# --- the sweep ----------------------------------------------------------------------------------


def time_configs(
    name: str, shape: Shape, precision: str, stage: int, configs: list[Config], default: Config,
    s: Settings, deadline: float,
) -> tuple[list[dict], bool]:  # fmt: skip
    """A row per configuration of one stage, shape and precision, each printed as it is timed;
    and whether the deadline stopped them."""
    if not configs:
        return [], False
    progress(f"{name}: {shape.label}, {precision}, stage {stage}")
    row_of = {"case": name, "shape": shape.label, "precision": precision, "stage": stage}
    run: Run | None = None
    failed = {"ms": None, "first_s": None, "error": None}
    try:
        run = shape.build(precision)
    except Exception as error:  # the inputs do not fit, say; reported for each configuration
        release(s.device)
        failed["error"] = describe(error)
    rows = []
    for config in configs:
        if time.monotonic() >= deadline:
            return rows, True
        result = failed if run is None else measure(run, config, CASES[name].knobs, s)
        rows.append({**row_of, "config": config, "default": config == default, **result})
        print(json.dumps(rows[-1]), flush=True)
    del run
    release(s.device)
    return rows, False


def sweep_case(
    name: str, s: Settings, compiler: Compiler, deadline: float
) -> tuple[list[dict], str | None]:
    """Every configuration of a case's stages for each of its shapes and precisions in turn: the
    rows, and the "shape/precision" whose sweep the deadline cut (None: the case finished).

    The default configuration is timed in the first stage; a later stage starts from the best
    configuration so far, and a configuration already timed is not timed again."""
    case = CASES[name]
    default = {knob.name: knob.current() for knob in case.knobs}
    rows: list[dict] = []
    for index, shape in enumerate(case.shapes(s)):
        for precision in s.precisions:
            timed: dict[tuple, dict] = {}
            best = default
            for number, stage in enumerate(case.stages):
                configs = ([default] if number == 0 else []) + stage(best, s)
                unique = {config_key(config): config for config in configs}
                todo = [config for key, config in unique.items() if key not in timed]
                compiler.ahead(name, index, precision, todo, s, deadline)
                stage_rows, stopped = time_configs(
                    name, shape, precision, number, todo, default, s, deadline
                )
                rows += stage_rows
                if stopped:
                    return rows, f"{shape.label}/{precision}"
                timed.update((config_key(row["config"]), row) for row in stage_rows)
                ok = [row for row in timed.values() if row["ms"] is not None]
                if ok:
                    best = min(ok, key=lambda row: row["ms"])["config"]
    return rows, None


def summarise(rows: list[dict], cut: dict[str, str]) -> list[dict]:
    """Per case, shape and precision: the default's time, the best configuration and its time,
    the speed-up (default / best), and whether its sweep finished (``cut``: {case:
    "shape/precision" whose sweep the deadline cut})."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["case"], row["shape"], row["precision"]), []).append(row)
    summary = []
    for (name, shape, precision), group in groups.items():
        timed = [row for row in group if row["ms"] is not None]
        default = next((row["ms"] for row in group if row["default"]), None)
        best = min(timed, key=lambda row: row["ms"]) if timed else None
        best_ms = best["ms"] if best else None
        summary.append(
            {
                "case": name, "shape": shape, "precision": precision, "default_ms": default,
                "best_config": best["config"] if best else None, "best_ms": best_ms,
                "best_is_default": bool(best and best["default"]),
                "speedup": ratio(default, best_ms),
                "best_over_default": ratio(best_ms, default),
                "configs": len(group), "errors": sum(row["error"] is not None for row in group),
                "complete": cut.get(name) != f"{shape}/{precision}",
            }
        )  # fmt: skip
    return summary


def winners(summary: list[dict]) -> dict[str, dict[str, Config]]:
    """{case: {"shape/precision": the best configuration}}, of the sweeps that finished."""
    table: dict[str, dict[str, Config]] = {}
    for row in summary:
        if row["best_config"] is not None and row["complete"]:
            table.setdefault(row["case"], {})[f"{row['shape']}/{row['precision']}"] = row[
                "best_config"
            ]
    return table


def markdown(summary: list[dict], s: Settings, cut: dict[str, str], skipped: list[str]) -> str:
    """A table per case: shape, precision, default ms, best configuration, best ms, speed-up."""
    kind = "dry run (interpreter)" if s.dry else f"median of {s.repeats}"
    lines = []
    for name in dict.fromkeys(row["case"] for row in summary):
        lines += [
            f"### {name}: {CASES[name].title}; {kind}",
            "",
            "| shape | precision | default ms | best config | best ms | speed-up | configs "
            "(errors) |",
            "|---|---|--:|---|--:|--:|--:|",
        ]
        for row in (r for r in summary if r["case"] == name):
            best = config_text(row["best_config"]) if row["best_config"] else "none ran"
            if row["best_is_default"]:
                best += " (default)"
            speedup = fmt_ratio(row["speedup"])
            lines.append(
                f"| {row['shape']} | {row['precision']} | {cell(row['default_ms'], '.4f')} "
                f"| {best} | {cell(row['best_ms'], '.4f')} | {speedup} "
                f"| {row['configs']} ({row['errors']}){'' if row['complete'] else ', cut'} |"
            )
        lines.append("")
    for name, unfinished in cut.items():
        lines.append(
            f"Cut by the time budget ({s.budget:g} s): {name}, in {unfinished} (no winner)."
        )
    if skipped:
        lines.append(f"Skipped (no time left): {', '.join(skipped)}.")
    return "\n".join(lines).rstrip() + "\n"


def environment(s: Settings) -> dict:
    import triton

    cuda = s.device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(s.device) if cuda else cpu_name(),
        "launches": "interpreter, as for an H100" if s.dry else "gpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {
            key: str(value) if key == "device" else value for key, value in vars(s).items()
        },
    }


def sweep(s: Settings) -> dict:
    """Every case of ``s.cases`` in order until the budget is spent: the rows, the summary, the
    winners and which cases finished, were cut or skipped."""
    start = time.monotonic()
    deadline = start + s.budget
    rows: list[dict] = []
    finished: list[str] = []
    cut: dict[str, str] = {}
    compiler = Compiler(s.compile_jobs)
    try:
        with launch_targets(s):
            for name in s.cases:
                if time.monotonic() >= deadline:
                    break
                case_rows, unfinished = sweep_case(name, s, compiler, deadline)
                rows += case_rows
                if unfinished is not None:
                    cut[name] = unfinished
                    break
                finished.append(name)
    finally:
        compiler.close()
    skipped = [name for name in s.cases if name not in finished and name not in cut]
    summary = summarise(rows, cut)
    return {
        "environment": environment(s),
        "seconds": round(time.monotonic() - start, 1),
        "rows": rows,
        "summary": summary,
        "winners": winners(summary),
        "finished": finished,
        "cut": cut,
        "skipped": skipped,
    }


def parse_settings(argv: Sequence[str] | None = None) -> tuple[Settings, str | None, str | None]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry",
        action="store_true",
        help="CPU, Triton's interpreter, tiny shapes: checks the plumbing",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=tuple(CASES),
        default=list(CASES),
        help="cases to run, in this order (default: all)",
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=PRECISIONS,
        default=list(PRECISIONS),
        help="bf16 autocast, and fp32 (default: both, in this order)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=120.0,
        help="seconds for the whole sweep; it stops between configurations (default 120)",
    )
    for flag, text in (
        ("--repeats", "timed calls per configuration"),
        ("--warmup", "untimed calls per configuration, the first (compiling) one included"),
        ("--tokens", "GLT tokens per call, below 512 or a multiple of it"),
        ("--vision-batch", "images per call"),
        ("--image-size", "image height and width the vision shapes are taken at"),
        ("--compile-jobs", "worker processes compiling the configurations ahead, 0 for none"),
    ):
        key = flag.removeprefix("--").replace("-", "_")
        parser.add_argument(
            flag, type=int,
            help=f"{text} (cuda {DEFAULTS['cuda'][key]}, dry {DEFAULTS['dry'][key]})",
        )  # fmt: skip
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--md", metavar="PATH", help="also write the Markdown tables to PATH")
    args = parser.parse_args(argv)

    if args.dry:
        if os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--dry needs TRITON_INTERPRET=1 before the kernels are imported")
        device, defaults = torch.device("cpu"), DEFAULTS["dry"]
    else:
        if not torch.cuda.is_available():
            parser.error("the sweep needs a CUDA device; --dry checks it on the CPU")
        device, defaults = torch.device("cuda"), DEFAULTS["cuda"]

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return defaults[name] if value is None else value

    settings = Settings(
        device=device,
        dry=args.dry,
        cases=tuple(dict.fromkeys(args.cases)),
        precisions=tuple(dict.fromkeys(args.precisions)),
        budget=args.budget,
        repeats=pick("repeats"),
        warmup=max(1, pick("warmup")),
        tokens=pick("tokens"),
        vision_batch=pick("vision_batch"),
        image_size=pick("image_size"),
        lm_batch=defaults["lm_batch"],
        lm_len=defaults["lm_len"],
        compile_jobs=pick("compile_jobs"),
    )
    if settings.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {settings.repeats}")
    if settings.tokens < 1 or settings.tokens % min(settings.tokens, SEQ):
        parser.error(f"--tokens must be below {SEQ} or a multiple of it, got {settings.tokens}")
    if settings.compile_jobs < 0:
        parser.error(f"--compile-jobs must be >= 0, got {settings.compile_jobs}")
    return settings, args.json, args.md


def main(argv: Sequence[str] | None = None) -> int:
    s, json_path, md_path = parse_settings(argv)
    if s.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # as the vision benchmarks run
    result = sweep(s)
    text = markdown(result["summary"], s, result["cut"], result["skipped"])
    print()
    print(text, end="")
    print(f"{result['seconds']} s; finished: {', '.join(result['finished']) or 'none'}")
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1) + "\n")
    if md_path:
        Path(md_path).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
