"""Kernel launches of one training step, per path, counted on the CPU.

The text systems' training steps are launch-bound on a GPU (docs/gpu.md: DeLighT MT at IWSLT
sizes ran 6,444 kernels in 331 ms of wall time against 54.5 ms of GPU time), so a step's launch
count is a speed figure in its own right, and one that needs no GPU: every ATen operator that
computes (views, ``empty`` and other allocations excluded) is one launch or more on CUDA, and every
Triton kernel is one. This script counts both for a forward and backward of each entry, once on
the PyTorch paths (``impl="reference"``) and once on the Triton kernels (``impl="triton"``, whose
launches are recorded in Triton's interpreter with an H100's configuration and not run:
``benchmarks/cross_compile.py``), side by side. The optimiser step is left out (fused: a few
multi-tensor launches either way).

Dropout and fused attention are counted as CUDA runs them: ``F.dropout`` there is
``native_dropout``, one fused kernel each way, where the CPU's composes ``bernoulli_``, ``div_`` and
``mul``; ``F.scaled_dot_product_attention`` there is one memory-efficient attention kernel each way
(float mask and dropout included), where the CPU's math path runs the products, softmax and
dropout one by one (the count maps both; the mask's preparation is counted as it runs).

``--dtype bfloat16`` counts a step under autocast as CUDA's autocast casts: the CPU's casts the
products' operands as CUDA's does, but runs ``layer_norm``, ``softmax``, ``sum`` and the other
operators of CUDA's float32 list in the input's 16-bit dtype, so the count casts their 16-bit
inputs to float32 first, as CUDA does (each a ``_to_copy``, with one back at the next product).

cuDNN's LSTM (the AWD-LSTM baseline) is counted as cuDNN's standard algorithm launches it, not as
the CPU's per-step decomposition: per layer and call, forward one input product over all steps and,
each step, a recurrent product and a point-wise kernel (1 + 2T); backward, each step a point-wise
kernel and a recurrent product, one input-gradient product and the two weight-gradient products
(2T + 3). cuDNN's persistent algorithms, which it may pick for small batches, launch fewer.

Entries (``--only``): ``dextra`` (one DExTra unit of DeLighT MT's d_m 320 decoder, N = 8, over
``--tokens`` tokens), ``delight_mt`` (the 14.0 M IWSLT model, ``--tokens`` source and target
tokens in sentences of 32) and, as its yardstick, ``transformer_mt`` (the fairseq-size IWSLT
Transformer, which has no kernels of ours); ``gt4``, ``gt2`` (Group-Transformer, Table 2's 9
layers of 256, G = 4 and 2, segments of 16 with a memory of 16) and ``txl`` (Transformer-XL of the
same size); ``awd_pru`` (AWD-PRU g = 4, M = 1400) and ``awd_lstm`` (AWD-LSTM, cuDNN), windows of
``--bptt`` steps, batch 2. After the per-path table, the pairs: each system's launches on its
kernels against its baseline's, with the target (``TARGETS``).

    TRITON_INTERPRET=1 python benchmarks/launches.py [--tokens 256] [--only NAME ...]
        [--dtype float32|bfloat16] [--json PATH]

It prints a table, then one JSON line per entry and path (``aten``, ``triton``, ``launches``, the
ratio to the PyTorch path, the ATen operators counted most and every operator's count).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import (
    LM_LAYERS,
    LM_WIDTH,
    VOCAB,
    enwik8_lm,
    enwik8_loss,
    from_config,
)
from src.ops.dextra import DExTra, dextra_max_groups

NAMES = ("dextra", "delight_mt", "transformer_mt", "gt4", "gt2", "txl", "awd_pru", "awd_lstm")
# system -> (baseline, the most launches it may take per baseline launch, on its kernels)
TARGETS = {
    "delight_mt": ("transformer_mt", 1.2),
    "gt4": ("txl", 1.0),
    "gt2": ("txl", 1.0),
    "awd_pru": ("awd_lstm", 1.0),
}
PATHS = ("reference", "triton")
# no kernel on CUDA: views, aliases and allocations
NO_LAUNCH = frozenset(
    """view _unsafe_view reshape _reshape_alias t transpose permute expand as_strided unsqueeze
    squeeze select slice split split_with_sizes chunk unbind alias detach narrow unflatten flatten
    view_as expand_as lift_fresh empty empty_like new_empty empty_strided new_empty_strided
    _local_scalar_dense""".split()
)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# what CUDA's autocast runs in float32 and the CPU's in the input's dtype (those a step calls)
CUDA_FLOAT32 = frozenset(
    """layer_norm group_norm softmax log_softmax cross_entropy nll_loss sum cumsum exp log pow
    rsqrt reciprocal norm normalize softplus prod mse_loss""".split()
)


class LaunchCounter(TorchDispatchMode):
    """Counts the ATen operators that compute, by name; none while ``paused``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        # a fused dropout's seed: one number drawn from the host's generator, no launch on a GPU
        seed = name in ("randint", "random_") and isinstance(out, Tensor) and out.dim() == 0
        if name not in NO_LAUNCH and not seed and not self.paused:
            self.counts[name] += 1
        return out


