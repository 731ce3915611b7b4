"""What the benchmark scripts share: timing a call on a device, formatting errors and ratios, the
networks they time at the papers' sizes, and the project's Hydra config."""

from __future__ import annotations

import contextlib
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn

from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.models.group_transformer import GroupTransformer
from src.models.transformer_xl import TransformerXL
from src.ops.dextra import DExTra, dextra_max_groups
from src.ops.dice import DiCE
from src.ops.group_linear import GroupLinear

ROOT = Path(__file__).resolve().parents[1]

# the papers' sizes on CUDA: ImageNet batches of 256 images of 224^2; enwik8 (Table 2) batches of
# 22 segments of 512 characters, the memory as long
VISION_BATCH, IMAGE_SIZE = 256, 224
LM_BATCH, LM_LEN = 22, 512
VOCAB, LM_LAYERS, LM_WIDTH = 204, 9, 256  # enwik8's characters; Table 2's models
D_M = 512  # the DeLighT LM's block width; the DExTra unit maps 512 -> 256
SEQ = 512  # DExTra inputs are (tokens / SEQ, SEQ, D_M)
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


# --- timing -------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(step: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call, the device synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    return time.perf_counter() - start


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """No autocast for "fp32", else ``torch.autocast`` to bf16 or fp16."""
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def forward_backward(
    fn: Callable[[], Tensor], device: torch.device, precision: str
) -> Callable[[], None]:
    """A step running ``fn`` under the precision's autocast, then backward from a ones gradient."""

    def step() -> None:
        with autocast(device, precision):
            out = fn()
        out.backward(torch.ones_like(out))

    return step


def training_step(
    loss: Callable[[], Tensor],
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    precision: str,
    *,
    graphed: bool = False,
) -> Callable[[], None]:
    """One step: ``loss()`` (a scalar) under autocast, backward, optimiser step. When ``graphed``,
    each step first tells the CUDA-graph trees that a new iteration begins, so the replay may
    reuse the last one's outputs (nothing of them is kept between steps)."""

    def step() -> None:
        if graphed:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast(device, precision):
            value = loss()
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()

    return step


# --- reporting ----------------------------------------------------------------------------------


def describe(error: BaseException) -> str:
    """``Type: first line of the message``, short enough for a table."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr, flush=True)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return round(numerator / denominator, 3)


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def cell(value: Any, spec: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and spec:
        return format(value, spec)
    return str(value)


def print_text_table(header: str, lines: Iterable[str]) -> None:
    """``header``, a rule as wide, then ``lines``."""
    print(header)
    print("-" * len(header))
    for line in lines:
        print(line)


def print_json_lines(rows: Iterable[dict]) -> None:
    for row in rows:
        print(json.dumps(row))


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo where there is one."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# --- the networks -------------------------------------------------------------------------------


def parameter_count(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def lstm_hidden_for(params: int, input_size: int) -> int:
    """The hidden size M' whose one-layer ``nn.LSTM`` (input_size -> M') has the parameter count
    nearest to ``params``: 4 M' (input_size + M') weights and 8 M' biases (M' below sqrt(params)
    / 2, the search stops past it)."""
    candidates = range(1, math.isqrt(params) + 2)
    return min(candidates, key=lambda m: abs(4 * m * (input_size + m) + 8 * m - params))


def with_impl(net: nn.Module, impl: str) -> nn.Module:
    """``net`` with every op's kernel switch (``impl``, see ``src/kernels/triton``) set to
    ``impl``."""
    for module in net.modules():
        if isinstance(getattr(module, "impl", None), str):
            module.impl = impl
    return net


def has_impl(net: nn.Module) -> bool:
    return any(isinstance(getattr(module, "impl", None), str) for module in net.modules())


def dextra_unit() -> DExTra:
    """DExTra(d_m=512, w_m=2, N=8, g_max=16), the DeLighT LM's unit."""
    return DExTra(
        D_M, D_M // 2, D_M // 2, width_multiplier=2.0, depth=8, max_groups=dextra_max_groups(D_M)
    )


def dextra_input_shape(tokens: int) -> tuple[int, int, int]:
    seq = min(tokens, SEQ)
    return tokens // seq, seq, D_M


def glt_weight_shapes() -> list[tuple[int, int, int]]:
    """The distinct (g, k, n) GLT weights of the DExTra unit, in layer order (a layer with the
    input mixer is timed as one part of width g k)."""
    shapes: list[tuple[int, int, int]] = []
    for module in dextra_unit().modules():
        if isinstance(module, GroupLinear) and tuple(module.weight.shape) not in shapes:
            shapes.append(tuple(module.weight.shape))
    return shapes


def enwik8_lm(groups: int | None, length: int, *, dropout: float = 0.0) -> nn.Module:
    """Table 2's enwik8 models (9 layers, d_model 256, 8 heads, d_inner 1024): Transformer-XL
    (``groups`` None; pre-norm, untied) or the Group-Transformer of ``groups`` groups, segments and
    memory of ``length``."""
    size: dict[str, Any] = {
        "n_token": VOCAB, "n_layer": LM_LAYERS, "d_model": LM_WIDTH, "n_head": 8, "d_inner": 1024,
        "mem_len": length, "dropout": dropout,
    }  # fmt: skip
    if groups is None:
        return TransformerXL(**size, pre_norm=True, tie_weight=False)
    return GroupTransformer(**size, n_group=groups, tgt_len=length)


def enwik8_memories(batch: int, length: int, device: torch.device) -> list[Tensor]:
    """The n_layer + 1 memories (B, M, d_model) of an enwik8 model, zeros, as after one full
    segment."""
    return [torch.zeros(batch, length, LM_WIDTH, device=device) for _ in range(LM_LAYERS + 1)]


def enwik8_loss(
    forward: Callable[..., tuple[Tensor, Any]], tokens: Tensor, memories: list[Tensor]
) -> Tensor:
    """Next-character cross-entropy of ``forward`` over ``tokens[:, :-1]`` with ``memories``."""
    logits, _ = forward(tokens[:, :-1], memories)  # (B, T, VOCAB)
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def vision_network(name: str, image_size: int) -> nn.Module:
    """DiCENet or ESPNetv2 at s=1.0, or a torchvision network by its name."""
    if name == "dicenet":
        return DiCENet(scale=1.0, input_size=image_size)
    if name == "espnetv2":
        return ESPNetv2(scale=1.0)
    return torchvision.models.get_model(name)


def dicenet_dice_shapes(image_size: int) -> list[tuple[int, int, int]]:
    """The distinct (C, H_b, W_b) of DiCENet s=1.0's DiCE units at ``image_size``."""
    shapes: list[tuple[int, int, int]] = []
    for module in DiCENet(scale=1.0, input_size=image_size).modules():
        if isinstance(module, DiCE):
            conv = module.dim_conv
            if (conv.channels, conv.height, conv.width) not in shapes:
                shapes.append((conv.channels, conv.height, conv.width))
    return shapes


# --- the project's config -----------------------------------------------------------------------


def compose(overrides: list[str]):
    """The project's Hydra config for ``overrides`` (only composed: no data is read)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("train", overrides=overrides)


def from_config(*overrides: str) -> nn.Module:
    """The network of the project's config for ``overrides``."""
    from hydra.utils import instantiate

    return instantiate(compose(list(overrides)).model)
