"""PTB-layout word streams: the official vocabulary order and <eos>, column streams carried across
batches, the variable-BPTT rule and its rounded, few-shape form, DDP column slices, evaluation
windows that score every token once (a padded last one too), the bad-input messages, loader
workers, a Lightning fit over two epochs and the embedded pydoc_ptb corpus."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch

from src.datamodules.awd_lm import (
    UNSCORED,
    AWDLMDataModule,
    PydocPTBDataModule,
    batchify,
    bptt_choices,
    bptt_lengths,
    ptb_style,
)
from src.datamodules.text_files import TextEncodingError
from src.datamodules.word_corpus import Vocabulary
from src.models.awd_lm import AWDLanguageModel
from src.tasks.awd_lm import AWDLMTask
from tests.datamodules.test_text_files import check_message, write_latin1

TRAIN = " the cat sat\n\n a dog <unk> sat\n"
VALID = "the dog\n"
TEST = "a cat sat\n"
EVAL = "w0 w1\n" * 50  # evaluation text for the numbered training streams


def write_corpus(root: Path, train: str, valid: str, test: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in (("train.txt", train), ("valid.txt", valid), ("test.txt", test)):
        (root / name).write_text(text)
    return root


def numbered(n: int) -> str:
    """One line of n distinct words: the stream's ids are 0 .. n (n is <eos>), id == position."""
    return " ".join(f"w{i}" for i in range(n)) + "\n"


def attach(dm: AWDLMDataModule, rank: int = 0, world: int = 1, epoch: int = 0) -> None:
    """What the module reads from a Lightning trainer."""
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=world, current_epoch=epoch)


def test_vocabulary_in_order_of_first_appearance_with_eos(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, TRAIN, VALID, TEST)
    dm = AWDLMDataModule(str(root), batch_size=1, eval_batch_size=1, bptt=2)
    assert dm.vocab_size == 7  # counted at construction
    dm.setup()
    assert dm.dictionary.symbols == ("the", "cat", "sat", "<eos>", "a", "dog", "<unk>")
    # every line ends with <eos>; an empty line is <eos> alone
    assert np.asarray(dm.splits["train"]).tolist() == [0, 1, 2, 3, 3, 4, 5, 6, 2, 3]
    assert np.asarray(dm.splits["val"]).tolist() == [0, 5, 3]
    assert np.asarray(dm.splits["test"]).tolist() == [4, 1, 2, 3]
    assert dm.dictionary.decode([0, 1, 3, 4]) == "the cat\na"
    assert dm.dictionary.index("zebra") == 6  # <unk>
    cache = root / "word_stream_cache"
    assert (cache / "vocab.txt").read_text().split("\n")[:4] == ["the", "cat", "sat", "<eos>"]


def test_cache_is_used_then_rebuilt_when_a_split_changes(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, TRAIN, VALID, TEST)
    AWDLMDataModule(str(root), batch_size=1, eval_batch_size=1, bptt=2).setup()
    meta = root / "word_stream_cache" / "meta.json"
    written = meta.stat().st_mtime_ns
    dm = AWDLMDataModule(str(root), batch_size=1, eval_batch_size=1, bptt=2)
    dm.setup()
    assert meta.stat().st_mtime_ns == written and dm.vocab_size == 7
    (root / "train.txt").write_text(TRAIN + "a new line here\n")
    dm = AWDLMDataModule(str(root), batch_size=1, eval_batch_size=1, bptt=2)
    dm.setup()
    assert dm.vocab_size == 10 and dm.dictionary.symbols[-3:] == ("new", "line", "here")
    assert len(dm.splits["train"]) == 10 + 5


def test_rows_continue_across_training_batches(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, numbered(999), EVAL, EVAL)
    dm = AWDLMDataModule(str(root), vocab_size=1000, batch_size=4, bptt=10, bptt_std=3.0)
    dm.setup()
    batches = list(dm.train_dataloader())
    steps = 1000 // 4
    assert len(batches) > 15
    for inputs, targets in batches:
        assert inputs.dtype == targets.dtype == torch.int64 and inputs.shape == targets.shape
        assert inputs.shape[0] == 4 and inputs.is_contiguous() and targets.is_contiguous()
        assert torch.equal(targets, inputs + 1)  # id == position: the next token
    # row b of consecutive batches is column b of the official batchify: positions b*steps + t
    rows = torch.cat([inputs for inputs, _ in batches], dim=1)
    covered = rows.shape[1]
    assert covered in (steps - 2, steps - 1)
    expected = torch.arange(4)[:, None] * steps + torch.arange(covered)[None, :]
    assert torch.equal(rows, expected)


