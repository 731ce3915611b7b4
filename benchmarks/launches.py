"""Kernel launches of one training step, per path, counted on the CPU.

The text systems' training steps are launch-bound on a GPU (docs/gpu.md: DeLighT MT at IWSLT
sizes ran 6,444 kernels in 331 ms of wall time against 54.5 ms of GPU time), so a step's launch
count is a speed figure in its own right, and one that needs no GPU: every ATen operator that
computes (views, ``empty`` and other allocations excluded) is one launch or more on CUDA, and every
Triton kernel is one. This script counts both for a forward and backward of each entry, once on
the PyTorch paths (``impl="reference"``) and once on the Triton kernels (``impl="triton"``, whose
launches are recorded in Triton's interpreter with an H100's configuration and not run:
``src/ops/triton/cross_compile.py``), side by side. The optimiser step is left out (fused: a few
multi-tensor launches either way).

Dropout is counted as CUDA runs it: ``F.dropout`` there is ``native_dropout``, one fused kernel
each way, where the CPU's composes ``bernoulli_``, ``div_`` and ``mul`` (the count maps it). The
counts are float32's. Under CUDA autocast the PyTorch path adds casts that the CPU's autocast
does not make (CUDA's ``layer_norm`` runs in float32: a cast of its 16-bit input and, at the next
GLT, one back, each with its backward), so on the GPU the paths differ by more than here.

Entries (``--only``): ``dextra`` (one DExTra unit of DeLighT MT's d_m 320 decoder, N = 8, over
``--tokens`` tokens), ``delight_mt`` (the 14.0 M IWSLT model, ``--tokens`` source and target
tokens in sentences of 32) and, as the yardstick, ``transformer_mt`` (the fairseq-size IWSLT
Transformer, which has no kernels of ours).

    TRITON_INTERPRET=1 python benchmarks/launches.py [--tokens 256] [--only NAME ...] [--json PATH]

It prints a table, then one JSON line per entry and path (``aten``, ``triton``, ``launches``, the
ratio to the PyTorch path, and the ATen operators counted most).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.gpu_profile import from_config  # noqa: E402
from src.ops.dextra import DExTra, dextra_max_groups  # noqa: E402

NAMES = ("dextra", "delight_mt", "transformer_mt")
PATHS = ("reference", "triton")
# no kernel on CUDA: views, aliases and allocations
NO_LAUNCH = frozenset(
    """view _unsafe_view reshape _reshape_alias t transpose permute expand as_strided unsqueeze
    squeeze select slice split split_with_sizes chunk unbind alias detach narrow unflatten flatten
    view_as expand_as lift_fresh empty empty_like new_empty empty_strided new_empty_strided
    _local_scalar_dense""".split()
)


class LaunchCounter(TorchDispatchMode):
    """Counts the ATen operators that compute, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        # a fused dropout's seed: one number drawn from the host's generator, no launch on a GPU
        seed = name in ("randint", "random_") and isinstance(out, Tensor) and out.dim() == 0
        if name not in NO_LAUNCH and not seed:
            self.counts[name] += 1
        return out


def entry(name: str, tokens: int) -> tuple[nn.Module, Callable[[nn.Module], Tensor]]:
    """The network and its loss (a scalar) for one forward."""
    generator = torch.Generator().manual_seed(0)
    if name == "dextra":
        d_m = 320
        net: nn.Module = DExTra(d_m, d_m // 2, d_m, width_multiplier=2.0, depth=8,
                                max_groups=dextra_max_groups(d_m), dropout=0.08)  # fmt: skip
        x = torch.randn(tokens, d_m, generator=generator)
        return net, lambda net: net(x).square().mean()
    if name == "delight_mt":
        net = from_config("experiment=delight_mt/iwslt_d384", "model.d_model=320")
    else:
        net = from_config("data=iwslt14_de_en", "model=transformer_mt")
    length = 32
    sentences = max(1, tokens // length)
    src = torch.randint(4, 8848, (sentences, length), generator=generator)
    tgt = torch.randint(4, 6632, (sentences, length + 1), generator=generator)

    def loss(net: nn.Module) -> Tensor:
        logits = net(src, None, tgt[:, :-1])  # (B, T, V_tgt)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))

    return net, loss


def _native_dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    # what F.dropout runs on CUDA (one kernel forward, one backward), on any device
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


def count(name: str, path: str, tokens: int) -> dict:
    """One forward and backward of ``name`` on ``path``: its ATen and Triton launches."""
    from src.ops.triton.cross_compile import H100, recorded_launches

    torch.manual_seed(0)
    net, loss = entry(name, tokens)
    for module in net.modules():
        if hasattr(module, "impl"):
            module.impl = path
    net.train()
    counter = LaunchCounter()
    with (
        recorded_launches(H100) as launches,
        mock.patch.object(F, "dropout", _native_dropout),
        counter,
    ):
        loss(net).backward()
    aten = sum(counter.counts.values())
    return {
        "entry": name, "path": path, "tokens": tokens, "aten": aten, "triton": len(launches),
        "launches": aten + len(launches), "top_aten": dict(counter.counts.most_common(12)),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens of a batch (per side)")
    parser.add_argument("--only", nargs="+", choices=NAMES, help="these entries only")
    parser.add_argument("--json", type=Path, help="also write the rows (JSON lines) here")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("set TRITON_INTERPRET=1: the Triton launches are recorded in its interpreter")
    rows = []
    for name in args.only or NAMES:
        first = None
        for path in PATHS:
            row = count(name, path, args.tokens)
            first = first or row
            row["ratio"] = round(row["launches"] / first["launches"], 3)
            rows.append(row)
    print(f"{'entry':16s} {'path':10s} {'ATen':>7s} {'Triton':>7s} {'launches':>9s} {'ratio':>6s}")
    for row in rows:
        print(f"{row['entry']:16s} {row['path']:10s} {row['aten']:7d} {row['triton']:7d} "
              f"{row['launches']:9d} {row['ratio']:6.3f}")  # fmt: skip
    for row in rows:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "a") as file:
            for row in rows:
                file.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main()
