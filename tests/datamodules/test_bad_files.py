"""Bad data found before training: corrupt and empty images (error or skip, the check command),
truncated corpus archives and damaged token caches, each on tiny generated files."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import src.datamodules.bad_files
from src.datamodules.bad_files import BadFilesError, check_files, screen_files
from src.datamodules.char_lm import CorruptCacheError, Enwik8DataModule
from src.datamodules.check import main
from src.datamodules.cityscapes import CityscapesDataModule
from src.datamodules.coco_multilabel import CocoMultiLabelDataModule
from src.datamodules.image_folder import ImageFolderDataModule
from src.datamodules.voc_seg import VOCSegmentationDataModule
from tests.conftest import ROOT
from tests.datamodules.test_char_lm import SMALL, enwik8_bytes
from tests.datamodules.test_cityscapes import make_cityscapes
from tests.datamodules.test_coco_multilabel import make_coco
from tests.datamodules.test_voc_seg import make_voc

FIX = (
    "Remove or replace these files, or set data.on_bad_file=skip to leave them out of the dataset."
)
UNIDENTIFIED = "does not decode (not an image file PIL can identify)"
TRUNCATED = "does not decode (OSError: image file is truncated"


def jpeg_bytes(seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (8, 10, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


def cut_after_header(jpeg: bytes) -> bytes:
    """The JPEG up to its start-of-scan marker: it opens and verifies, but does not decode."""
    return jpeg[: jpeg.index(b"\xff\xda") + 14]


def make_image_folder(root: Path) -> Path:
    """train/{dark,light}/ 3 JPEGs each, val/{dark,light}/ 2 each: 10 good 8x10 images."""
    for split, count in [("train", 3), ("val", 2)]:
        for label in ["dark", "light"]:
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                (folder / f"{i}.jpg").write_bytes(jpeg_bytes(i))
    return root


@pytest.fixture
def bad_tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The 10 good images plus train/dark/corrupt.jpg (random bytes) and val/light/empty.jpg
    (0 bytes)."""
    root = make_image_folder(tmp_path / "images")
    corrupt, empty = root / "train/dark/corrupt.jpg", root / "val/light/empty.jpg"
    corrupt.write_bytes(np.random.default_rng(1).integers(0, 255, 300, dtype=np.uint8).tobytes())
    empty.write_bytes(b"")
    return root, corrupt, empty


def image_folder(root: Path, **kwargs) -> ImageFolderDataModule:
    return ImageFolderDataModule(
        str(root), 2, crop_size=8, resize_size=8, batch_size=2, num_workers=0, **kwargs
    )


# -- image datasets --------------------------------------------------------------------------
def test_corrupt_and_empty_images_are_named_in_one_error(bad_tree) -> None:
    root, corrupt, empty = bad_tree
    with pytest.raises(BadFilesError) as error:
        image_folder(root).setup("fit")
    listing = root / "bad_files.txt"
    assert str(error.value) == (
        f"2 of the 12 files under {root} cannot be used:\n"
        f"    {corrupt}: {UNIDENTIFIED}\n"
        f"    {empty}: empty (0 bytes)\n"
        f"All 2 are listed in {listing}.\n{FIX}"
    )
    assert listing.read_text() == f"{corrupt}\t{UNIDENTIFIED}\n{empty}\tempty (0 bytes)\n"


def test_a_jpeg_cut_after_its_header_is_decoded_not_only_verified(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "images")
    cut = root / "val/dark/cut.jpg"
    cut.write_bytes(cut_after_header(jpeg_bytes()))
    with Image.open(cut) as image:
        image.verify()  # passes: only a decode finds it
    with pytest.raises(BadFilesError) as error:
        image_folder(root).setup("validate")
    lines = str(error.value).splitlines()
    assert lines[0] == f"1 of the 5 files under {root} cannot be used:"
    assert lines[1].startswith(f"    {cut}: {TRUNCATED}")


