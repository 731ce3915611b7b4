"""Parallel corpora: fairseq dictionaries, gettext catalogues, token-count batches and every bad
input the loader refuses or reports."""

from __future__ import annotations

import json
import logging
import struct
import zlib
from pathlib import Path

import pytest
import torch

from src.datamodules import translation as translation_module
from src.datamodules.dictionary import EOS_ID, PAD_ID, UNK_ID, Dictionary
from src.datamodules.gettext_catalogs import CatalogueEntry, find_catalogues, read_catalogue
from src.datamodules.subword import DictionaryCodec, remove_bpe
from src.datamodules.text_files import TextEncodingError
from src.datamodules.translation import (
    CorpusError,
    GettextTranslationDataModule,
    ParallelSplit,
    TokenBatches,
    TranslationDataModule,
    batch_by_tokens,
    collate,
    count_lines,
    read_parallel,
)
from tests.datamodules.test_text_files import check_message, write_latin1

HEADER = "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n != 1);\n"


def write_mo(path: Path, messages: dict[str, str]) -> None:
    """A GNU ``.mo`` catalogue of ``messages`` (keys and values as msgfmt stores them)."""
    messages = {"": HEADER, **messages}
    keys = sorted(messages)
    ids = [k.encode() for k in keys]
    strs = [messages[k].encode() for k in keys]
    n = len(keys)
    key_table, value_table = 28, 28 + 8 * n
    offset = 28 + 16 * n
    key_entries, value_entries, blob = [], [], b""
    for data, entries in ((ids, key_entries), (strs, value_entries)):
        for item in data:
            entries.append((len(item), offset + len(blob)))
            blob += item + b"\0"
    head = struct.pack("<7I", 0x950412DE, 0, n, key_table, value_table, 0, 0)
    tables = b"".join(struct.pack("<2I", *e) for e in key_entries + value_entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + tables + blob)


def write_corpus(
    root: Path, pairs: dict[str, tuple[list[str], list[str]]], src: str = "de", tgt: str = "en"
) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for split, (source, target) in pairs.items():
        (root / f"{split}.{src}").write_text("".join(f"{s}\n" for s in source))
        (root / f"{split}.{tgt}").write_text("".join(f"{t}\n" for t in target))


TRAIN = (
    ["das haus", "ein kleines haus", "das au@@ to", "ein auto"],
    ["the house", "a small house", "the car", "a car"],
)


def small_corpus(root: Path) -> None:
    write_corpus(
        root,
        {
            "train": TRAIN,
            "valid": (["das haus"], ["the house"]),
            "test": (["ein au@@ to"], ["a car"]),
        },
    )


# -- dictionary and codecs --------------------------------------------------------------------
def test_dictionary_orders_like_fairseq_and_pads_to_eight(tmp_path) -> None:
    d = Dictionary.build(["b a c a", "c a"])
    # specials, then by count (a 3, c 2, b 1), then fillers up to a multiple of 8
    assert d.symbols[:7] == ("<s>", "<pad>", "</s>", "<unk>", "a", "c", "b")
    assert len(d) == 8 and d.symbols[7] == "madeupword0000"
    assert Dictionary.build(["x y"]).symbols[4:6] == ("x", "y")  # ties alphabetical
    assert Dictionary.build(["x y y z"], threshold=2).symbols[4] == "y"
    assert d.encode(["a", "zzz"]) == [4, UNK_ID]
    assert d.decode([4, EOS_ID, PAD_ID, 6]) == ["a", "b"]
    d.save(tmp_path / "dict.txt")
    assert Dictionary.load(tmp_path / "dict.txt").symbols == d.symbols
    (tmp_path / "bad.txt").write_text("a 3\nnocount\n")
    with pytest.raises(ValueError, match="bad.txt:2"):
        Dictionary.load(tmp_path / "bad.txt")


def test_bpe_codec_removes_markers() -> None:
    codec = DictionaryCodec(Dictionary.build(["das au@@ to"]))
    assert codec.decode(codec.encode("das au@@ to") + [EOS_ID]) == "das auto"
    assert remove_bpe("Ge@@ schich@@ te .") == "Geschichte ."


