"""Training throughput and inference latency of the Group-Transformer paper's Table 2 models.

Builds Transformer-XL (9, 256, 8) and the 2- and 4-group Group-Transformers at the paper's sizes
(enwik8 vocabulary, tgt_len = mem_len = 512) and, in one process, interleaved round-robin, times
(a) a training step (forward with a full memory, backward, Adam) on ``--batch`` sub-streams of 512
characters, reported as tokens/second, and (b) inference of one 512-character segment with a
512-state memory (batch 1, no grad), in milliseconds. Medians of ``--repeats`` runs. Prints a table
with the paper's FLOPs and the measured MACs, the speed ratios to Transformer-XL next to the MAC
ratios, then one JSON line per model.

    python benchmarks/charlm.py [--threads 2] [--repeats 7] [--batch 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from benchmarks.common import print_json_lines
from src.models.group_transformer import GroupTransformer
from src.models.transformer_xl import TransformerXL
from src.utils.complexity import measure

SEGMENT = 512
VOCAB = 204  # enwik8


def models() -> dict[str, nn.Module]:
    size = {
        "n_token": VOCAB,
        "n_layer": 9,
        "d_model": 256,
        "n_head": 8,
        "d_inner": 1024,
        "mem_len": SEGMENT,
    }
    return {
        "transformer_xl(9,256,8)": TransformerXL(**size, dropout=0.0),
        "group_transformer(G=2)": GroupTransformer(**size, n_group=2, tgt_len=SEGMENT, dropout=0.0),
        "group_transformer(G=4)": GroupTransformer(**size, n_group=4, tgt_len=SEGMENT, dropout=0.0),
    }


def memories(net: nn.Module, batch: int) -> list[torch.Tensor]:
    return [torch.zeros(batch, SEGMENT, net.d_model) for _ in range(net.n_layer + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=2, help="training sub-streams per step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    nets = models()
    tokens = torch.randint(VOCAB, (args.batch, SEGMENT + 1))
    one = torch.randint(VOCAB, (1, SEGMENT))
    optimizers = {name: torch.optim.Adam(net.parameters(), lr=2.5e-4) for name, net in nets.items()}
    train_mem = {name: memories(net, args.batch) for name, net in nets.items()}
    eval_mem = {name: memories(net, 1) for name, net in nets.items()}

    def train_step(name: str) -> float:
        net = nets[name].train()
        start = time.perf_counter()
        logits, _ = net(tokens[:, :-1], train_mem[name])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizers[name].zero_grad()
        loss.backward()
        optimizers[name].step()
        return time.perf_counter() - start

    def infer(name: str) -> float:
        net = nets[name].eval()
        start = time.perf_counter()
        with torch.no_grad():
            net(one, eval_mem[name])
        return time.perf_counter() - start

    samples: dict[str, dict[str, list[float]]] = {name: {"train": [], "infer": []} for name in nets}
    for name in nets:  # warm-up
        train_step(name)
        infer(name)
    for _ in range(args.repeats):
        for name in nets:
            samples[name]["train"].append(train_step(name))
            samples[name]["infer"].append(infer(name))

    rows = []
    for name, net in nets.items():
        macs = measure(net, one).macs
        rows.append(
            {
                "model": name,
                "params": sum(p.numel() for p in net.parameters()),
                "paper_gflops": round(net.paper_flops(SEGMENT) / 1e9, 2),
                "macs_per_segment": macs,
                "train_tokens_per_s": round(
                    args.batch * SEGMENT / statistics.median(samples[name]["train"]), 1
                ),
                "infer_ms_per_segment": round(1e3 * statistics.median(samples[name]["infer"]), 2),
            }
        )
    base = rows[0]
    for row in rows:
        row["train_speedup_vs_txl"] = round(
            row["train_tokens_per_s"] / base["train_tokens_per_s"], 3
        )
        row["infer_speedup_vs_txl"] = round(
            base["infer_ms_per_segment"] / row["infer_ms_per_segment"], 3
        )
        row["mac_ratio_txl_over_model"] = round(
            base["macs_per_segment"] / row["macs_per_segment"], 3
        )
        row["paper_flop_ratio_txl_over_model"] = round(
            base["paper_gflops"] / row["paper_gflops"], 3
        )

    print(
        f"{'model':<26}{'params':>11}{'paper GF':>10}{'GMACs':>8}"
        f"{'train tok/s':>13}{'infer ms':>10}{'train x':>9}{'infer x':>9}{'MAC x':>8}{'paper x':>9}"
    )
    for r in rows:
        print(
            f"{r['model']:<26}{r['params']:>11,}{r['paper_gflops']:>10.2f}"
            f"{r['macs_per_segment'] / 1e9:>8.2f}{r['train_tokens_per_s']:>13.1f}"
            f"{r['infer_ms_per_segment']:>10.2f}{r['train_speedup_vs_txl']:>9.2f}"
            f"{r['infer_speedup_vs_txl']:>9.2f}{r['mac_ratio_txl_over_model']:>8.2f}"
            f"{r['paper_flop_ratio_txl_over_model']:>9.2f}"
        )
    print_json_lines(rows)


if __name__ == "__main__":
    main()