def test_skip_leaves_the_bad_files_out_and_lists_them(bad_tree, caplog) -> None:
    root, corrupt, empty = bad_tree
    dm = image_folder(root, on_bad_file="skip")
    with caplog.at_level(logging.WARNING, logger="src.datamodules.bad_files"):
        dm.setup("fit")
    assert len(dm.splits["train"]) == 6 and len(dm.splits["val"]) == 4  # 7 and 5 files on disk
    assert all(
        Path(path) not in {corrupt, empty}
        for split in dm.splits.values()
        for path, _ in split.samples
    )
    assert dm.splits["train"].targets == [label for _, label in dm.splits["train"].samples]
    listing = root / "bad_files.txt"
    assert [line.split("\t")[0] for line in listing.read_text().splitlines()] == [
        str(corrupt),
        str(empty),
    ]
    assert caplog.messages == [
        f"{root}: leaving out 2 bad files of the 12 files (data.on_bad_file=skip); they are "
        f"listed in {listing}"
    ]
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (2, 3, 8, 8) and labels.tolist() == [0, 0]


def test_on_bad_file_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as error:
        image_folder(tmp_path, on_bad_file="ignore")
    assert str(error.value) == (
        "on_bad_file must be 'error' (stop and name the bad files) or 'skip' (leave them out), "
        "got 'ignore'"
    )


def test_an_unchecked_bad_file_names_itself_when_loaded(bad_tree) -> None:
    """With the check switched off (check_max_seconds=0) the loader still names the file."""
    root, _, empty = bad_tree
    dm = image_folder(root, check_max_seconds=0)
    dm.setup("validate")
    with pytest.raises(BadFilesError) as error:
        list(dm.val_dataloader())
    assert str(error.value) == (
        f"{empty}: empty (0 bytes). Remove or replace it, or set data.on_bad_file=skip; "
        "python -m src.datamodules.check <the same data overrides> finds every such file"
    )


def test_the_check_function_reports_each_file_and_its_time_limit(bad_tree) -> None:
    root, corrupt, empty = bad_tree
    files = sorted(root.rglob("*.jpg"))
    report = check_files(files)
    assert report.bad == {corrupt: UNIDENTIFIED, empty: "empty (0 bytes)"}
    assert (report.checked, report.total, report.complete) == (12, 12, True)
    nothing = check_files(files, max_seconds=0)
    assert (nothing.bad, nothing.checked, nothing.complete) == ({}, 0, False)


def test_a_capped_check_says_how_many_files_it_decoded(tmp_path: Path, monkeypatch) -> None:
    files = []
    for i in range(40):
        files.append(tmp_path / f"{i:02d}.bin")
        files[-1].write_bytes(b"x")

    def read(path: Path) -> None:
        if path.name == "00.bin":
            raise ValueError("bad header")

    # the clock: start, before the first chunk of 32 files, then past the limit
    ticks = iter([0.0, 0.0, 0.5, 0.5])
    monkeypatch.setattr(src.datamodules.bad_files, "monotonic", lambda: next(ticks))
    with pytest.raises(BadFilesError) as error:
        screen_files(files, tmp_path, on_bad_file="error", read=read, max_seconds=0.2)
    assert str(error.value) == (
        f"1 of the first 32 of 40 files under {tmp_path} cannot be used:\n"
        f"    {files[0]}: does not decode (ValueError: bad header)\n"
        f"All 1 are listed in {tmp_path / 'bad_files.txt'}.\n{FIX}\n"
        "Note: the check stopped at its 0.2 s limit (data.check_max_seconds): 8 files were not "
        "decoded; python -m src.datamodules.check <the same data overrides> decodes them all."
    )


def test_more_than_twenty_bad_files_are_counted_not_all_listed(tmp_path: Path) -> None:
    files = [tmp_path / f"{i:02d}.jpg" for i in range(25)]
    for path in files:
        path.write_bytes(b"")
    with pytest.raises(BadFilesError) as error:
        screen_files(files, tmp_path, on_bad_file="error")
    lines = str(error.value).splitlines()
    assert lines[0] == f"25 of the 25 files under {tmp_path} cannot be used:"
    assert lines[20:23] == [
        f"    {files[19]}: empty (0 bytes)",
        "    ... and 5 more",
        f"All 25 are listed in {tmp_path / 'bad_files.txt'}.",
    ]  # fmt: skip
    assert len((tmp_path / "bad_files.txt").read_text().splitlines()) == 25