# -- gettext catalogues -----------------------------------------------------------------------
def test_catalogue_keeps_translated_singular_messages(tmp_path) -> None:
    path = tmp_path / "pkg" / "locale" / "de" / "LC_MESSAGES" / "app.mo"
    write_mo(
        path,
        {
            "Save": "Sichern",
            "menu\x04Open": "Öffnen",  # with msgctxt
            "%d file\x00%d files": "%d Datei\x00%d Dateien",  # plural
            "Django": "Django",  # kept as it is: no translation
        },
    )
    entries = read_catalogue(path)
    assert [(e.source, e.translation) for e in entries] == [
        ("%d file", "%d Datei"),
        ("Open", "Öffnen"),
        ("Save", "Sichern"),
    ]
    assert find_catalogues("de", [tmp_path]) == [path.resolve()]
    assert find_catalogues("fr", [tmp_path]) == []
    (tmp_path / "broken.mo").write_bytes(b"not a catalogue")
    with pytest.raises(ValueError, match="broken.mo"):
        read_catalogue(tmp_path / "broken.mo")


def test_catalogues_of_packages_imported_from_outside_site_packages(tmp_path, monkeypatch) -> None:
    """A catalogue package installed with ``pip install --target`` (on PYTHONPATH) is found."""
    from src.datamodules import gettext_catalogs

    path = tmp_path / "target" / "catalogpkg" / "locale" / "de" / "LC_MESSAGES" / "app.mo"
    write_mo(path, {"Save": "Sichern"})
    (tmp_path / "target" / "catalogpkg" / "__init__.py").write_text("")
    assert path.resolve() not in find_catalogues("de")
    monkeypatch.syspath_prepend(str(tmp_path / "target"))
    monkeypatch.setattr(gettext_catalogs, "CATALOGUE_PACKAGES", ("catalogpkg",))
    assert path.resolve() in find_catalogues("de")


def test_installed_catalogues_give_a_real_corpus() -> None:
    django = pytest.importorskip("django")
    german = [p for p in find_catalogues("de") if Path(django.__file__).parent in p.parents]
    assert len(german) >= 10  # conf and the contrib apps
    pairs = [e for p in german for e in read_catalogue(p)]
    assert len(pairs) > 500
    assert ("Hungarian", "Ungarisch") in {(e.source, e.translation) for e in pairs}


def test_gettext_corpus_splits_by_message(tmp_path, monkeypatch) -> None:
    messages = [CatalogueEntry(f"message {i}", f"Nachricht {i}", "x.mo") for i in range(400)]
    monkeypatch.setattr(translation_module, "parallel_messages", lambda language: iter(messages))
    dm = GettextTranslationDataModule(
        str(tmp_path / "gt"), sentencepiece_vocab_size=60, max_tokens=64
    )
    assert dm.src_vocab_size == dm.tgt_vocab_size == 60  # the joint SentencePiece model's pieces
    dm.setup()
    sizes = {split: len(dm.splits[split]) for split in ("train", "valid", "test")}
    assert sum(sizes.values()) == 400 and 5 <= sizes["valid"] <= 40 and 5 <= sizes["test"] <= 40
    english = {
        split: set((tmp_path / "gt" / f"{split}.en").read_text().splitlines()) for split in sizes
    }
    assert not (english["train"] & english["test"]) and not (english["valid"] & english["test"])
    # the reference is the raw English text; decoding a target gives it back
    split = dm.splits["test"]
    assert dm.decode(split.target[0].tolist()) == split.references[0]
    assert (
        split.source[0][-1] == EOS_ID
        and dm.encode_source(dm_source(tmp_path, 0)).tolist() == split.source[0].tolist()
    )
    monkeypatch.setattr(translation_module, "parallel_messages", lambda language: iter([]))
    with pytest.raises(CorpusError, match="no gettext catalogue for language 'xx'"):
        GettextTranslationDataModule(str(tmp_path / "none"), language="xx").setup()


def dm_source(tmp_path: Path, line: int) -> str:
    return (tmp_path / "gt" / "test.de").read_text().splitlines()[line]


