"""Character-level corpora: real file formats (raw bytes, zip), splits, vocabulary, cache,
ordering."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import src.datamodules.char_lm
from src.build import build_task
from src.datamodules.char_lm import (
    Enwik8DataModule,
    OrderedSegments,
    PydocCharsDataModule,
    Text8DataModule,
    pydoc_corpus,
)
from tests.conftest import compose_config

SMALL = {"tgt_len": 8, "batch_size": 2, "eval_tgt_len": 4, "eval_batch_size": 1}


def enwik8_bytes() -> bytes:
    """A tiny enwik8-like file: XML-ish text with newlines and non-ASCII UTF-8 bytes."""
    text = "<page>\n  <title>Ärger</title>\n  <text>Zürich is a city.</text>\n</page>\n" * 40
    return text.encode("utf-8")


def prepared(module):
    module.prepare_data()
    module.setup("fit")
    return module


def test_enwik8_raw_file_split_and_vocabulary(tmp_path: Path) -> None:
    data = enwik8_bytes()
    (tmp_path / "enwik8").write_bytes(data)
    dm = prepared(Enwik8DataModule(str(tmp_path), valid_size=300, test_size=200, **SMALL))
    raw = np.frombuffer(data, dtype=np.uint8)
    expected = {"train": raw[:-500], "val": raw[-500:-200], "test": raw[-200:]}
    symbols = np.array(dm.symbols)
    assert ord("\n") not in dm.symbols and len(dm.symbols) <= 204
    for split, codes in expected.items():
        ids = np.asarray(dm.splits[split])
        np.testing.assert_array_equal(symbols[ids], codes[codes != ord("\n")])  # newline dropped
    assert (tmp_path / "enwik8.train.npy").is_file() and isinstance(dm.splits["train"], np.memmap)


def test_enwik8_zip_matches_raw_and_cache_is_reused(tmp_path: Path) -> None:
    data = enwik8_bytes()
    raw_dir, zip_dir = tmp_path / "raw", tmp_path / "zip"
    raw_dir.mkdir(), zip_dir.mkdir()
    (raw_dir / "enwik8").write_bytes(data)
    with zipfile.ZipFile(zip_dir / "enwik8.zip", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("enwik8", data)
    a = prepared(Enwik8DataModule(str(raw_dir), valid_size=300, test_size=200, **SMALL))
    b = prepared(Enwik8DataModule(str(zip_dir), valid_size=300, test_size=200, **SMALL))
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(a.splits[split], b.splits[split])
    stamp = (zip_dir / "enwik8.train.npy").stat().st_mtime_ns
    again = prepared(Enwik8DataModule(str(zip_dir), valid_size=300, test_size=200, **SMALL))
    assert (zip_dir / "enwik8.train.npy").stat().st_mtime_ns == stamp  # not rebuilt
    assert again.symbols == b.symbols
    prepared(
        Enwik8DataModule(str(zip_dir), valid_size=250, test_size=200, **SMALL)
    )  # new split: rebuilt
    assert len(np.load(zip_dir / "enwik8.val.npy")) < len(b.splits["val"])


def test_text8_has_27_symbols(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    text = bytes(rng.choice(np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", np.uint8), 3000))
    (tmp_path / "text8").write_bytes(text)
    dm = prepared(Text8DataModule(str(tmp_path), valid_size=200, test_size=200, **SMALL))
    assert dm.vocab_size == 27 and len(dm.symbols) == 27
    assert len(dm.splits["train"]) == 2600


def test_missing_file_names_path_and_expected_file(tmp_path: Path) -> None:
    dm = Enwik8DataModule(str(tmp_path / "nowhere"), **SMALL)
    with pytest.raises(FileNotFoundError, match=r"nowhere/enwik8.*nowhere/enwik8\.zip"):
        dm.prepare_data()


def test_too_small_vocab_is_refused(tmp_path: Path) -> None:
    (tmp_path / "text8").write_bytes(b"abc def " * 100)
    with pytest.raises(ValueError, match="vocab_size=7"):
        Text8DataModule(
            str(tmp_path), vocab_size=5, valid_size=50, test_size=50, **SMALL
        ).prepare_data()


def test_pydoc_chars_offline(tmp_path: Path) -> None:
    dm = prepared(PydocCharsDataModule(str(tmp_path), **SMALL))
    n = len(pydoc_corpus())
    sizes = {s: len(a) for s, a in dm.splits.items()}
    assert sum(sizes.values()) == n and sizes["val"] == sizes["test"] == round(0.05 * n)
    assert len(dm.symbols) <= dm.vocab_size
    text = "".join(chr(dm.symbols[i]) for i in dm.splits["val"][:200])
    assert text == pydoc_corpus()[sizes["train"] : sizes["train"] + 200]
    assert (
        dm.example_input(3).shape == (3, SMALL["tgt_len"])
        and dm.example_input().dtype == torch.long
    )


def test_pydoc_vocabulary_is_the_corpus_symbol_count(tmp_path: Path) -> None:
    dm = prepared(PydocCharsDataModule(str(tmp_path), **SMALL))
    assert dm.vocab_size == len(dm.symbols) == len(set(pydoc_corpus()))
    with pytest.raises(ValueError, match=f"set data.vocab_size={dm.vocab_size}"):
        short = PydocCharsDataModule(str(tmp_path / "short"), vocab_size=dm.vocab_size - 1, **SMALL)
        short.prepare_data()


# a small network, so that building it is quick
SMALL_NET = [
    "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_inner=64", "model.mem_len=8"
]  # fmt: skip


@pytest.mark.parametrize("experiment", ["char_lm/demo", "char_lm/demo_txl"])
def test_a_corpus_with_one_more_symbol_gets_a_vocabulary_one_larger(
    experiment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the text to the model's logits: the topics text of another Python version, here with a
    character no version's text has, composes, builds and trains over its own vocabulary."""
    corpus = pydoc_corpus()
    count = len(set(corpus))
    extra = "\N{SNOWMAN}"
    assert extra not in corpus
    for text, expected in [(corpus, count), (corpus + extra, count + 1)]:
        monkeypatch.setattr(src.datamodules.char_lm, "pydoc_corpus", lambda text=text: text)
        root = tmp_path / str(expected)
        overrides = [f"experiment={experiment}", *SMALL_NET, f"data.root={root / 'data'}"]
        cfg = compose_config("train", overrides, root / "run")
        datamodule, task = build_task(cfg)
        assert datamodule.vocab_size == cfg.data.vocab_size == expected
        datamodule.setup("fit")
        assert len(datamodule.symbols) == expected
        assert (ord(extra) in datamodule.symbols) == (extra in text)
        inputs, _ = next(iter(datamodule.train_dataloader()))
        logits, _ = task(inputs)  # (B, T, V)
        assert logits.shape == (*inputs.shape, expected)