def test_check_command_exits_non_zero_naming_both_files(bad_tree) -> None:
    root, corrupt, empty = bad_tree
    result = subprocess.run(
        [sys.executable, "-m", "src.datamodules.check", "data=image_folder", f"data.root={root}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert f"ERROR BadFilesError: 2 of the 12 files under {root} cannot be used:" in result.stderr
    assert f"    {corrupt}: {UNIDENTIFIED}\n    {empty}: empty (0 bytes)\n" in result.stderr


def test_check_command_passes_a_clean_dataset_and_asks_for_a_root(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "images")
    assert main(["data=image_folder", f"data.root={root}"]) == 0
    assert not (root / "bad_files.txt").exists()
    assert main(["data=image_folder"]) == 2  # data.root=??? is named, not a traceback


def test_segmentation_pairs_with_a_bad_image_or_mask(tmp_path: Path) -> None:
    ids = ["2007_000001", "2007_000002", "2007_000003"]
    root = make_voc(tmp_path / "voc", ids, ["2007_000009", "2007_000010"])
    voc = root / "VOCdevkit/VOC2012"
    image, mask = voc / "JPEGImages/2007_000002.jpg", voc / "SegmentationClass/2007_000010.png"
    image.write_bytes(cut_after_header(image.read_bytes()))
    mask.write_bytes(b"")
    kwargs = {"crop_size": (16, 16), "batch_size": 1, "num_workers": 0}
    with pytest.raises(BadFilesError) as error:
        VOCSegmentationDataModule(str(root), **kwargs).setup("fit")
    lines = str(error.value).splitlines()
    assert lines[0] == f"2 of the 10 files under {root} cannot be used:"
    assert (
        lines[1].startswith(f"    {image}: {TRUNCATED}")
        and lines[2] == f"    {mask}: empty (0 bytes)"
    )
    dm = VOCSegmentationDataModule(str(root), on_bad_file="skip", **kwargs)
    dm.setup("fit")
    assert [pair[0].stem for pair in dm.splits["train"].samples] == ["2007_000001", "2007_000003"]
    assert [pair[0].stem for pair in dm.splits["val"].samples] == ["2007_000009"]


def test_cityscapes_skip_drops_the_pair_of_a_bad_mask(tmp_path: Path) -> None:
    root = make_cityscapes(tmp_path / "cityscapes", {"train": 2, "val": 1})
    mask = root / "gtFine/train/bonn/bonn_000000_000001_gtFine_labelIds.png"
    mask.write_bytes(b"not a png")
    kwargs = {"crop_size": (16, 32), "batch_size": 1, "num_workers": 0}
    with pytest.raises(BadFilesError) as error:
        CityscapesDataModule(str(root), **kwargs).setup("fit")
    assert str(error.value) == (
        f"1 of the 12 files under {root} cannot be used:\n    {mask}: {UNIDENTIFIED}\n"
        f"All 1 are listed in {root / 'bad_files.txt'}.\n{FIX}"
    )
    dm = CityscapesDataModule(str(root), on_bad_file="skip", **kwargs)
    dm.setup("fit")
    train = dm.splits["train"]
    assert len(train) == 3 and len(dm.splits["val"]) == 2
    assert sorted(Path(p).name for p in train.images) == [  # torchvision lists cities unordered
        "aachen_000000_000000_leftImg8bit.png", "aachen_000000_000001_leftImg8bit.png",
        "bonn_000000_000000_leftImg8bit.png",
    ]  # fmt: skip
    stems = [Path(image).name.removesuffix("_leftImg8bit.png") for image in train.images]
    assert [Path(t[0]).name.removesuffix("_gtFine_labelIds.png") for t in train.targets] == stems


def test_coco_skip_drops_the_image_and_its_target(tmp_path: Path) -> None:
    root = make_coco(tmp_path / "coco")
    bad = root / "train2014/COCO_train2014_000000000002.jpg"
    bad.write_bytes(b"")
    kwargs = {"crop_size": 16, "resize_size": 16, "batch_size": 1, "num_workers": 0}
    with pytest.raises(BadFilesError) as error:
        CocoMultiLabelDataModule(str(root), **kwargs).setup("fit")
    assert str(error.value) == (
        f"1 of the 6 files under {root} cannot be used:\n    {bad}: empty (0 bytes)\n"
        f"All 1 are listed in {root / 'bad_files.txt'}.\n{FIX}"
    )
    full = CocoMultiLabelDataModule(str(root), **kwargs, check_max_seconds=0)
    full.setup("fit")
    dm = CocoMultiLabelDataModule(str(root), on_bad_file="skip", **kwargs)
    dm.setup("fit")
    train = dm.splits["train"]
    assert [p.name[-8:-4] for p in train.files] == ["0001", "0003", "0004"]
    assert train.targets.tolist() == full.splits["train"].targets[[0, 2, 3]].tolist()


# -- character corpora -----------------------------------------------------------------------
def test_truncated_zip_names_the_file_and_the_fix(tmp_path: Path) -> None:
    packed = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("enwik8", enwik8_bytes())
    packed.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])  # an interrupted download
    with pytest.raises(zipfile.BadZipFile) as error:
        Enwik8DataModule(str(tmp_path), valid_size=300, test_size=200, **SMALL).prepare_data()
    assert str(error.value) == (
        f"{packed} is not a readable zip archive (File is not a zip file); an interrupted download "
        "leaves it truncated. Delete it and download it again from "
        f"http://mattmahoney.net/dc/enwik8.zip, or put the unpacked 'enwik8' file in {tmp_path}"
    )