def test_gettext_files_are_a_cache_keyed_on_the_split(tmp_path, monkeypatch, caplog) -> None:
    """Another split in the same root writes the corpus again (and so trains another
    SentencePiece model); going back finds the first split's model; a root written before the
    split was recorded is written again."""
    messages = [CatalogueEntry(f"message {i}", f"Nachricht {i}", "x.mo") for i in range(400)]
    monkeypatch.setattr(translation_module, "parallel_messages", lambda language: iter(messages))
    root = tmp_path / "gt"

    def built(test_percent: int) -> GettextTranslationDataModule:
        dm = GettextTranslationDataModule(
            str(root), test_percent=test_percent, sentencepiece_vocab_size=60, max_tokens=64
        )
        dm.setup()
        return dm

    def sizes(dm: GettextTranslationDataModule) -> tuple[int, int, int]:
        return tuple(len(dm.splits[s]) for s in ("train", "valid", "test"))

    five = built(5)
    model = five.codecs["source"].model_file
    assert json.loads((root / "split.de.json").read_text()) == {
        "test_percent": 5,
        "valid_percent": 5,
    }
    with caplog.at_level(logging.WARNING, logger=translation_module.__name__):
        fifteen = built(15)
    assert "writing it again for {'valid_percent': 5, 'test_percent': 15}" in caplog.text
    bucket = lambda m: zlib.crc32(m.encode()) % 100  # noqa: E731
    expected = {
        "valid": sum(bucket(e.source) < 5 for e in messages),
        "test": sum(5 <= bucket(e.source) < 20 for e in messages),
    }
    assert sizes(fifteen) == (400 - sum(expected.values()), expected["valid"], expected["test"])
    assert sizes(fifteen)[2] > 2 * sizes(five)[2]
    assert len((root / "test.en").read_text().splitlines()) == expected["test"]
    assert fifteen.codecs["source"].model_file != model  # trained on the new training split
    again = built(5)
    assert sizes(again) == sizes(five) and again.codecs["source"].model_file == model
    # a root from before the record: its files are taken for unknown and written again
    (root / "split.de.json").unlink()
    (root / "test.en").write_text("stale\n")
    (root / "test.de").write_text("veraltet\n")
    assert sizes(built(15)) == sizes(fifteen)


# -- batches ----------------------------------------------------------------------------------
def test_batches_respect_max_tokens_and_cover_every_pair_once() -> None:
    lengths = [3, 9, 4, 4, 12, 7, 2, 5, 5, 30]
    batches = batch_by_tokens(lengths, sorted(range(10), key=lambda i: lengths[i]), max_tokens=16)
    assert sorted(i for b in batches for i in b) == list(range(10))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 16 or len(batch) == 1
    assert [9] in batches  # longer than max_tokens: alone


def toy_split(n: int = 40) -> ParallelSplit:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 9, (n, 2), generator=generator).tolist()
    source = [torch.arange(4, 4 + s) for s, _ in lengths]
    target = [torch.cat((torch.arange(5, 4 + t), torch.tensor([EOS_ID]))) for _, t in lengths]
    return ParallelSplit(source, target, [f"ref {i}" for i in range(n)], list(range(1, n + 1)))


def test_training_batches_shuffle_per_epoch_and_shard_evenly() -> None:
    split = toy_split()
    epoch = {"value": 0}
    batches = TokenBatches(split, 24, shuffle=True, epoch=lambda: epoch["value"])
    first = [b["id"].tolist() for b in batches]
    epoch["value"] = 1
    second = [b["id"].tolist() for b in batches]
    assert first != second and sorted(map(sorted, first)) != [] and len(first) == len(batches)
    assert sorted(i for b in first for i in b) == list(range(40))
    ranks = [
        TokenBatches(split, 24, shuffle=True, rank=r, world_size=3).batches(0) for r in range(3)
    ]
    assert len({len(r) for r in ranks}) == 1  # every process takes the same number of steps
    seen = [i for r in ranks for b in r for i in b]
    assert len(seen) == len(set(seen))
    evaluation = [
        TokenBatches(split, 24, shuffle=False, rank=r, world_size=3).batches(0) for r in range(3)
    ]
    assert sorted(i for r in evaluation for b in r for i in b) == list(range(40))  # nothing dropped


