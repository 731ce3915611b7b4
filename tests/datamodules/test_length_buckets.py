"""Length buckets of translation batches: the best split by dynamic programming, cells that hold
every pair, batches within the token budget that cover every pair once in at most K shapes, rows
without a pair that no loss scores, and the datamodule's buckets shared by every split. Packed
rows: every pair once within its row, at most 10% padding in at most 8 shapes, and a packed
batch's loss and gradients those of its pairs alone."""

from __future__ import annotations

import itertools
import random
from functools import partial

import numpy as np
import pytest
import torch

from src.datamodules.dictionary import EOS_ID, PAD_ID
from src.datamodules.length_buckets import (
    Cell,
    _runs,
    assign,
    bucket_batches,
    choose_cells,
    pack_rows,
    packed_batches,
    packing_cells,
    padding_table,
)
from src.datamodules.translation import ParallelSplit, TokenBatches, collate, collate_packed
from src.models.delight_mt import DeLighTEncoderDecoder
from src.models.transformer_mt import TransformerEncoderDecoder
from src.tasks.translation import TranslationTask


def random_lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Skewed lengths like a corpus's: mostly short, a long tail; the sides correlated."""
    rng = np.random.default_rng(seed)
    target = np.maximum(2, np.round(rng.lognormal(np.log(8), 0.6, n))).astype(int)
    source = np.maximum(2, np.round(target * rng.lognormal(0.0, 0.15, n))).astype(int)
    return source.tolist(), target.tolist()


def pad_tokens(cells: list[tuple[int, int]], source: list[int], target: list[int]) -> int:
    """Pad tokens of the pairs, each in the cell that holds it with the least padding."""
    return sum(
        min(s_ + t_ - s - t for s_, t_ in cells if s <= s_ and t <= t_)
        for s, t in zip(source, target)
    )


def test_the_dynamic_programme_finds_the_best_split() -> None:
    source, target = random_lengths(300, seed=1)
    pairs, weight = np.unique(np.stack([source, target], 1), axis=0, return_counts=True)
    keys = sorted(set(np.maximum(source, target).tolist()))
    for count in (1, 2, 3):
        # every split of the ordered distinct keys into `count` runs, each run's cell its maxima
        best = None
        for cuts in itertools.combinations(range(1, len(keys)), count - 1):
            bounds = [0, *cuts, len(keys)]
            cost = 0
            for a, b in zip(bounds, bounds[1:]):
                run = [(s, t) for s, t in zip(source, target)
                       if keys[a] <= max(s, t) <= keys[b - 1]]  # fmt: skip
                cell = max(s for s, _ in run) + max(t for _, t in run)
                cost += sum(cell - s - t for s, t in run)
            best = cost if best is None else min(best, cost)
        runs = _runs(pairs, weight, count)
        assert len(runs) == count
        assert pad_tokens(runs, source, target) <= best


def test_cells_hold_every_pair_and_the_largest_covers_every_split() -> None:
    source, target = random_lengths(2000)
    cells = choose_cells(source, target, 8, cover=(90, 80))
    assert len(cells) <= 8 and len(set(cells)) == len(cells)
    assert (cells[-1].source, cells[-1].target) == (max(90, max(source)), max(80, max(target)))
    index = assign(cells, source, target)
    for s, t, k in zip(source, target, index):
        holding = [c for c in cells if s <= c.source and t <= c.target]
        assert cells[k] in holding
        assert cells[k].source + cells[k].target == min(c.source + c.target for c in holding)
    # descent from the dynamic programme's cells pads no more than they do
    pairs, weight = np.unique(np.stack([source, target], 1), axis=0, return_counts=True)
    runs = _runs(pairs, weight, 8)
    runs[-1] = (cells[-1].source, cells[-1].target)
    fitted = pad_tokens([(c.source, c.target) for c in cells], source, target)
    assert fitted <= pad_tokens(runs, source, target)
    # more buckets, less padding
    more = choose_cells(source, target, 16)
    assert pad_tokens([(c.source, c.target) for c in more], source, target) < 0.6 * fitted
    with pytest.raises(ValueError, match="fits no length bucket"):
        assign(cells, [cells[-1].source + 1], [2])
    with pytest.raises(ValueError, match="at least one length bucket"):
        choose_cells(source, target, 0)