def built(root: Path) -> Enwik8DataModule:
    dm = Enwik8DataModule(str(root), valid_size=300, test_size=200, **SMALL)
    dm.setup("fit")
    return dm


def damage(root: Path, kind: str) -> tuple[Path, str]:
    """Damage one file of a built cache; returns it and what the check says about it (a prefix)."""
    train, vocab = root / "enwik8.train.npy", root / "enwik8.vocab.json"
    ids = np.load(train)
    n, n_symbols = len(ids), len(json.loads(vocab.read_text())["symbols"])
    if kind == "truncated":
        train.write_bytes(train.read_bytes()[: train.stat().st_size // 2])
        return train, f"{train} does not load (ValueError: "
    if kind == "zero_bytes":
        train.write_bytes(b"")
        return train, f"{train} does not load (EOFError: "
    if kind == "wrong_dtype":
        np.save(train, ids.astype(np.int64))
        return train, f"{train} holds int64 ({n},), expected uint8 or uint16 ({n},)"
    if kind == "wrong_length":
        np.save(train, ids[:-5])
        return train, f"{train} holds uint8 ({n - 5},), expected uint8 or uint16 ({n},)"
    if kind == "out_of_vocab":
        np.save(train, np.full_like(ids, 255))
        return train, f"{train} holds id 255, outside its vocabulary of {n_symbols} symbols"
    vocab.write_text('{"source": "')  # cut short while written by hand
    return vocab, f"{vocab} does not hold the cache's vocabulary (JSONDecodeError: "


KINDS = ["truncated", "zero_bytes", "wrong_dtype", "wrong_length", "out_of_vocab", "vocab_json"]


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_cache_is_rebuilt_from_the_source(kind: str, tmp_path: Path, caplog) -> None:
    for folder in ("fresh", "data"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "enwik8").write_bytes(enwik8_bytes())
    fresh, root = built(tmp_path / "fresh"), tmp_path / "data"
    built(root)
    _, said = damage(root, kind)
    with caplog.at_level(logging.WARNING, logger="src.datamodules.char_lm"):
        dm = built(root)
    (message,) = caplog.messages
    assert message.startswith(f"enwik8: {said}") and message.endswith(
        "; rebuilding the cache from the source"
    )
    assert dm.symbols == fresh.symbols
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(dm.splits[split], fresh.splits[split])
        np.testing.assert_array_equal(np.load(root / f"enwik8.{split}.npy"), fresh.splits[split])


def test_damaged_cache_without_its_source_names_the_cache_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "enwik8").write_bytes(enwik8_bytes())
    built(tmp_path)
    (tmp_path / "enwik8").unlink()
    path, said = damage(tmp_path, "out_of_vocab")
    with pytest.raises(CorruptCacheError) as error:
        built(tmp_path)
    caches = " ".join(
        str(tmp_path / f"enwik8.{name}")
        for name in ["train.npy", "val.npy", "test.npy", "vocab.json"]
    )
    assert str(error.value) == (
        f"{said}, and the cache cannot be rebuilt: enwik8 not found: expected the raw file "
        f"{tmp_path / 'enwik8'} or the zip {tmp_path / 'enwik8.zip'} holding 'enwik8' (download "
        "http://mattmahoney.net/dc/enwik8.zip); set data.root to its folder\n"
        "Provide the source so that the cache is rebuilt from it, or delete the damaged cache "
        f"files: {caches}"
    )
