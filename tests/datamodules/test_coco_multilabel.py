"""COCO multi-label on a generated instances JSON + JPEG tree, read through pycocotools."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.commands.train import train
from src.datamodules.coco_multilabel import CocoMultiLabelDataModule
from src.datamodules.image_folder import DatasetLayoutError

# 80 category ids with gaps, as COCO's 1..90; listed unsorted to check the sorted label order
CATEGORY_IDS = [i + i // 12 for i in range(1, 81)][::-1]
# image id -> category ids of its annotations (image 3 has none)
TRAIN = {
    1: [CATEGORY_IDS[-1], CATEGORY_IDS[-6], CATEGORY_IDS[-6]],
    2: [CATEGORY_IDS[0]],
    3: [],
    4: [CATEGORY_IDS[-2]],
}
VAL = {10: [CATEGORY_IDS[-1]], 11: [CATEGORY_IDS[-3], CATEGORY_IDS[0]]}


def make_coco(root: Path, year: int = 2014) -> Path:
    (root / "annotations").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, images in [("train", TRAIN), ("val", VAL)]:
        folder = root / f"{split}{year}"
        folder.mkdir()
        entries, annotations = [], []
        for image_id, categories in images.items():
            name = f"COCO_{split}{year}_{image_id:012d}.jpg"
            Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(folder / name)
            entries.append({"id": image_id, "file_name": name, "height": 30, "width": 40})
            for category in categories:
                annotations.append(
                    {"id": len(annotations) + 100 * image_id, "image_id": image_id,
                     "category_id": category, "bbox": [1, 1, 10, 10], "area": 100, "iscrowd": 0,
                     "segmentation": []}
                )  # fmt: skip
        document = {
            "images": entries,
            "annotations": annotations,
            "categories": [{"id": c, "name": f"c{c}", "supercategory": "s"} for c in CATEGORY_IDS],
        }
        (root / "annotations" / f"instances_{split}{year}.json").write_text(json.dumps(document))
    return root


@pytest.fixture
def coco_root(tmp_path: Path) -> Path:
    return make_coco(tmp_path / "coco")


def test_multi_hot_targets_in_sorted_category_order(coco_root: Path) -> None:
    dm = CocoMultiLabelDataModule(
        str(coco_root), crop_size=32, resize_size=36, batch_size=2, num_workers=0
    )
    dm.setup("fit")
    assert dm.category_ids == sorted(CATEGORY_IDS)
    train_set = dm.splits["train"]
    assert len(train_set) == 4 and len(dm.splits["val"]) == 2
    # sorted ids: CATEGORY_IDS[-1] is label 0, [-2] label 1, [-6] label 5, [0] label 79
    assert train_set.targets[0].nonzero().flatten().tolist() == [
        0,
        5,
    ]  # a repeated category counts once
    assert train_set.targets[1].nonzero().flatten().tolist() == [79]
    assert train_set.targets[2].sum() == 0  # kept, with an all-zero target
    assert dm.splits["val"].targets[1].nonzero().flatten().tolist() == [2, 79]
    images, targets = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.float32
    assert targets.shape == (2, 80) and targets.dtype == torch.float32
    val_images, _ = next(iter(dm.val_dataloader()))
    assert val_images.shape == (2, 3, 32, 32)
    assert dm.example_input(3).shape == (3, 3, 32, 32)


def test_unannotated_images_can_be_dropped(coco_root: Path) -> None:
    dm = CocoMultiLabelDataModule(str(coco_root), keep_unannotated=False)
    dm.setup("fit")
    assert len(dm.splits["train"]) == 3 and bool((dm.splits["train"].targets.sum(1) > 0).all())


def test_year_2017_and_bad_year(tmp_path: Path) -> None:
    dm = CocoMultiLabelDataModule(str(make_coco(tmp_path / "coco17", 2017)), year=2017)
    dm.setup("fit")
    assert dm.splits["train"].files[0].parent.name == "train2017"
    with pytest.raises(ValueError, match="year must be one of"):
        CocoMultiLabelDataModule(str(tmp_path), year=2015)


def test_missing_and_malformed_roots(tmp_path: Path, coco_root: Path) -> None:
    missing = tmp_path / "no_coco"
    with pytest.raises(DatasetLayoutError) as error:
        CocoMultiLabelDataModule(str(missing)).setup("fit")
    message = str(error.value)
    assert (
        str(missing) in message
        and "annotations/instances_train2014.json" in message
        and "val2014/" in message
    )
    image = coco_root / "val2014" / "COCO_val2014_000000000011.jpg"
    image.unlink()
    with pytest.raises(DatasetLayoutError, match="1 of 2 val2014 images are missing") as error:
        CocoMultiLabelDataModule(str(coco_root)).setup("fit")
    assert str(image) in str(error.value)
    (coco_root / "annotations" / "instances_val2014.json").unlink()
    with pytest.raises(DatasetLayoutError, match="instances_val2014.json does not exist"):
        CocoMultiLabelDataModule(str(coco_root)).setup("fit")
    with pytest.raises(DatasetLayoutError, match="lists 80 categories but data.num_classes=20"):
        CocoMultiLabelDataModule(str(coco_root), num_classes=20).setup("fit")


@pytest.mark.slow
def test_train_fast_dev_run(coco_root: Path, make_cfg) -> None:
    cfg = make_cfg(
        "data=coco_multilabel",
        f"data.root={coco_root}",
        "data.crop_size=32",
        "data.resize_size=36",
        "data.batch_size=2",
        "model=torchvision",
        "model.name=mobilenet_v3_small",
        "debug=fdr",
    )
    summary = train(cfg)
    metrics = summary["metrics"]
    assert summary["input_shape"] == [1, 3, 32, 32]
    for name in ["CP", "CR", "CF1", "OP", "OR", "OF1", "mAP", "loss"]:
        assert f"val/{name}" in metrics