def test_batches_cover_every_pair_once_in_few_shapes_within_the_budget() -> None:
    source, target = random_lengths(3000)
    cells = choose_cells(source, target, 8)
    for generator in (random.Random(0), None):
        batches = bucket_batches(cells, source, target, 600, generator)
        assert sorted(i for _, b in batches for i in b) == list(range(3000))
        shapes = {shape for shape, _ in batches}
        assert len(shapes) <= 8
        for (rows, s, t), indices in batches:
            assert rows * max(s, t) <= 600
            assert all(source[i] <= s and target[i] <= t for i in indices)
        for shape in shapes:
            sizes = [len(b) for sh, b in batches if sh == shape]
            # only the last batch of a cell has rows without a pair, fewer than its batches
            assert all(size == shape[0] for size in sizes[:-1])
            assert shape[0] - sizes[-1] < len(sizes)
    table = padding_table(batches, source, target)
    assert table[-1]["pairs"] == 3000 and table[-1]["batches"] == len(batches)
    padded = sum(rows * (s + t) for (rows, s, t), _ in batches)
    assert table[-1]["padding"] == pytest.approx(1 - (sum(source) + sum(target)) / padded)
    # evaluation order: sorted by target then source length inside a cell
    for _, indices in bucket_batches(cells, source, target, 600):
        keys = [(target[i], source[i]) for i in indices]
        assert keys == sorted(keys)


def pairs_split(lengths: list[tuple[int, int]]) -> ParallelSplit:
    source = [torch.cat((torch.arange(4, 3 + s), torch.tensor([EOS_ID]))) for s, _ in lengths]
    target = [torch.cat((torch.arange(5, 4 + t), torch.tensor([EOS_ID]))) for _, t in lengths]
    references = [f"ref {i}" for i in range(len(lengths))]
    return ParallelSplit(source, target, references, list(range(1, len(lengths) + 1)))


