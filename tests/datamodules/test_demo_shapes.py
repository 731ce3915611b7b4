"""Every text demo's batches come in a few fixed shapes over a whole epoch (a step replayed as a
CUDA graph is recorded per shape), and the translation demo's length buckets pad as measured."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from hydra.utils import instantiate
from lightning import LightningDataModule

from src.datamodules.length_buckets import bucket_batches, choose_cells, padding_table
from src.datamodules.translation import TranslationDataModule, batch_by_tokens
from tests.conftest import compose_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every demo corpus: the two demos of a corpus build it once."""
    return tmp_path_factory.mktemp("data")


def demo_data(experiment: str, data_dir: Path, tmp_path: Path) -> LightningDataModule:
    overrides = [f"experiment={experiment}", f"paths.data_dir={data_dir}"]
    cfg = compose_config("train", overrides, tmp_path)
    data = instantiate(cfg.data)
    data.prepare_data()
    data.setup("fit")
    return data


def shapes(loader) -> Counter:
    """How many batches of each input shape one pass of ``loader`` yields."""
    counts: Counter = Counter()
    for batch in loader:
        if isinstance(batch, dict):  # translation: (source, target) shapes
            counts[tuple(batch["src_tokens"].shape), tuple(batch["target"].shape)] += 1
        else:
            inputs, targets = batch
            assert inputs.shape == targets.shape
            counts[tuple(inputs.shape)] += 1
    return counts


@pytest.mark.parametrize("experiment", ["delight_mt/demo", "delight_mt/transformer_mt_demo"])
def test_translation_demos_train_in_at_most_eight_shapes(experiment, data_dir, tmp_path) -> None:
    data = demo_data(experiment, data_dir, tmp_path)
    assert data.shape_buckets == 8 and len(data.cells) <= 8
    train = shapes(data.train_dataloader())
    assert len(train) == len(data.cells)
    assert sum(train.values()) == len(data.train_dataloader())
    for (rows, source), (same_rows, target) in train:
        assert rows == same_rows and rows * max(source, target) <= data.max_tokens
    cells = {(c.source, c.target) for c in data.cells}
    for loader in (data.val_dataloader(), data.test_dataloader()):
        evaluated = shapes(loader)
        assert len(evaluated) <= 8
        assert {(s, t) for (_, s), (_, t) in evaluated} <= cells


def test_the_translation_demo_pads_a_fifth_of_its_tokens(data_dir, tmp_path) -> None:
    data: TranslationDataModule = demo_data("delight_mt/demo", data_dir, tmp_path)
    train = data.splits["train"]
    source, target = [len(s) for s in train.source], [len(t) for t in train.target]

    def padding(count: int) -> float:
        cells = choose_cells(source, target, count)
        batches = bucket_batches(cells, source, target, data.max_tokens, random.Random(0))
        return padding_table(batches, source, target)[-1]["padding"]

    # fairseq's exact batching: each batch padded to its own longest pair, a shape per batch
    order = sorted(range(len(source)), key=lambda i: (target[i], source[i]))
    lengths = [max(s, t) for s, t in zip(source, target)]
    exact = batch_by_tokens(lengths, order, data.max_tokens)
    padded = sum(len(b) * (max(source[i] for i in b) + max(target[i] for i in b)) for b in exact)
    exact_padding = 1 - (sum(source) + sum(target)) / padded
    # 4,405 pairs of 7.6 / 7.0 tokens: 20.7% at 8 shapes, 11.2% at 16, exact 15.8% in 42 shapes
    assert 0.13 < exact_padding < 0.19
    assert padding(8) < 0.23 and padding(8) - exact_padding < 0.07
    assert padding(16) < 0.13 < padding(8)


SEGMENT_DEMOS = [
    "char_lm/demo",
    "char_lm/demo_txl",
    "group_transformer_lm/demo",
    "group_transformer_lm/demo_txl",
]


@pytest.mark.parametrize("experiment", SEGMENT_DEMOS)
def test_segment_demos_train_in_one_shape(experiment, data_dir, tmp_path) -> None:
    data = demo_data(experiment, data_dir, tmp_path)
    assert set(shapes(data.train_dataloader())) == {(16, 64)}
    # evaluation scores every symbol: full segments and the last one's remainder
    for loader in (data.val_dataloader(), data.test_dataloader()):
        evaluated = shapes(loader)
        assert (8, 64) in evaluated and len(evaluated) <= 2
        assert all(rows == 8 and length <= 64 and evaluated[(rows, length)] == 1
                   for rows, length in evaluated if length != 64)  # fmt: skip


@pytest.mark.parametrize("experiment", ["delight_lm/demo", "delight_lm/transformer_lm_demo"])
def test_block_demos_train_and_evaluate_in_one_shape(experiment, data_dir, tmp_path) -> None:
    data = demo_data(experiment, data_dir, tmp_path)
    assert set(shapes(data.train_dataloader())) == {(16, 128)}
    assert set(shapes(data.val_dataloader())) == set(shapes(data.test_dataloader())) == {(8, 128)}


@pytest.mark.parametrize("experiment", ["pru_lm/demo", "pru_lm/lstm_demo"])
def test_awd_demos_train_in_four_shapes_and_evaluate_in_one(experiment, data_dir, tmp_path) -> None:
    data = demo_data(experiment, data_dir, tmp_path)
    train = shapes(data.train_dataloader())
    assert set(train) <= {(20, 10), (20, 20), (20, 30), (20, 40)}
    assert train[(20, 30)] + train[(20, 40)] > 0.8 * sum(train.values())  # bptt 35: 30 or 40
    assert set(shapes(data.val_dataloader())) == {(10, 35)}
    assert set(shapes(data.test_dataloader())) == {(1, 35)}
