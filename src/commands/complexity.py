"""Parameters and MACs of a network: ``python complexity.py model=... [data=...] [model.x=...]``.

Builds the network exactly as training does (the data config only supplies the input shape and
number of classes; no data is read), counts one forward pass with ``src.utils.complexity`` and
prints a table, then one JSON object as the last line. Recurrent-memory language models (a
``mem_len`` attribute) are also counted with a full memory of ``mem_len`` cached states
(``macs_with_memory``, the training/evaluation steady state), and networks that define
``paper_flops`` report their paper's own FLOP convention next to the measurement. An SSD is also
counted at its other image size (300 and 512, as the model zoo lists both), each beside the
published figures of that configuration.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from src.build import build_task
from src.models.ssd import SSD
from src.models.ssd_priors import PRIOR_STRIDES
from src.utils.complexity import count_params, measure


class WithMemory(nn.Module):
    """Calls a memory language model with fixed (zero) memories: ``net(tokens, memories)``."""

    def __init__(self, net: nn.Module, memories: list[Tensor]) -> None:
        super().__init__()
        self.net = net
        self.memories = memories

    def forward(self, tokens: Tensor) -> tuple[Tensor, list[Tensor]]:
        return self.net(tokens, self.memories)


def report(cfg: DictConfig) -> dict:
    """Count the configured network; returns the JSON-ready result."""
    datamodule, task = build_task(cfg)
    example = datamodule.example_input(cfg.batch_size)
    complexity = measure(task.net, example)
    per_sample = max(cfg.batch_size, 1)
    result = {
        **complexity.as_dict(),
        "macs": complexity.macs // per_sample,
        "macs_conv": complexity.macs_conv // per_sample,
        "macs_by_op": {op: macs // per_sample for op, macs in complexity.macs_by_op.items()},
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "data": cfg.data._target_.rsplit(".", 1)[-1],
    }
    net = task.net
    if getattr(net, "mem_len", 0) > 0:
        # n_layer + 1 cached hidden states (the embedding output and every layer's), each (B, M, D)
        memories = [
            torch.zeros(example.shape[0], net.mem_len, net.d_model) for _ in range(net.n_layer + 1)
        ]
        result["memory_len"] = net.mem_len
        result["macs_with_memory"] = measure(WithMemory(net, memories), example).macs // per_sample
    if hasattr(net, "paper_flops") and isinstance(example, Tensor):
        result["paper_flops"] = net.paper_flops(example.shape[-1])
    if hasattr(net, "paper_macs") and isinstance(example, tuple):
        # an encoder-decoder: (src_tokens, src_padding_mask, prev_output_tokens)
        result["paper_macs"] = net.paper_macs(example[0].shape[-1], example[2].shape[-1])
    if isinstance(net, SSD):
        result["ssd_sizes"] = ssd_sizes(net, counted_macs=result["macs_conv"])
    return result


def ssd_sizes(net: SSD, counted_macs: int) -> list[dict]:
    """Params and conv MACs of ``net``'s configuration at every prior layout (batch 1), each with
    its published (params, FLOPs, source) or None; ``counted_macs`` are those of ``net`` itself,
    already measured."""
    rows = []
    for size in sorted(PRIOR_STRIDES):
        model, macs = net, counted_macs
        if size != net.image_size:
            model = SSD(
                net.num_classes, backbone=net.backbone_name, scale=net.scale, image_size=size
            )
            macs = measure(model, torch.zeros(1, 3, size, size)).macs_conv
        rows.append(
            {"image_size": size, "params": count_params(model), "macs_conv": macs,
             "reported": model.reported()}
        )  # fmt: skip
    return rows


def input_shape(shape: list) -> str:
    """``[1, 3, 224, 224]`` -> ``1x3x224x224``; several inputs joined by `` + ``."""
    if shape and isinstance(shape[0], list):
        return " + ".join("x".join(map(str, s)) for s in shape)
    return "x".join(map(str, shape))


def table(result: dict) -> str:
    """A fixed-width table of the counts (MACs per sample)."""
    rows = [
        ("network", str(result["model"].get("name") or result["model"]["_target_"])),
        ("data", result["data"]),
        ("input shape", input_shape(result["input_shape"])),
        ("parameters", f"{result['params']:,} ({result['params'] / 1e6:.3f} M)"),
        ("trainable", f"{result['trainable_params']:,}"),
        ("MACs", f"{result['macs']:,} ({result['macs'] / 1e6:.2f} M)"),
        ("MACs, conv only", f"{result['macs_conv']:,} ({result['macs_conv'] / 1e6:.2f} M)"),
    ]
    rows += [(f"  MACs in {op}", f"{macs:,}") for op, macs in sorted(result["macs_by_op"].items())]
    if "macs_with_memory" in result:
        memory = result["macs_with_memory"]
        rows.append((f"MACs, {result['memory_len']} memory", f"{memory:,} ({memory / 1e6:.2f} M)"))
    if "paper_macs" in result:
        rows.append(
            (
                "MACs, official profiler",
                f"{result['paper_macs']:,} ({result['paper_macs'] / 1e9:.2f} G)",
            )
        )
    if "paper_flops" in result:
        rows.append(
            (
                "FLOPs, paper convention",
                f"{result['paper_flops']:,} ({result['paper_flops'] / 1e9:.2f} G)",
            )
        )
    for row in result.get("ssd_sizes", []):
        reported = row["reported"]
        published = "none published"
        if reported is not None:
            params = "-" if reported[0] is None else f"{reported[0]} M"
            published = f"{reported[2]}: {params}, {reported[1]} B"
        ours = f"{row['params'] / 1e6:.3f} M, {row['macs_conv'] / 1e9:.3f} B conv MACs"
        rows.append((f"SSD{row['image_size']}", f"{ours} ({published})"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
