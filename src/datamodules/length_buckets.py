"""Length buckets: sentence pairs batched in a few padded shapes (static shapes for CUDA graphs).

A CUDA graph, like a torch.compile trace with static shapes, holds one input shape, so a training
step can be replayed only if its batches come in a few shapes. A bucket is a cell (S, T) of source
and target lengths (eos included). A pair of lengths (s, t) goes to the cell that holds it
(s <= S and t <= T) with the least padding, S + T - s - t. Its batches have the shapes
src_tokens (B, S), prev_output_tokens and target (B, T).

The cells (:func:`choose_cells`) are fitted to the training pairs to minimise the pad tokens of
their rows: first the best split of the pairs, ordered by max(s, t), into at most K runs (dynamic
programming over the distinct lengths), each run's cell the longest source and target in it; then
coordinate descent, each cell's S or T in turn set to the value that pads least. The largest cell
is widened to ``cover`` (the longest source and target of every split), so that validation and test
pairs fit it too.

Batches of one pass (:func:`bucket_batches`): a cell's n pairs (the training ones shuffled, the
evaluation ones sorted by length) are cut into m = ceil(n / B_max) batches of B = ceil(n / m)
rows, B_max = max_tokens // max(S, T) (fairseq's budget: sentences * longest side <= max_tokens).
So B depends on the split's count in the cell, not on the pass, every pair is in one batch per
pass, and only the cell's last batch has rows without a pair, fewer than m
(:func:`~src.datamodules.translation.collate` fills them, and the loss skips them).

Packed rows (:func:`packed_batches`, the training batches with ``data.pack_pairs``): a row holds
as many pairs as fit its cell side by side, each a segment the model keeps apart
(:mod:`src.models.packing`), so the free length of rows holding a short pair is filled by other
pairs instead of pads. The cells are then a ladder (:func:`packing_cells`): square cells doubling
in length from about twice the median pair, then the cell covering the longest pair. Rows are
filled best fit, longest pairs first (:func:`pack_rows`): a pair goes to the open row whose free
source length is the least that holds it (and whose free target length holds it too), else opens
a row of the smallest cell holding it. A longer row costs attention over its whole length, so
the ladder keeps most pairs in rows a few times their length.

:func:`padding_table` measures what the batches of a pass pad: pad tokens / all tokens of the padded
source and target, by cell.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DESCENT_ROUNDS = 20  # coordinate descent stops earlier when no move lowers the padding


@dataclass(frozen=True)
class Cell:
    """A bucket: the padded source and target lengths S and T (eos included)."""

    source: int
    target: int

    def budget_rows(self, max_tokens: int) -> int:
        """B_max, the most sentences a batch may have: ``max_tokens // max(S, T)``, at least 1."""
        return max(1, max_tokens // max(self.source, self.target))

    def rows(self, pairs: int, max_tokens: int) -> int:
        """B for ``pairs`` pairs: the fewest batches within the budget, as full as each other."""
        batches = math.ceil(pairs / self.budget_rows(max_tokens))
        return math.ceil(pairs / batches)


def _pairs(
    source: Sequence[int], target: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (s, t), how many pairs have each, and which one each pair has.

    Shape:
        -> (U, 2) int64, (U,) int64, (N,) int64
    """
    source = np.asarray(source, dtype=np.int64)
    target = np.asarray(target, dtype=np.int64)
    if source.shape != target.shape or source.size == 0:
        raise ValueError(
            f"need as many source as target lengths, and some: {source.size}, {target.size}"
        )
    # one integer per (s, t): unique over a 1-D array is much faster than over rows
    span = int(target.max()) + 1
    keys, inverse, counts = np.unique(
        source * span + target, return_inverse=True, return_counts=True
    )
    return np.stack([keys // span, keys % span], 1), counts, inverse.reshape(-1)


def _runs(pairs: np.ndarray, weight: np.ndarray, count: int) -> list[tuple[int, int]]:
    """The cells of the best split of ``pairs`` ordered by max(s, t) into at most ``count`` runs.

    Shape:
        pairs (U, 2), weight (U,) -> at most ``count`` (S, T)
    """
    values, group = np.unique(pairs.max(1), return_inverse=True)
    size = len(values)
    members = np.bincount(group, weights=weight, minlength=size)
    tokens = np.bincount(group, weights=weight * pairs.sum(1), minlength=size)
    longest = np.zeros((size, 2), dtype=np.int64)  # (V, 2): the longest s and t of each group
    np.maximum.at(longest, group, pairs)
    # cost[a, b]: the pad tokens of one cell holding groups a..b
    cost = np.full((size, size), np.inf)
    for a in range(size):
        cell = np.maximum.accumulate(longest[a:], axis=0).sum(1)  # (V - a,): S + T of runs a..b
        cost[a, a:] = np.cumsum(members[a:]) * cell - np.cumsum(tokens[a:])
    best = cost[0].copy()  # best[b]: groups 0..b in the runs so far
    starts = []  # per added run: where the run ending at b starts, -1 where none ends there
    for _ in range(1, min(count, size)):
        extended = best[:-1, None] + cost[1:]  # (a - 1, b): a run a..b after the best of 0..a-1
        start, value = extended.argmin(0) + 1, extended.min(0)
        better = value < best
        starts.append(np.where(better, start, -1))
        best = np.where(better, value, best)
    runs, end = [], size - 1
    for start in reversed(starts):
        if start[end] >= 0:
            runs.append((int(start[end]), end))
            end = int(start[end]) - 1
    runs.append((0, end))
    return [tuple(int(v) for v in longest[a : b + 1].max(0)) for a, b in reversed(runs)]


def _least_pad(pairs: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """The least padding of each pair over the cells that hold it (inf where none does).

    Shape:
        pairs (U, 2), cells (K, 2) -> (U,) float64
    """
    return _pads(pairs, cells).min(1)


def _pads(pairs: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """The padding of each pair in each cell, inf where the cell does not hold it.

    Shape:
        pairs (U, 2), cells (K, 2) -> (U, K) float64
    """
    holds = (pairs[:, None, 0] <= cells[None, :, 0]) & (pairs[:, None, 1] <= cells[None, :, 1])
    return np.where(holds, cells.sum(1)[None, :] - pairs.sum(1)[:, None], np.inf)


def _descend(pairs: np.ndarray, weight: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Coordinate descent on every cell's S and T but the last's (it covers all pairs).

    Shape:
        pairs (U, 2), weight (U,), cells (K, 2) -> (K, 2)
    """
    cells = cells.copy()
    candidates = (np.unique(pairs[:, 0]), np.unique(pairs[:, 1]))
    total = float(weight @ _least_pad(pairs, cells))
    for _ in range(DESCENT_ROUNDS):
        moved = False
        for k in range(len(cells) - 1):
            for side in (0, 1):
                rest = _least_pad(pairs, np.delete(cells, k, 0))  # (U,)
                trial = np.repeat(cells[k][None], len(candidates[side]), 0)  # (C, 2)
                trial[:, side] = candidates[side]
                totals = weight @ np.minimum(rest[:, None], _pads(pairs, trial))  # (C,)
                best = int(totals.argmin())
                if totals[best] < total - 0.5:  # whole tokens: a real saving
                    cells[k], total, moved = trial[best], float(totals[best]), True
        if not moved:
            break
    return cells


def choose_cells(
    source: Sequence[int],
    target: Sequence[int],
    count: int,
    *,
    cover: tuple[int, int] | None = None,
) -> tuple[Cell, ...]:
    """At most ``count`` cells fitted to the pairs' lengths (module docstring), by S + T.

    Args:
        source: the source length of every training pair (eos included).
        target: the target lengths, in the same order.
        count: the most cells (batch shapes) wanted.
        cover: (S, T) the largest cell must reach at least, e.g. the longest source and target
            of every split; None: the training pairs' longest.
    """
    if count < 1:
        raise ValueError(f"need at least one length bucket, got {count}")
    pairs, weight, _ = _pairs(source, target)
    cells = np.array(_runs(pairs, weight, count), dtype=np.int64)  # (K, 2)
    top = pairs.max(0) if cover is None else np.maximum(pairs.max(0), cover)
    cells[-1] = top
    cells = _descend(pairs, weight, cells)
    unique = {Cell(int(s), int(t)) for s, t in cells}
    return tuple(sorted(unique, key=lambda c: (c.source + c.target, c.source)))


def assign(cells: Sequence[Cell], source: Sequence[int], target: Sequence[int]) -> np.ndarray:
    """The index in ``cells`` of the cell each pair goes to: the one that holds it with the least
    padding (the first of equals).

    Shape:
        -> (N,) int64
    """
    pairs, _, which = _pairs(source, target)
    table = np.array([(c.source, c.target) for c in cells], dtype=np.int64)  # (K, 2)
    pads = _pads(pairs, table)  # (U, K)
    homeless = np.isinf(pads).all(1)
    if homeless.any():
        s, t = pairs[homeless][0]
        raise ValueError(
            f"a pair of {s} source / {t} target tokens fits no length bucket (the largest is "
            f"{max((c.source, c.target) for c in cells)}); the buckets must cover every split"
        )
    return pads.argmin(1)[which]


def bucket_batches(
    cells: Sequence[Cell],
    source: Sequence[int],
    target: Sequence[int],
    max_tokens: int,
    generator: random.Random | None = None,
) -> list[tuple[tuple[int, int, int], list[int]]]:
    """One pass's batches: ((B, S, T), pair indices), every pair once (module docstring).

    Args:
        cells: the buckets.
        source: the source length of every pair of the split.
        target: the target lengths.
        max_tokens: the token budget that bounds each cell's B.
        generator: shuffles each cell's pairs (training); None sorts them by target then source
            length (evaluation: the searches of a batch end together).
    """
    members: list[list[int]] = [[] for _ in cells]
    for index, k in enumerate(assign(cells, source, target).tolist()):
        members[k].append(index)
    batches: list[tuple[tuple[int, int, int], list[int]]] = []
    for cell, own in zip(cells, members):
        if not own:
            continue
        if generator is None:
            own.sort(key=lambda i: (target[i], source[i]))
        else:
            generator.shuffle(own)
        rows = cell.rows(len(own), max_tokens)
        shape = (rows, cell.source, cell.target)
        batches.extend((shape, own[i : i + rows]) for i in range(0, len(own), rows))
    return batches


def packing_cells(
    source: Sequence[int],
    target: Sequence[int],
    count: int,
    *,
    cover: tuple[int, int] | None = None,
) -> tuple[Cell, ...]:
    """At most ``count`` cells for packed rows (module docstring): (L, L) for L = 8 * 2^k from the
    least power of two at least twice the median of max(s, t) and below the longest pair, the
    longest ones kept when there are more, then the cell covering every pair (and ``cover``).
    """
    if count < 1:
        raise ValueError(f"need at least one length bucket, got {count}")
    pairs, weight, _ = _pairs(source, target)
    top = pairs.max(0) if cover is None else np.maximum(pairs.max(0), cover)
    longest = pairs.max(1)
    order = np.argsort(longest)
    cumulative = np.cumsum(weight[order])
    median = int(longest[order][np.searchsorted(cumulative, cumulative[-1] / 2)])
    length = 8
    while length < 2 * median:
        length *= 2
    ladder = []
    while length < min(top) and len(ladder) < 64:
        ladder.append(length)
        length *= 2
    ladder = ladder[max(0, len(ladder) - (count - 1)) :] if count > 1 else []
    return tuple(Cell(n, n) for n in ladder) + (Cell(int(top[0]), int(top[1])),)


def pack_rows(
    cells: Sequence[Cell],
    source: Sequence[int],
    target: Sequence[int],
    generator: random.Random | None = None,
) -> list[tuple[int, list[int]]]:
    """Pairs packed into rows of the cells, best fit, longest first (module docstring).

    Args:
        cells: the row shapes; every pair must fit one.
        generator: orders pairs of equal length at random (training), else by index.

    Returns:
        per row, the index of its cell and its pairs in the order they sit in the row
    """
    home = assign(cells, source, target).tolist()
    order = list(range(len(source)))
    if generator is not None:
        generator.shuffle(order)
    order.sort(key=lambda i: -(source[i] + target[i]))  # stable: equal lengths stay shuffled
    widest = max(c.source for c in cells)
    by_gap: list[list[int]] = [[] for _ in range(widest + 1)]  # open rows by free source length
    counts = np.zeros(widest + 1, dtype=np.int64)  # len(by_gap[g]), to find the next g at once
    rows: list[tuple[int, list[int]]] = []
    free_target: list[int] = []
    for i in order:
        s, t = source[i], target[i]
        row = -1
        for g in np.flatnonzero(counts[s:]) + s:
            bucket = by_gap[g]
            for j in range(len(bucket) - 1, -1, -1):  # the most recent rows first
                if free_target[bucket[j]] >= t:
                    row = bucket.pop(j)
                    counts[g] -= 1
                    break
            if row >= 0:
                break
        if row < 0:
            cell = cells[home[i]]
            rows.append((home[i], []))
            free_target.append(cell.target)
            row, g = len(rows) - 1, cell.source
        else:
            g = int(g)
        rows[row][1].append(i)
        free_target[row] -= t
        by_gap[g - s].append(row)
        counts[g - s] += 1
    return rows


def packed_batches(
    cells: Sequence[Cell],
    source: Sequence[int],
    target: Sequence[int],
    max_tokens: int,
    generator: random.Random | None = None,
) -> list[tuple[tuple[int, int, int], list[list[int]]]]:
    """One pass's batches of packed rows: ((B, S, T), the pairs of each row), every pair once.

    A cell's n rows (shuffled with ``generator``) are cut into batches of B rows as
    :func:`bucket_batches` cuts pairs: ``B = ceil(n / m)``, m = ceil(n / B_max),
    B_max = max_tokens // max(S, T).
    """
    rows = pack_rows(cells, source, target, generator)
    members: list[list[list[int]]] = [[] for _ in cells]
    for k, pairs in rows:
        members[k].append(pairs)
    batches: list[tuple[tuple[int, int, int], list[list[int]]]] = []
    for cell, own in zip(cells, members):
        if not own:
            continue
        if generator is not None:
            generator.shuffle(own)
        b = cell.rows(len(own), max_tokens)
        shape = (b, cell.source, cell.target)
        batches.extend((shape, own[i : i + b]) for i in range(0, len(own), b))
    return batches


def padding_table(
    batches: Sequence[tuple[tuple[int, int, int], Sequence[int]]],
    source: Sequence[int],
    target: Sequence[int],
) -> list[dict]:
    """Per shape (B, S, T) of ``batches``: batches, pairs, and ``padding``, the share of pad tokens
    in the padded source and target (rows without a pair included); a last row ``shape: "all"``
    sums them.
    """
    rows: dict[tuple[int, int, int], dict] = {}
    for shape, indices in batches:
        b, s, t = shape
        empty = {"shape": shape, "batches": 0, "pairs": 0, "tokens": 0, "padded": 0}
        row = rows.setdefault(shape, empty)
        row["batches"] += 1
        row["pairs"] += len(indices)
        row["tokens"] += sum(source[i] + target[i] for i in indices)
        row["padded"] += b * (s + t)
    table = [rows[shape] for shape in sorted(rows, key=lambda s: (s[1] + s[2], s[1]))]
    total = {k: sum(r[k] for r in table) for k in ("batches", "pairs", "tokens", "padded")}
    table.append({"shape": "all", **total})
    for row in table:
        row["padding"] = 1 - row["tokens"] / row["padded"]
    return table


def format_table(table: Sequence[dict]) -> str:
    """:func:`padding_table` as aligned lines: B, S, T, batches, pairs, padding %."""
    lines = [f"{'B':>5} {'S':>5} {'T':>5} {'batches':>8} {'pairs':>8} {'padding':>8}"]
    for row in table:
        b, s, t = row["shape"] if row["shape"] != "all" else ("all", "", "")
        counts = f"{row['batches']:>8} {row['pairs']:>8} {100 * row['padding']:>7.1f}%"
        lines.append(f"{b:>5} {s:>5} {t:>5} {counts}")
    return "\n".join(lines)