def test_bptt_lengths_follow_the_official_rule() -> None:
    rule = dict(bptt=70, short_prob=0.05, std=5.0, min_len=5, seed=1111)
    lengths = np.asarray(bptt_lengths(200_000, epoch=0, **rule))
    body = lengths[:-1]  # the last one is cut at the end of the stream
    assert lengths.sum() in (200_000 - 2, 200_000 - 1)
    assert body.min() >= 5 and body.max() < 70 + 6 * 5
    # mean of int(normal(base, 5)): 0.95 * 70 + 0.05 * 35 minus about 0.5 for the truncation
    assert abs(body.mean() - 67.75) < 0.5
    short = (body < 52).mean()  # a base of 35 lands below 52, a base of 70 above it
    assert abs(short - 0.05) < 0.01
    assert np.array_equal(lengths, bptt_lengths(200_000, epoch=0, **rule))
    assert not np.array_equal(lengths[:100], bptt_lengths(200_000, epoch=1, **rule)[:100])
    # without noise every window is bptt (or bptt / 2), the floor is bptt_min
    fixed = bptt_lengths(1000, bptt=70, short_prob=0.0, std=0.0, min_len=5, seed=0, epoch=0)
    assert fixed == [70] * 14 + [999 - 14 * 70]
    halves = bptt_lengths(1000, bptt=7, short_prob=1.0, std=0.0, min_len=5, seed=0, epoch=0)
    assert set(halves[:-1]) == {5}  # int(3.5) = 3, raised to bptt_min


def test_rounded_lengths_take_a_few_values_and_keep_the_mean() -> None:
    assert bptt_choices(70, 10, 5) == (30, 40, 50, 60, 70, 80)
    assert bptt_choices(35, 10, 5) == (10, 20, 30, 40)
    assert bptt_choices(4, 10, 5) == (10,)
    rule = dict(bptt=70, short_prob=0.05, std=5.0, min_len=5, seed=1111)
    official = np.asarray(bptt_lengths(200_000, epoch=0, **rule))[:-1]
    rounded = np.asarray(bptt_lengths(200_000, epoch=0, step=10, **rule))
    assert set(rounded.tolist()) <= {30, 40, 50, 60, 70, 80}
    assert 0 <= 200_000 - 1 - rounded.sum() < 80  # the window the end would cut is dropped
    # the same draws, each to the nearest multiple of 10 (the official truncates by up to 1)
    paired = min(len(official), len(rounded))
    assert (np.abs(rounded[:paired] - official[:paired]) <= 6).mean() > 0.99
    assert (rounded == 70).mean() == pytest.approx(0.65, abs=0.02)
    assert ((rounded == 60).mean(), (rounded == 80).mean()) == pytest.approx((0.15, 0.15), abs=0.02)
    assert rounded.mean() / official.mean() - 1 == pytest.approx(0.007, abs=0.005)
    assert np.array_equal(rounded, bptt_lengths(200_000, epoch=0, step=10, **rule))


def test_rounded_training_windows_and_padded_evaluation_windows(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, numbered(999), numbered(101), numbered(60))
    dm = AWDLMDataModule(
        str(root), vocab_size=1000, batch_size=4, eval_batch_size=3, bptt=20, bptt_step=10
    )
    dm.setup()
    batches = list(dm.train_dataloader())
    assert {inputs.shape for inputs, _ in batches} <= {(4, 10), (4, 20), (4, 30)}
    assert all(torch.equal(targets, inputs + 1) for inputs, targets in batches)
    rows = torch.cat([inputs for inputs, _ in batches], dim=1)  # columns continue across batches
    assert 250 - 1 - 30 < rows.shape[1] <= 250 - 1
    assert torch.equal(rows, torch.arange(4)[:, None] * 250 + torch.arange(rows.shape[1])[None, :])
    # evaluation: 102 // 3 = 34 steps, 33 targets in windows of 20, the last padded
    val = list(dm.val_dataloader())
    assert [inputs.shape for inputs, _ in val] == [(3, 20), (3, 20)]
    inputs, targets = val[-1]
    assert targets[:, 13:].eq(UNSCORED).all() and inputs[:, 13:].eq(0).all()
    scored = torch.cat([val[0][1], targets[:, :13]], dim=1)
    expected = batchify(np.asarray(dm.splits["val"]), 3)[:, 1:]  # w0 .. w100, <eos>
    assert torch.equal(scored, torch.from_numpy(expected).long())
    assert {inputs.shape for inputs, _ in dm.test_dataloader()} == {(1, 20)}