class CudaAutocastFloat32(TorchFunctionMode):
    """Under the CPU's autocast, runs the operators of CUDA's float32 list in float32, as CUDA's
    autocast does: their 16-bit floating inputs are cast first."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in CUDA_FLOAT32 and torch.is_autocast_enabled("cpu"):

            def widen(a: object) -> object:
                if isinstance(a, Tensor) and a.dtype in (torch.bfloat16, torch.float16):
                    return a.float()
                return a

            args = tuple(widen(a) for a in args)
            kwargs = {k: widen(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def _fused_attention(counter: LaunchCounter) -> Callable[..., Tensor]:
    """``F.scaled_dot_product_attention`` counted as CUDA's fused kernel: one launch forward, one
    backward, whatever the CPU's math path runs."""
    real = F.scaled_dot_product_attention

    def attend(
        q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, **kwargs: object
    ) -> Tensor:
        return real(q, k, v, attn_mask=mask, **kwargs)

    class FusedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, kwargs: dict, *tensors: Tensor) -> Tensor:  # type: ignore[override]
            counter.paused = True
            try:
                leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
                with torch.enable_grad():
                    out = attend(*leaves, **kwargs)
            finally:
                counter.paused = False
            counter.counts["fused_attention"] += 1
            ctx.graph = (out, leaves)
            return out.detach()

        @staticmethod
        def backward(ctx, grad: Tensor):  # type: ignore[override]
            out, leaves = ctx.graph
            wanted = [t for t in leaves if t.requires_grad]
            counter.paused = True
            try:
                grads = iter(torch.autograd.grad(out, wanted, grad) if wanted else ())
            finally:
                counter.paused = False
            counter.counts["fused_attention_backward"] += 1
            return (None, *(next(grads) if t.requires_grad else None for t in leaves))

    def attention(
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        **kwargs: object,
    ) -> Tensor:
        kwargs.update(dropout_p=dropout_p, is_causal=is_causal)
        mask = () if attn_mask is None else (attn_mask,)
        return FusedAttention.apply(kwargs, query, key, value, *mask)

    return attention