def test_segments_are_contiguous_sub_streams_in_order() -> None:
    tokens = np.arange(103)
    stream = OrderedSegments(tokens, batch_size=4, tgt_len=7)
    batches = list(stream)
    assert len(batches) == len(stream) == 4  # 25 columns -> 24 targets -> 7, 7, 7, 3
    inputs = torch.cat([x for x, _ in batches], dim=1)
    targets = torch.cat([y for _, y in batches], dim=1)
    rows = torch.arange(100).view(4, 25)  # row b = the b-th contiguous quarter
    assert torch.equal(inputs, rows[:, :-1]) and torch.equal(targets, rows[:, 1:])
    assert [x.shape[1] for x, _ in batches] == [7, 7, 7, 3]


def test_ranks_get_their_own_contiguous_slices() -> None:
    tokens = np.arange(100)
    per_rank = [
        torch.cat([x for x, _ in OrderedSegments(tokens, 2, 5, rank=r, world_size=2)], 1)
        for r in (0, 1)
    ]
    assert torch.equal(per_rank[0][0, :3], torch.tensor([0, 1, 2]))
    assert torch.equal(per_rank[1][0, :3], torch.tensor([50, 51, 52]))
    assert per_rank[0].shape == per_rank[1].shape  # equal lengths: ranks step together


def test_eval_loaders_use_eval_lengths(tmp_path: Path) -> None:
    dm = prepared(PydocCharsDataModule(str(tmp_path), **SMALL))
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == y.shape == (SMALL["eval_batch_size"], SMALL["eval_tgt_len"])
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (SMALL["batch_size"], SMALL["tgt_len"]) and x.dtype == torch.long
