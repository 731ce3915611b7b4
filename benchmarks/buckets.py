"""Length buckets of the translation batches: their shapes and padding, on two length distributions.

``data.shape_buckets`` pads every translation batch to one of K shapes (B, S, T)
(:mod:`src.datamodules.length_buckets`), so that a training step replayed as a CUDA graph is
recorded K times. This prints, side by side on the same pairs, the shapes, batches per shape and
padding (pad tokens / all tokens of the padded source and target, rows without a pair included)
of the training batches as ``data.pack_pairs`` packs them (several pairs a row, in the ladder of
square cells), of a pair a row in K cells fitted to the lengths (``pack_pairs: false``), and of
fairseq's exact batching (``shape_buckets: 0``, a shape per batch). Packing lengthens the rows a
pair attends within, so it also prints the attention's work against exact batching's: the sum
over rows of S^2 + T^2 + S T (encoder, decoder and encoder-decoder scores) over the same sum for
the exact batches (the packed pairs' masked scores are computed and thrown away). Measured on:

- ``demo``: the training split of the gettext de-en corpus of ``experiment=delight_mt/demo``
  (built offline under ``--data``, SentencePiece pieces, eos included), with its ``max_tokens``
  of 1024 (training) and 4096 (evaluation, ``--eval``).
- ``iwslt``: an IWSLT'14 de-en-like training split, the real corpus not being on this machine:
  160,239 pairs whose mean lengths are the published ones of fairseq's ``prepare-iwslt14.sh`` +
  ``fairseq-preprocess`` (train.de 4,035,591 tokens, train.en 3,949,114, eos included: 25.19 and
  24.65 per sentence). The shape of the distribution is assumed, not published: target lengths
  log-normal with a coefficient of variation ``--cv`` (0.65), source = target * a log-normal
  ratio of spread ``--ratio-sd`` (0.15) around 25.19 / 24.65, both at least 2 tokens, pairs with a
  length ratio above 1.5 or a side above 250 tokens removed (the script's ``clean-corpus-n.perl``
  1.5 / 175 words, BPE adding tokens). ``max_tokens`` 4096, IWSLT's.

The tables also list the padding of a pair a row at 4, 8, 12 and 16 buckets and, for ``iwslt``,
how both paddings move with the assumed spreads. Nothing runs on a GPU.

    python benchmarks/buckets.py [--buckets 8] [--data DIR] [--eval] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import numpy as np

from src.datamodules.length_buckets import (
    bucket_batches,
    choose_cells,
    format_table,
    packed_batches,
    packing_cells,
    padding_table,
)
from src.datamodules.translation import GettextTranslationDataModule, batch_by_tokens

IWSLT_PAIRS = 160_239
IWSLT_MEANS = (4_035_591 / IWSLT_PAIRS, 3_949_114 / IWSLT_PAIRS)  # de, en tokens per sentence


def demo_lengths(root: Path) -> tuple[list[int], list[int]]:
    """Source and target lengths of the demo corpus's training pairs (data=gettext_de_en)."""
    dm = GettextTranslationDataModule(
        str(root),
        sentencepiece_vocab_size=2000,
        src_vocab_size=2000,
        tgt_vocab_size=2000,
        max_source_positions=256,
        max_target_positions=256,
    )
    dm.setup()
    train = dm.splits["train"]
    return [len(s) for s in train.source], [len(t) for t in train.target]


def iwslt_lengths(
    cv: float = 0.65, ratio_sd: float = 0.15, seed: int = 0
) -> tuple[list[int], list[int]]:
    """An IWSLT'14 de-en-like training split's source and target lengths (module docstring)."""
    rng = np.random.default_rng(seed)
    sigma = np.sqrt(np.log1p(cv**2))
    # log-normal with the published mean: E = exp(mu + sigma^2 / 2)
    target = rng.lognormal(np.log(IWSLT_MEANS[1]) - sigma**2 / 2, sigma, IWSLT_PAIRS)
    mean_ratio = IWSLT_MEANS[0] / IWSLT_MEANS[1]
    ratio = rng.lognormal(np.log(mean_ratio) - ratio_sd**2 / 2, ratio_sd, IWSLT_PAIRS)
    target = np.maximum(2, np.round(target)).astype(np.int64)
    source = np.maximum(2, np.round(target * ratio)).astype(np.int64)
    longest, ratio = np.maximum(source, target), np.maximum(source / target, target / source)
    keep = (longest <= 250) & (ratio <= 1.5)
    return source[keep].tolist(), target[keep].tolist()


def attention_work(shapes: list[tuple[int, int, int]]) -> int:
    """Scores the attention computes over batches of these (B, S, T): B (S^2 + T^2 + S T)."""
    return sum(b * (s * s + t * t + s * t) for b, s, t in shapes)