def _cudnn_lstm(counter: LaunchCounter) -> object:
    """A stand-in for ``torch.nn.modules.rnn._VF`` whose ``lstm`` runs the real one unseen by the
    counter and counts cuDNN's standard algorithm's launches instead (module docstring)."""
    import torch.nn.modules.rnn as rnn

    real = rnn._VF

    class CudnnLSTM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, args: tuple, steps: int, layers: int, *tensors: Tensor):  # type: ignore[override]
            counter.paused = True
            try:
                leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
                with torch.enable_grad():
                    out = real.lstm(*args(leaves))
            finally:
                counter.paused = False
            counter.counts["cudnn_lstm"] += layers * (1 + 2 * steps)
            ctx.graph, ctx.steps, ctx.layers = (out, leaves), steps, layers
            return tuple(o.detach() for o in out)

        @staticmethod
        def backward(ctx, *grads: Tensor):  # type: ignore[override]
            out, leaves = ctx.graph
            wanted = [t for t in leaves if t.requires_grad]
            pairs = [(o, g) for o, g in zip(out, grads, strict=True) if g is not None]
            counter.paused = True
            try:
                found = torch.autograd.grad([o for o, _ in pairs], wanted,
                                            [g for _, g in pairs], allow_unused=True)  # fmt: skip
            finally:
                counter.paused = False
            counter.counts["cudnn_lstm_backward"] += ctx.layers * (2 * ctx.steps + 3)
            found = iter(found)
            return (None, None, None, *(next(found) if t.requires_grad else None for t in leaves))

    class VF:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        @staticmethod
        def lstm(input: Tensor, hx: Sequence[Tensor], weights: Sequence[Tensor], *flags: object):
            # the (input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
            # batch_first) overload nn.LSTM calls
            has_biases, layers, *_, batch_first = flags
            steps = input.shape[1 if batch_first else 0]
            n_hx = len(hx)

            def args(leaves: list[Tensor]) -> tuple:
                return (leaves[0], leaves[1 : 1 + n_hx], leaves[1 + n_hx :], *flags)

            return CudnnLSTM.apply(args, steps, layers, input, *hx, *weights)

    return VF()


def entry(
    name: str, tokens: int, bptt: int = 70
) -> tuple[nn.Module, Callable[[nn.Module], Tensor]]:
    """The network and its loss (a scalar) for one forward."""
    generator = torch.Generator().manual_seed(0)
    if name == "dextra":
        d_m = 320
        net: nn.Module = DExTra(d_m, d_m // 2, d_m, width_multiplier=2.0, depth=8,
                                max_groups=dextra_max_groups(d_m), dropout=0.08)  # fmt: skip
        x = torch.randn(tokens, d_m, generator=generator)
        return net, lambda net: net(x).square().mean()
    if name in ("gt4", "gt2", "txl"):
        return _charlm_entry(name, generator)
    if name in ("awd_pru", "awd_lstm"):
        return _awd_entry(name, bptt, generator)
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


def _charlm_entry(
    name: str, generator: torch.Generator
) -> tuple[nn.Module, Callable[[nn.Module], Tensor]]:
    # Table 2's size (enwik8, 9 layers of 256, 8 heads); the count does not depend on the length
    length = 16
    net = enwik8_lm(None if name == "txl" else int(name[2:]), length, dropout=0.1)
    tokens = torch.randint(VOCAB, (2, length + 1), generator=generator)
    memories = [torch.randn(2, length, LM_WIDTH, generator=generator) for _ in range(LM_LAYERS + 1)]
    return net, lambda net: enwik8_loss(net, tokens, memories)


def _awd_entry(
    name: str, bptt: int, generator: torch.Generator
) -> tuple[nn.Module, Callable[[nn.Module], Tensor]]:
    experiment = {"awd_pru": "pru_lm/table4_1_awd_pru_g4_m1400",
                  "awd_lstm": "pru_lm/table4_1_awd_lstm"}  # fmt: skip
    net = from_config(f"experiment={experiment[name]}")
    vocab = 10000  # PTB
    tokens = torch.randint(vocab, (2, bptt + 1), generator=generator)

    def loss(net: nn.Module) -> Tensor:
        logits = net(tokens[:, :-1]).logits  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    return net, loss


