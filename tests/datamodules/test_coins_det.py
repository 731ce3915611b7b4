"""The embedded coins detection set: its boxes, the written VOC layout and its counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from src.datamodules.coins_det import (
    COIN_BOXES,
    CoinsDetectionDataModule,
    crop_objects,
    derive_coin_boxes,
)
from src.datamodules.voc_det import read_voc_xml

# the counts conf/data/coins_det.yaml reports for the defaults (seed 0, 200 + 50 crops)
TRAIN = {"images": 200, "boxes": 2243, "difficult": 592, "without_objects": 0}
TEST = {"images": 50, "boxes": 730, "difficult": 179, "without_objects": 0}


def test_the_boxes_are_what_the_documented_procedure_gives() -> None:
    assert derive_coin_boxes() == list(COIN_BOXES)
    assert len(COIN_BOXES) == 24


def test_crop_objects_flip_and_flag_cut_coins() -> None:
    # the crop (300, 10)-(384, 80) holds the coin (305, 16, 365, 72) whole
    (whole,) = [o for o in crop_objects(300, 10, 84, 70, False, False) if not o[1]]
    assert whole == ((5, 6, 65, 62), False, False)
    (flipped,) = [o for o in crop_objects(300, 10, 84, 70, True, True) if not o[1]]
    assert flipped == ((84 - 65, 70 - 62, 84 - 5, 70 - 6), False, False)
    # half of that coin (x 305..335 of 305..365) is difficult, a sixth of it is left out
    assert crop_objects(335, 0, 49, 90, False, False)[0] == ((0, 16, 30, 72), True, True)
    assert crop_objects(355, 0, 29, 90, False, False) == []


@pytest.fixture(scope="module")
def coins(tmp_path_factory: pytest.TempPathFactory) -> CoinsDetectionDataModule:
    dm = CoinsDetectionDataModule(str(tmp_path_factory.mktemp("coins")), num_workers=0)
    dm.prepare_data()
    dm.setup()
    return dm


def test_written_layout_and_reported_counts(coins: CoinsDetectionDataModule) -> None:
    root = coins.root
    assert len(list((root / "JPEGImages").glob("*.jpg"))) == 250
    size, objects = read_voc_xml(root / "Annotations" / "coins_test_0000.xml")
    assert size is not None and 150 <= min(size) and max(size) <= 300
    assert {name for name, _, _ in objects} == {"coin"}
    for split, expected in (("train", TRAIN), ("test", TEST)):
        report = coins.reports[split]
        assert {key: getattr(report, key) for key in expected} == expected, split
        assert (report.clipped, report.zero_area, report.unknown_class, report.bad_files) == (
            0, 0, 0, 0,
        )  # fmt: skip
    assert coins.class_names == ("background", "coin") and coins.num_classes == 2


def test_items_are_normalised_and_the_set_is_kept(coins: CoinsDetectionDataModule) -> None:
    torch.manual_seed(0)
    image, target = coins.splits["train"][0]
    assert image.shape == (3, 300, 300)
    assert ((target["boxes"] >= 0) & (target["boxes"] <= 1)).all()
    assert set(target["labels"].tolist()) <= {1}
    stamp = coins.root / "coins_det.json"
    written = stamp.stat().st_mtime_ns
    CoinsDetectionDataModule(str(coins.root), num_workers=0).prepare_data()
    assert stamp.stat().st_mtime_ns == written  # same recipe: not rewritten


def test_another_seed_rewrites_the_set(tmp_path: Path) -> None:
    first = CoinsDetectionDataModule(str(tmp_path), num_train=2, num_test=1, seed=0)
    first.prepare_data()
    xml = (tmp_path / "Annotations" / "coins_trainval_0000.xml").read_text()
    CoinsDetectionDataModule(str(tmp_path), num_train=2, num_test=1, seed=1).prepare_data()
    assert (tmp_path / "Annotations" / "coins_trainval_0000.xml").read_text() != xml