def exact_padding(source: list[int], target: list[int], max_tokens: int) -> dict:
    """Padding, distinct shapes and attention work of fairseq's exact batching (TokenBatches
    without cells)."""
    order = sorted(range(len(source)), key=lambda i: (target[i], source[i]))
    batches = batch_by_tokens([max(s, t) for s, t in zip(source, target)], order, max_tokens)
    shapes = [(len(b), max(source[i] for i in b), max(target[i] for i in b)) for b in batches]
    padded = sum(b * (s + t) for b, s, t in shapes)
    padding = 1 - (sum(source) + sum(target)) / padded
    return {"batches": len(batches), "shapes": len(set(shapes)), "padding": padding,
            "attention": attention_work(shapes)}  # fmt: skip


def packed(source: list[int], target: list[int], count: int, max_tokens: int) -> tuple[list, int]:
    """:func:`padding_table` of one shuffled pass of packed rows in at most ``count`` cells, and
    its attention work."""
    cells = packing_cells(source, target, count)
    batches = packed_batches(cells, source, target, max_tokens, random.Random(0))
    flat = [(shape, [i for row in rows for i in row]) for shape, rows in batches]
    return padding_table(flat, source, target), attention_work([shape for shape, _ in batches])


def bucketed(source: list[int], target: list[int], count: int, max_tokens: int) -> list[dict]:
    """:func:`padding_table` of one shuffled pass in ``count`` buckets fitted to the lengths."""
    cells = choose_cells(source, target, count)
    batches = bucket_batches(cells, source, target, max_tokens, random.Random(0))
    return padding_table(batches, source, target)


def as_json(table: list[dict]) -> list[dict]:
    return [{**row, "shape": row["shape"] if row["shape"] == "all" else list(row["shape"])}
            for row in table]  # fmt: skip


def report(name: str, source: list[int], target: list[int], count: int, max_tokens: int) -> dict:
    packed_table, packed_attention = packed(source, target, count, max_tokens)
    table = bucketed(source, target, count, max_tokens)
    curve = {k: bucketed(source, target, k, max_tokens)[-1]["padding"] for k in (4, 8, 12, 16)}
    exact = exact_padding(source, target, max_tokens)
    attention = packed_attention / exact["attention"]
    means = f"mean lengths {np.mean(source):.2f} / {np.mean(target):.2f}"
    print(f"\n{name}: {len(source):,} pairs, {means}, max_tokens {max_tokens}, {count} buckets")
    print("packed rows (data.pack_pairs: true, the training batches):")
    print(format_table(packed_table))
    print(f"attention work {attention:.2f}x exact batching's")
    print("a pair a row (pack_pairs: false):")
    print(format_table(table))
    print("padding by buckets: " + ", ".join(f"{k}: {100 * p:.1f}%" for k, p in curve.items()))
    print(
        f"exact batching: {exact['batches']} batches, {exact['shapes']} shapes, "
        f"{100 * exact['padding']:.1f}% padding"
    )
    return {"pairs": len(source), "max_tokens": max_tokens, "buckets": count,
            "packed": {"table": as_json(packed_table), "shapes": len(packed_table) - 1,
                       "padding": packed_table[-1]["padding"], "attention_vs_exact": attention},
            "table": as_json(table), "padding_by_buckets": curve, "exact": exact}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="where the demo corpus is built (default: a temporary folder)",
    )
    parser.add_argument("--eval", action="store_true", help="the demo's evaluation budget too")
    parser.add_argument("--cv", type=float, default=0.65)
    parser.add_argument("--ratio-sd", type=float, default=0.15)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        source, target = demo_lengths(args.data or Path(scratch) / "gettext_de_en")
    results["demo"] = report(
        "demo (gettext de-en, training split)", source, target, args.buckets, 1024
    )
    if args.eval:
        results["demo_eval_budget"] = report(
            "demo, evaluation budget", source, target, args.buckets, 4096
        )
    source, target = iwslt_lengths(args.cv, args.ratio_sd)
    results["iwslt"] = report(
        f"iwslt (IWSLT'14 de-en-like: published means, cv {args.cv}, ratio sd {args.ratio_sd})",
        source,
        target,
        args.buckets,
        4096,
    )
    spreads = {}
    for cv, ratio_sd in ((0.5, 0.15), (0.8, 0.15), (0.65, 0.1), (0.65, 0.2)):
        source, target = iwslt_lengths(cv, ratio_sd)
        single = bucketed(source, target, args.buckets, 4096)[-1]["padding"]
        spreads[f"cv {cv}, ratio sd {ratio_sd}"] = {
            "packed": packed(source, target, args.buckets, 4096)[0][-1]["padding"],
            "pair_a_row": single,
        }
    listed = ", ".join(f"{k}: {100 * p['packed']:.1f}% packed, {100 * p['pair_a_row']:.1f}% a "
                       "pair a row" for k, p in spreads.items())  # fmt: skip
    print(f"\niwslt padding at other assumed spreads: {listed}")
    results["iwslt_spreads"] = spreads
    text = json.dumps(results, indent=1)
    print("\n" + text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