def _native_dropout(
    x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    # what F.dropout runs on CUDA (one kernel forward, one backward), on any device
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


def count(name: str, path: str, tokens: int, dtype: str = "float32", bptt: int = 70) -> dict:
    """One forward and backward of ``name`` on ``path`` (under autocast to ``dtype`` unless
    float32): its ATen and Triton launches."""
    from benchmarks.cross_compile import H100, recorded_launches

    torch.manual_seed(0)
    net, loss = entry(name, tokens, bptt)
    for module in net.modules():
        if hasattr(module, "impl"):
            module.impl = path
    net.train()
    counter = LaunchCounter()
    autocast = dtype != "float32"
    with (
        recorded_launches(H100) as launches,
        mock.patch.object(F, "dropout", _native_dropout),
        mock.patch.object(F, "scaled_dot_product_attention", _fused_attention(counter)),
        mock.patch("torch.nn.modules.rnn._VF", _cudnn_lstm(counter)),
        counter,
    ):
        with torch.autocast("cpu", DTYPES[dtype], enabled=autocast), CudaAutocastFloat32():
            value = loss(net)
        value.backward()
    aten = sum(counter.counts.values())
    return {
        "entry": name, "path": path, "dtype": dtype,
        "tokens": 2 * bptt if name.startswith("awd") else tokens, "aten": aten,
        "triton": len(launches),
        "launches": aten + len(launches), "top_aten": dict(counter.counts.most_common(12)),
        "ops": dict(sorted(counter.counts.items())),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens of a batch (per side)")
    parser.add_argument("--only", nargs="+", choices=NAMES, help="these entries only")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                        help="bfloat16: under autocast, cast as CUDA's autocast casts")  # fmt: skip
    parser.add_argument("--bptt", type=int, default=70, help="AWD windows: time steps")
    parser.add_argument("--json", type=Path, help="also write the rows (JSON lines) here")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("set TRITON_INTERPRET=1: the Triton launches are recorded in its interpreter")
    rows = []
    for name in args.only or NAMES:
        first = None
        for path in PATHS:
            row = count(name, path, args.tokens, args.dtype, args.bptt)
            first = first or row
            row["ratio"] = round(row["launches"] / first["launches"], 3)
            rows.append(row)
    print(f"{'entry':16s} {'path':10s} {'ATen':>7s} {'Triton':>7s} {'launches':>9s} {'ratio':>6s}")
    for row in rows:
        print(f"{row['entry']:16s} {row['path']:10s} {row['aten']:7d} {row['triton']:7d} "
              f"{row['launches']:9d} {row['ratio']:6.3f}")  # fmt: skip
    pairs = pair_rows(rows)
    if pairs:
        print(f"\n{'system':16s} {'baseline':16s} {'launches':>9s} {'baseline':>9s} {'ratio':>6s} "
              f"{'target':>7s}")  # fmt: skip
        for pair in pairs:
            print(
                f"{pair['entry']:16s} {pair['baseline']:16s} {pair['launches']:9d} "
                f"{pair['baseline_launches']:9d} {pair['ratio']:6.3f} "
                f"{'<= ' + str(pair['target']):>7s} {'met' if pair['met'] else 'NOT MET'}"
            )
    for row in rows + pairs:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "a") as file:
            for row in rows + pairs:
                file.write(json.dumps(row) + "\n")
    return rows


def pair_rows(rows: list[dict]) -> list[dict]:
    """Each system counted beside its baseline (both on their kernels, ``impl="triton"``): the
    ratio of launches and whether it meets :data:`TARGETS`."""
    on_kernels = {row["entry"]: row for row in rows if row["path"] == "triton"}
    pairs = []
    for name, (base, target) in TARGETS.items():
        if name in on_kernels and base in on_kernels:
            ours, theirs = on_kernels[name]["launches"], on_kernels[base]["launches"]
            ratio = round(ours / theirs, 3)
            pairs.append({"entry": name, "baseline": base, "dtype": on_kernels[name]["dtype"],
                          "launches": ours, "baseline_launches": theirs, "ratio": ratio,
                          "target": target, "met": ratio <= target})  # fmt: skip
    return pairs


if __name__ == "__main__":
    main()