def test_a_padded_last_window_keeps_the_perplexity_exact(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, TRAIN * 40, TRAIN * 7 + VALID, TEST * 9)
    losses = {}
    for step in (None, 10):
        dm = AWDLMDataModule(str(root), batch_size=2, eval_batch_size=3, bptt=12, bptt_step=step)
        torch.manual_seed(0)
        net = AWDLanguageModel(dm.vocab_size, rnn="lstm", embedding_dim=8, hidden_size=8,
                               num_layers=1, dropout=0.0, dropout_hidden=0.0, dropout_input=0.0,
                               dropout_embedding=0.0, weight_drop=0.0)  # fmt: skip
        task = AWDLMTask(net, partial(torch.optim.SGD, lr=1.0), bptt=12)
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
        (result,) = trainer.validate(task, datamodule=dm, verbose=False)
        shapes = {inputs.shape for inputs, _ in dm.val_dataloader()}
        losses[step] = result["val/loss"], shapes
    (exact, shapes), (padded, padded_shapes) = losses[None], losses[10]
    assert len(shapes) == 2 and padded_shapes == {(3, 12)}  # one shape instead of two
    assert padded == pytest.approx(exact, rel=1e-6)


def test_epochs_draw_new_lengths_the_same_on_every_rank(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, numbered(1999), EVAL, EVAL)

    def shapes(rank: int, epoch: int) -> list[int]:
        dm = AWDLMDataModule(str(root), vocab_size=2000, batch_size=2, bptt=12)
        attach(dm, rank=rank, world=2, epoch=epoch)
        dm.setup()
        return [inputs.shape[1] for inputs, _ in dm.train_dataloader()]

    assert shapes(0, 0) == shapes(1, 0)
    assert shapes(0, 0) != shapes(0, 1)
    # each pass over one loader is the next epoch
    dm = AWDLMDataModule(str(root), vocab_size=2000, batch_size=2, bptt=12)
    attach(dm, world=2, epoch=0)
    dm.setup()
    loader = dm.train_dataloader()
    first = [inputs.shape[1] for inputs, _ in loader]
    second = [inputs.shape[1] for inputs, _ in loader]
    assert first == shapes(0, 0) and second == shapes(0, 1)


def test_ddp_ranks_take_their_columns_of_the_whole_batch(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, numbered(1199), EVAL, EVAL)
    stream = np.arange(1200)
    rows = {}
    for rank in (0, 1):
        dm = AWDLMDataModule(str(root), vocab_size=1200, batch_size=3, bptt=10)
        attach(dm, rank=rank, world=2)
        dm.setup()
        rows[rank] = torch.cat([inputs for inputs, _ in dm.train_dataloader()], dim=1)
    whole = batchify(stream, 6)  # (6, 200): the official batchify with 2 x 3 columns
    assert rows[0].shape[0] == rows[1].shape[0] == 3
    covered = rows[0].shape[1]
    assert np.array_equal(rows[0].numpy(), whole[:3, :covered])
    assert np.array_equal(rows[1].numpy(), whole[3:, :covered])
    # evaluation is not split: every process sees the whole validation stream
    val_rank1 = list(dm.val_dataloader())
    attach(dm, rank=0, world=1)
    val_alone = list(dm.val_dataloader())
    assert len(val_rank1) == len(val_alone) == 2  # 150 tokens: 10 columns of 15; windows 10, 4
    assert all(torch.equal(a[1], b[1]) for a, b in zip(val_rank1, val_alone))


def test_evaluation_windows_score_every_token_once(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, numbered(101), numbered(101), numbered(60))
    dm = AWDLMDataModule(str(root), batch_size=2, eval_batch_size=3, test_batch_size=1, bptt=8)
    dm.setup()
    loader = dm.val_dataloader()
    batches = list(loader)
    assert len(loader) == len(batches) == 5  # 102 // 3 = 34 steps: 33 targets in windows of 8
    assert [inputs.shape for inputs, _ in batches] == [(3, 8)] * 4 + [(3, 1)]
    targets = torch.cat([t for _, t in batches], dim=1)
    assert targets.numel() == 3 * 33
    assert torch.equal(targets, torch.from_numpy(batchify(np.arange(102), 3)[:, 1:]).long())
    # one column: every token of w0 .. w59 <eos> but the first (<eos> is id 101)
    test = torch.cat([t for _, t in dm.test_dataloader()], dim=1)
    assert test.tolist() == [[*range(1, 60), 101]]