def test_collate_shifts_the_target_behind_eos() -> None:
    split = ParallelSplit(
        [torch.tensor([7, 8, EOS_ID]), torch.tensor([9, EOS_ID])],
        [torch.tensor([5, EOS_ID]), torch.tensor([4, 6, 5, EOS_ID])],
        ["a", "b"],
        [1, 2],
    )
    batch = collate(split, [0, 1])
    assert batch["src_tokens"].tolist() == [[7, 8, EOS_ID], [9, EOS_ID, PAD_ID]]
    assert batch["target"].tolist() == [[5, EOS_ID, PAD_ID, PAD_ID], [4, 6, 5, EOS_ID]]
    assert batch["prev_output_tokens"].tolist() == [[EOS_ID, 5, PAD_ID, PAD_ID], [EOS_ID, 4, 6, 5]]
    assert batch["references"] == ["a", "b"] and batch["id"].tolist() == [0, 1]


# -- files and bad input ----------------------------------------------------------------------
def test_bpe_corpus_loads_with_built_dictionaries(tmp_path) -> None:
    small_corpus(tmp_path)
    dm = TranslationDataModule(str(tmp_path), "de", "en", max_tokens=32)
    # specials + de {das haus ein kleines au@@ to auto} = 11, en {the house a small car} = 9: both
    # padded to 16
    assert (dm.src_vocab_size, dm.tgt_vocab_size) == (16, 16)
    dm.setup()
    assert dm.splits["test"].references == ["a car"]
    assert dm.tokenized
    batch = next(iter(dm.train_dataloader()))
    assert batch["src_tokens"].shape[0] >= 1
    joined = TranslationDataModule(str(tmp_path), "de", "en", joined_dictionary=True)
    codecs = joined.load_codecs()
    assert (
        codecs["source"].dictionary is codecs["target"].dictionary
        and len(codecs["source"].dictionary.indices) == 16
    )  # 4 + 7 + 5
    Dictionary(["haus", "das"]).save(tmp_path / "dict.de.txt")
    Dictionary(["house", "the"]).save(tmp_path / "dict.en.txt")
    read = TranslationDataModule(str(tmp_path), "de", "en")
    assert read.src_vocab_size == 6 and read.load_codecs()["source"].dictionary.symbols[4] == "haus"


def test_missing_data_names_the_layout(tmp_path) -> None:
    with pytest.raises(
        CorpusError, match=r"nowhere does not exist.*train\.de, train\.en.*data\.root"
    ):
        TranslationDataModule(str(tmp_path / "nowhere"), "de", "en").prepare_data()
    small_corpus(tmp_path)
    (tmp_path / "test.en").unlink()
    with pytest.raises(CorpusError, match=r"missing .*test\.en"):
        TranslationDataModule(str(tmp_path), "de", "en").setup()


def test_unknown_language_pair_lists_the_corpus_languages(tmp_path) -> None:
    small_corpus(tmp_path)
    with pytest.raises(CorpusError, match=r"no fr-en corpus: .* languages de, en"):
        TranslationDataModule(str(tmp_path), "fr", "en").setup()


def test_misaligned_files_are_refused(tmp_path) -> None:
    small_corpus(tmp_path)
    (tmp_path / "train.en").write_text("the house\na small house\nthe car\n")
    with pytest.raises(CorpusError, match=r"train\.de has 4 lines but .*train\.en has 3"):
        TranslationDataModule(str(tmp_path), "de", "en").setup()


def test_misaligned_files_are_refused_before_the_vocabulary_is_counted(tmp_path) -> None:
    # a configured vocabulary size that the misaligned files would not give: the line counts,
    # which the user can act on, come first
    small_corpus(tmp_path)
    (tmp_path / "valid.de").write_text("das haus\nein auto")  # no final line feed: still 2 lines
    (tmp_path / "valid.en").write_text("the house\n")
    dm = TranslationDataModule(str(tmp_path), "de", "en", src_vocab_size=8848)
    with pytest.raises(CorpusError, match=r"valid\.de has 2 lines but .*valid\.en has 1"):
        dm.setup()