def test_collate_pads_to_the_shape_with_rows_no_loss_scores() -> None:
    split = pairs_split([(3, 2), (2, 4)])
    batch = collate(split, [0, 1], (4, 5, 6))
    assert batch["src_tokens"].shape == (4, 5)
    assert batch["target"].shape == batch["prev_output_tokens"].shape == (4, 6)
    assert batch["src_tokens"][:2].tolist() == [
        [4, 5, EOS_ID, PAD_ID, PAD_ID],
        [4, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
    ]
    assert batch["target"][1].tolist() == [5, 6, 7, EOS_ID, PAD_ID, PAD_ID]
    assert batch["prev_output_tokens"][1].tolist() == [EOS_ID, 5, 6, 7, PAD_ID, PAD_ID]
    # the extra rows: eos then pad as inputs, an all-pad target
    assert batch["src_tokens"][2:].tolist() == [[EOS_ID] + [PAD_ID] * 4] * 2
    assert batch["prev_output_tokens"][2:].tolist() == [[EOS_ID] + [PAD_ID] * 5] * 2
    assert batch["target"][2:].eq(PAD_ID).all()
    assert batch["id"].tolist() == [0, 1, -1, -1] and batch["references"] == ["ref 0", "ref 1"]
    exact = collate(split, [0, 1])
    assert exact["src_tokens"].shape == (2, 3) and exact["target"].shape == (2, 4)
    with pytest.raises(ValueError, match="do not fit the batch shape"):
        collate(split, [0, 1], (2, 2, 6))


def delight() -> DeLighTEncoderDecoder:
    return DeLighTEncoderDecoder(
        24, 24, 64, 2, 3, 1.0, dropout=0.0, attention_dropout=0.0, ffn_dropout=0.0,
        embedding_dropout=0.0, position_dropout=0.0,
    )  # fmt: skip


def transformer() -> TransformerEncoderDecoder:
    return TransformerEncoderDecoder(
        24, 24, d_model=32, ffn_dim=64, num_heads=2, num_layers=1, dropout=0.0
    )


@pytest.mark.parametrize("make_net", [delight, transformer], ids=["delight", "transformer"])
def test_rows_without_a_pair_change_no_loss_and_no_gradient(make_net) -> None:
    split = pairs_split([(5, 3), (2, 6), (4, 4)])
    results = []
    for shape in (None, (5, 7, 9)):  # the pairs alone; padded to more rows and longer sides
        torch.manual_seed(0)
        task = TranslationTask(make_net(), partial(torch.optim.Adam), label_smoothing=0.1)
        loss, nll, ntokens = task._losses(collate(split, [0, 1, 2], shape))
        loss.backward()
        grads = [p.grad.clone() for p in task.net.parameters() if p.grad is not None]
        assert all(g.isfinite().all() for g in grads)
        results.append((loss.item(), nll.item(), int(ntokens), grads))
    (loss, nll, ntokens, grads), (padded_loss, padded_nll, padded_ntokens, padded_grads) = results
    assert ntokens == padded_ntokens == 3 + 6 + 4
    assert padded_loss == pytest.approx(loss, rel=1e-5)
    assert padded_nll == pytest.approx(nll, rel=1e-5)
    assert len(grads) == len(padded_grads)
    for g, h in zip(grads, padded_grads):
        torch.testing.assert_close(h, g, rtol=1e-4, atol=1e-6)


def test_token_batches_pad_to_the_cells_on_every_rank() -> None:
    lengths = list(zip(*random_lengths(200, seed=3)))
    split = pairs_split([(s - 1, t - 1) for s, t in lengths])  # eos adds one
    source, target = [len(s) for s in split.source], [len(t) for t in split.target]
    cells = choose_cells(source, target, 4)
    epoch = {"value": 0}
    batches = TokenBatches(split, 256, shuffle=True, cells=cells, epoch=lambda: epoch["value"])
    first = list(batches)
    epoch["value"] = 1
    second = list(batches)
    assert len(first) == len(second) == len(batches)
    assert sorted(i for b in first for i in b["id"].tolist() if i >= 0) == list(range(200))
    assert [b["id"].tolist() for b in first] != [b["id"].tolist() for b in second]
    shapes = {(tuple(b["src_tokens"].shape), tuple(b["target"].shape)) for b in first + second}
    planned = {shape for shape, _ in bucket_batches(cells, source, target, 256)}
    expected = {((rows, s), (rows, t)) for rows, s, t in planned}
    assert shapes == expected and len(shapes) <= 4

    def dealt(shuffle: bool) -> list[list[list[int]]]:
        make = partial(TokenBatches, split, 256, shuffle=shuffle, cells=cells, world_size=2)
        return [make(rank=r).batches(0) for r in (0, 1)]

    ranks = dealt(True)
    assert len(ranks[0]) == len(ranks[1])  # the same number of steps on every process
    evaluation = dealt(False)
    assert sorted(i for r in evaluation for b in r for i in b) == list(range(200))  # none dropped


def test_cell_rows_split_a_cell_evenly_within_the_budget() -> None:
    cell = Cell(10, 12)
    assert cell.budget_rows(120) == 10 and cell.budget_rows(5) == 1
    assert cell.rows(25, 120) == 9  # 3 batches of 9, 9, 7 rather than 10, 10, 5
    assert cell.rows(10, 120) == 10 and cell.rows(3, 120) == 3


# -- packed rows ---------------------------------------------------------------------------------


def test_packing_cells_double_from_twice_the_median_to_the_cover() -> None:
    source, target = random_lengths(2000, seed=4)
    median = int(np.median(np.maximum(source, target)))
    cells = packing_cells(source, target, 8, cover=(200, 190))
    lengths = [c.source for c in cells[:-1]]
    assert cells[-1] == Cell(200, 190)
    assert all(c.source == c.target for c in cells[:-1])
    assert lengths[0] >= 2 * median > lengths[0] // 2 and lengths[0] % 8 == 0
    assert all(b == 2 * a for a, b in zip(lengths, lengths[1:])) and lengths[-1] < 190
    # fewer cells keep the longest rungs
    assert packing_cells(source, target, 2, cover=(200, 190)) == (Cell(128, 128), Cell(200, 190))
    assert packing_cells(source, target, 1) == (Cell(max(source), max(target)),)


def test_pack_rows_places_every_pair_once_within_its_row() -> None:
    source, target = random_lengths(3000, seed=5)
    cells = packing_cells(source, target, 8)
    rows = pack_rows(cells, source, target, random.Random(0))
    placed = sorted(i for _, pairs in rows for i in pairs)
    assert placed == list(range(3000))
    for k, pairs in rows:
        assert sum(source[i] for i in pairs) <= cells[k].source
        assert sum(target[i] for i in pairs) <= cells[k].target
    # short pairs share rows: far fewer rows than pairs
    assert len(rows) < 3000 / 2.5
    assert rows != pack_rows(cells, source, target, random.Random(1))  # shuffled ties differ


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_batches_pad_at_most_a_tenth_in_at_most_8_shapes(seed: int) -> None:
    source, target = random_lengths(20_000, seed=seed)
    cells = packing_cells(source, target, 8)
    packed = packed_batches(cells, source, target, 1024, random.Random(seed))
    flat = [(shape, [i for row in rows for i in row]) for shape, rows in packed]
    table = padding_table(flat, source, target)
    assert len(table) - 1 <= 8
    assert table[-1]["padding"] <= 0.10
    assert sorted(i for _, pairs in flat for i in pairs) == list(range(20_000))
    for (b, s, t), rows in packed:
        assert len(rows) <= b <= max(1, 1024 // max(s, t))
    # a pair a row in the fitted cells pads about twice as much
    single = padding_table(bucket_batches(choose_cells(source, target, 8), source, target, 1024,
                                          random.Random(seed)), source, target)  # fmt: skip
    assert single[-1]["padding"] > 1.5 * table[-1]["padding"]


def test_collate_packed_lays_pairs_side_by_side() -> None:
    split = pairs_split([(3, 2), (2, 4), (1, 1)])  # lengths with eos
    batch = collate_packed(split, [[0, 1], [2]], (3, 8, 9))
    assert batch["src_tokens"][0].tolist() == [4, 5, EOS_ID, 4, EOS_ID, PAD_ID, PAD_ID, PAD_ID]
    assert batch["src_segments"][0].tolist() == [1, 1, 1, 2, 2, 0, 0, 0]
    assert batch["src_positions"][0].tolist() == [2, 3, 4, 2, 3, PAD_ID, PAD_ID, PAD_ID]
    assert batch["target"][0].tolist() == [5, EOS_ID, 5, 6, 7, EOS_ID] + [PAD_ID] * 3
    # teacher forcing: each pair's target shifted behind its own eos
    assert batch["prev_output_tokens"][0].tolist() == [EOS_ID, 5, EOS_ID, 5, 6, 7] + [PAD_ID] * 3
    assert batch["tgt_segments"][0].tolist() == [1, 1, 2, 2, 2, 2, 0, 0, 0]
    assert batch["tgt_positions"][0].tolist() == [2, 3, 2, 3, 4, 5] + [PAD_ID] * 3
    assert batch["src_segments"][1].tolist() == [1] + [0] * 7
    # the row without a pair: all pad, segment 0
    assert batch["src_tokens"][2].eq(PAD_ID).all() and batch["tgt_segments"][2].eq(0).all()
    assert batch["id"].tolist() == [[0, 1], [2, -1], [-1, -1]]
    assert batch["references"] == ["ref 0", "ref 1", "ref 2"]
    with pytest.raises(ValueError, match="do not fit a row"):
        collate_packed(split, [[0, 1, 2]], (1, 5, 9))


def test_token_batches_pack_the_training_pairs() -> None:
    lengths = list(zip(*random_lengths(300, seed=6)))
    split = pairs_split([(s - 1, t - 1) for s, t in lengths])
    source, target = [len(s) for s in split.source], [len(t) for t in split.target]
    cells = packing_cells(source, target, 4)
    batches = list(TokenBatches(split, 256, shuffle=True, cells=cells, pack=True))
    ids = [i for b in batches for i in b["id"].flatten().tolist() if i >= 0]
    assert sorted(ids) == list(range(300))
    real = sum(int(b["target"].ne(PAD_ID).sum()) for b in batches)
    assert real == sum(target)
    assert all(b["tgt_segments"].ne(0).eq(b["target"].ne(PAD_ID)).all() for b in batches)
    assert len({tuple(b["src_tokens"].shape) for b in batches}) <= 4
    with pytest.raises(ValueError, match="need length buckets"):
        TokenBatches(split, 256, shuffle=True, pack=True)


@pytest.mark.parametrize("make_net", [delight, transformer], ids=["delight", "transformer"])
def test_a_packed_batch_has_the_loss_and_gradients_of_its_pairs_alone(make_net) -> None:
    split = pairs_split([(5, 3), (2, 6), (4, 4), (6, 2)])
    results = []
    for batch in (collate(split, [0, 1, 2, 3]), collate_packed(split, [[0, 1], [2, 3], []],
                                                               (3, 13, 12))):  # fmt: skip
        torch.manual_seed(0)
        task = TranslationTask(make_net().double(), partial(torch.optim.Adam), label_smoothing=0.1)
        loss, nll, ntokens = task._losses(batch)
        loss.backward()
        grads = [p.grad.clone() for p in task.net.parameters() if p.grad is not None]
        assert all(g.isfinite().all() for g in grads)
        results.append((loss.item(), nll.item(), int(ntokens), grads))
    (loss, nll, ntokens, grads), (packed_loss, packed_nll, packed_ntokens, packed_grads) = results
    assert ntokens == packed_ntokens == 3 + 6 + 4 + 2  # eos included
    assert packed_loss == pytest.approx(loss, rel=1e-10)
    assert packed_nll == pytest.approx(nll, rel=1e-10)
    assert len(grads) == len(packed_grads)
    for g, h in zip(grads, packed_grads):
        torch.testing.assert_close(h, g, rtol=1e-9, atol=1e-12)