def test_missing_files_name_the_root_the_layout_and_the_sources(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text(TRAIN)
    with pytest.raises(FileNotFoundError) as error:
        AWDLMDataModule(str(tmp_path))
    message = str(error.value)
    assert f"not found under {tmp_path}: missing valid.txt, test.txt" in message
    assert "simple-examples.tgz" in message and "wikitext-2-v1.zip" in message
    assert "renamed to train.txt, valid.txt, test.txt" in message


def test_an_empty_split_is_named(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, TRAIN, "\n\n", TEST)
    dm = AWDLMDataModule(str(root), vocab_size=7, batch_size=1, bptt=2)
    with pytest.raises(ValueError, match=r"valid.txt holds no words \(an empty split file"):
        dm.setup()


def test_unknown_words_become_unk_and_are_counted(tmp_path: Path, caplog) -> None:
    root = write_corpus(tmp_path, TRAIN, "the zebra zebra\n", "a yak\n")
    dm = AWDLMDataModule(str(root), batch_size=1, eval_batch_size=1, bptt=2)
    with caplog.at_level(logging.WARNING):
        dm.setup()
    assert np.asarray(dm.splits["val"]).tolist() == [0, 6, 6, 3]
    assert "valid.txt: 2 tokens (1 distinct words) outside the training vocabulary" in caplog.text
    assert "test.txt: 1 tokens (1 distinct words)" in caplog.text


def test_unknown_words_without_unk_are_listed(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, "the cat sat\n", "the zebra yak zebra\n", "the cat\n")
    dm = AWDLMDataModule(str(root), batch_size=1, eval_batch_size=1, bptt=2)
    pattern = (
        r"valid.txt: 3 tokens \(2 distinct words\) are not in the training vocabulary, which has "
        r"no <unk>.*\['zebra', 'yak'\]"
    )
    with pytest.raises(ValueError, match=pattern):
        dm.setup()


def test_a_stream_too_short_names_the_sizes_and_what_to_lower(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, numbered(99), numbered(9), numbered(9))
    dm = AWDLMDataModule(str(root), batch_size=4, eval_batch_size=2, bptt=30)
    attach(dm, world=2)
    pattern = (
        r"training split has 100 tokens: 2 process\(es\) x batch_size 4 = 8 columns of 12 tokens, "
        r"fewer than bptt \+ 1 = 31; lower data.batch_size or data.bptt"
    )
    with pytest.raises(ValueError, match=pattern):
        dm.setup()
    dm = AWDLMDataModule(str(root), batch_size=1, eval_batch_size=6, bptt=30)
    pattern = r"val split has 10 tokens: eval_batch_size 6 columns of 1 tokens, fewer than the 2"
    with pytest.raises(ValueError, match=pattern):
        dm.setup()


def test_a_different_vocabulary_size_is_refused_with_the_fix(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, TRAIN, VALID, TEST)
    dm = AWDLMDataModule(str(root), vocab_size=10000, batch_size=1, eval_batch_size=1, bptt=2)
    with pytest.raises(
        ValueError,
        match="has 7 distinct words .* but data.vocab_size is 10000; "
        "set data.vocab_size=7, or null",
    ):
        dm.prepare_data()
    AWDLMDataModule(str(root), batch_size=1, eval_batch_size=1, bptt=2).setup()  # cached
    dm = AWDLMDataModule(str(root), vocab_size=8, batch_size=1, eval_batch_size=1, bptt=2)
    with pytest.raises(ValueError, match="data.vocab_size is 8"):
        dm.setup()


def test_example_input_reads_no_data(tmp_path: Path) -> None:
    dm = AWDLMDataModule(str(tmp_path / "absent"), vocab_size=10000, bptt=70)
    example = dm.example_input(3)
    assert example.shape == (3, 70) and example.dtype == torch.int64
    assert dm.example_input().shape == (1, 70)


def test_loader_workers_keep_the_order(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, numbered(599), numbered(299), numbered(99))
    batches = {}
    for workers in (0, 2):
        dm = AWDLMDataModule(
            str(root), batch_size=2, eval_batch_size=3, bptt=10, num_workers=workers
        )
        dm.setup()
        train = dm.train_dataloader()
        batches[workers] = [list(train), list(train), list(dm.val_dataloader())]
    for got, expected in zip(batches[2], batches[0]):
        assert len(got) == len(expected)
        for (inputs, targets), (inputs0, targets0) in zip(got, expected):
            assert torch.equal(inputs, inputs0) and torch.equal(targets, targets0)


def test_vocabulary_rejects_repeated_words() -> None:
    with pytest.raises(ValueError, match="repeated: \\['a'\\]"):
        Vocabulary(["a", "b", "a"])
    assert Vocabulary.from_lines([["b", "a"], ["a", "c"]]).symbols == ("b", "a", "<eos>", "c")


def test_ptb_style_lowercases_numbers_and_drops_punctuation() -> None:
    assert ptb_style("The 3.14 x-ray, it's 1,000 (sys.path)!") == [
        "the",
        "N",
        "x",
        "ray",
        "it's",
        "N",
        "sys",
        "path",
    ]


def test_pydoc_ptb_corpus_builds_offline(tmp_path: Path) -> None:
    dm = PydocPTBDataModule(str(tmp_path), bptt=35)
    dm.setup()
    lengths = {split: len(ids) for split, ids in dm.splits.items()}
    assert 40_000 < lengths["train"] < 90_000
    assert 4_000 < lengths["val"] < 12_000 and 4_000 < lengths["test"] < 12_000
    assert dm.vocab_size == len(dm.dictionary) and 1_000 < dm.vocab_size < 3_000
    assert "<unk>" in dm.dictionary.indices and "N" in dm.dictionary.indices
    words = (tmp_path / "train.txt").read_text().split()
    assert all(w == w.lower() or w == "N" for w in words) and "," not in words
    # the files are written once, then reused
    written = (tmp_path / "train.txt").stat().st_mtime_ns
    PydocPTBDataModule(str(tmp_path)).setup()
    assert (tmp_path / "train.txt").stat().st_mtime_ns == written
    inputs, targets = next(iter(dm.val_dataloader()))
    assert inputs.shape == targets.shape == (10, 35)


class RecordLengths(L.LightningModule):
    """Records the window length of every training batch, by epoch; learns one scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.lengths: dict[int, list[int]] = {}
        self.val_batches = 0

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        inputs, targets = batch
        self.lengths.setdefault(self.current_epoch, []).append(inputs.shape[1])
        return self.weight * targets.float().mean()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        self.val_batches += 1

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_draws_each_epochs_lengths_and_validates_at_its_end(tmp_path: Path) -> None:
    root = write_corpus(tmp_path / "data", numbered(999), EVAL, EVAL)
    dm = AWDLMDataModule(str(root), batch_size=4, eval_batch_size=2, bptt=10, seed=7)
    module = RecordLengths()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=dm)
    rule = dict(bptt=10, short_prob=0.05, std=5.0, min_len=5, seed=7)
    for epoch in (0, 1):
        assert module.lengths[epoch] == bptt_lengths(1000 // 4, epoch=epoch, **rule)
    assert module.lengths[0] != module.lengths[1]
    assert module.val_batches == 2 * 8  # 150 tokens: 2 columns of 75, 74 targets in windows of 10


def test_a_latin1_corpus_is_named_and_read_in_its_encoding(tmp_path: Path) -> None:
    root = write_corpus(tmp_path, TRAIN, VALID, TEST)
    offset = write_latin1(root / "train.txt", ["the cat sat", "a dog <unk> sat", "the grün cat"])
    with pytest.raises(TextEncodingError) as error:
        AWDLMDataModule(str(root), batch_size=1, eval_batch_size=1, bptt=2)
    check_message(str(error.value), root / "train.txt", offset)
    dm = AWDLMDataModule(str(root), batch_size=1, eval_batch_size=1, bptt=2, encoding="latin-1")
    dm.setup()
    assert dm.dictionary.decode(np.asarray(dm.splits["train"])[-4:-1].tolist()) == "the grün cat"
    # the cache is of the Latin-1 reading: read as UTF-8, the files are decoded again (and fail)
    again = AWDLMDataModule(
        str(root), vocab_size=dm.vocab_size, batch_size=1, eval_batch_size=1, bptt=2
    )
    with pytest.raises(TextEncodingError, match="line 3 does not decode as utf-8"):
        again.setup()