def test_count_lines_counts_a_last_line_without_a_line_feed(tmp_path) -> None:
    for text, lines in (("", 0), ("a", 1), ("a\n", 1), ("a\nb", 2), ("\n\n", 2)):
        (tmp_path / "f").write_text(text)
        assert count_lines(tmp_path / "f") == lines == len(text.splitlines())


def test_empty_lines_are_dropped_and_counted(tmp_path, caplog) -> None:
    write_corpus(
        tmp_path,
        {
            "train": (["das haus", "", "ein auto"], ["the house", "a car", ""]),
            "valid": TRAIN,
            "test": TRAIN,
        },
    )
    dm = TranslationDataModule(str(tmp_path), "de", "en")
    with caplog.at_level(logging.WARNING):
        dm.setup()
    assert len(dm.splits["train"]) == 1
    assert "dropped 2 of 3 pairs with an empty side (lines 2, 3)" in caplog.text


def test_too_long_pairs_are_dropped_in_training_and_refused_in_test(tmp_path, caplog) -> None:
    small_corpus(tmp_path)
    dm = TranslationDataModule(
        str(tmp_path), "de", "en", max_source_positions=3, max_target_positions=3
    )
    with caplog.at_level(logging.WARNING):
        with pytest.raises(
            CorpusError, match=r"test\.de:1: a pair of 4 source / 3 target tokens exceeds"
        ):
            dm.setup()
    # "ein kleines haus" + eos and "das au@@ to" + eos are 4 tokens: dropped, counted
    assert (
        "dropped 2 of 4 training pairs longer than 3 source / 3 target tokens (lines 2, 3)"
        in caplog.text
    )


def test_configured_vocabulary_size_must_match(tmp_path) -> None:
    small_corpus(tmp_path)
    dm = TranslationDataModule(str(tmp_path), "de", "en", src_vocab_size=8848)
    assert dm.src_vocab_size == 8848  # taken from the config: nothing is read to build the model
    with pytest.raises(
        CorpusError,
        match=r"data\.src_vocab_size is 8848 but .* has 16 entries; set data\.src_vocab_size=16",
    ):
        dm.setup()


# -- encodings --------------------------------------------------------------------------------
def test_a_latin1_corpus_is_named_and_read_in_its_encoding(tmp_path) -> None:
    small_corpus(tmp_path)
    source = tmp_path / "train.de"
    offset = write_latin1(source, ["das haus", "ein kleines haus", "das grüne au@@ to", "ein auto"])
    with pytest.raises(TextEncodingError) as error:
        TranslationDataModule(str(tmp_path), "de", "en").setup()
    check_message(str(error.value), source, offset)
    with pytest.raises(TextEncodingError) as error:
        read_parallel(source, tmp_path / "train.en")
    check_message(str(error.value), source, offset)
    src, tgt, _ = read_parallel(source, tmp_path / "train.en", "latin-1")
    assert src[2] == "das grüne au@@ to" and tgt[2] == "the car"
    dm = TranslationDataModule(str(tmp_path), "de", "en", encoding="latin-1")
    dm.setup()
    assert "grüne" in dm.load_codecs()["source"].dictionary.indices


def test_a_latin1_dictionary_is_named_and_read_in_its_encoding(tmp_path) -> None:
    path = tmp_path / "dict.de.txt"
    offset = write_latin1(path, ["haus 5", "das 4", "grün 3"])
    with pytest.raises(TextEncodingError) as error:
        Dictionary.load(path)
    check_message(str(error.value), path, offset)
    assert Dictionary.load(path, "latin-1").symbols[4:] == ("haus", "das", "grün")


def test_an_unknown_encoding_is_refused_when_the_module_is_made(tmp_path) -> None:
    with pytest.raises(TextEncodingError, match=r"^data\.encoding='latin-9x' cannot decode text"):
        TranslationDataModule(str(tmp_path), "de", "en", encoding="latin-9x")
