"""Cityscapes on a generated leftImg8bit/gtFine tree (PNG label ids, real file names)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.commands.train import train
from src.datamodules.cityscapes import CityscapesDataModule, train_id_table
from src.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD, DatasetLayoutError

ROAD, CAR, UNLABELED, EGO_VEHICLE = 7, 26, 0, 1  # label ids; train ids road 0, car 13
GREY, RED = (128, 128, 128), (230, 20, 20)
H, W = 32, 64


def scene() -> tuple[np.ndarray, np.ndarray]:
    """Grey road on the left half, a red car in the right quarter, void (0) and ego vehicle (1)
    rows."""
    image = np.zeros((H, W, 3), np.uint8)
    label_ids = np.full((H, W), UNLABELED, np.uint8)
    image[4:, : W // 2] = GREY
    label_ids[4:, : W // 2] = ROAD
    image[4:, 3 * W // 4 :] = RED
    label_ids[4:, 3 * W // 4 :] = CAR
    label_ids[-2:] = EGO_VEHICLE
    return image, label_ids


def make_cityscapes(root: Path, counts: dict[str, int]) -> Path:
    for split, count in counts.items():
        for city in ["aachen", "bonn"]:
            images, masks = root / "leftImg8bit" / split / city, root / "gtFine" / split / city
            images.mkdir(parents=True)
            masks.mkdir(parents=True)
            for i in range(count):
                stem = f"{city}_000000_{i:06d}"
                image, label_ids = scene()
                Image.fromarray(image).save(images / f"{stem}_leftImg8bit.png")
                Image.fromarray(label_ids, mode="L").save(masks / f"{stem}_gtFine_labelIds.png")
    return root


@pytest.fixture
def city_root(tmp_path: Path) -> Path:
    return make_cityscapes(tmp_path / "cityscapes", {"train": 2, "val": 1})


def test_label_ids_map_to_train_ids() -> None:
    with_background, standard = train_id_table(True), train_id_table(False)
    assert (
        with_background[ROAD] == 0 and with_background[CAR] == 13 and with_background[33] == 18
    )  # bicycle
    assert with_background[UNLABELED] == 19 and standard[UNLABELED] == 255
    assert sorted(set(standard.tolist()) - {255}) == list(range(19))


@pytest.mark.parametrize(("background_class", "void"), [(True, 19), (False, 255)])
def test_batches_and_mapping(city_root: Path, background_class: bool, void: int) -> None:
    num_classes, ignore = (20, 19) if background_class else (19, 255)
    dm = CityscapesDataModule(
        str(city_root), num_classes, crop_size=(16, 32), batch_size=2, num_workers=0,
        background_class=background_class, ignore_index=ignore,
    )  # fmt: skip
    dm.setup("fit")
    assert len(dm.splits["train"]) == 4 and len(dm.splits["val"]) == 2
    images, masks = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 16, 32) and images.dtype == torch.float32
    assert masks.shape == (2, 16, 32) and masks.dtype == torch.int64
    _, val_masks = next(iter(dm.val_dataloader()))
    assert set(val_masks.unique().tolist()) == {0, 13, void}


def test_image_and_mask_stay_aligned_under_crop_and_flip(city_root: Path) -> None:
    dm = CityscapesDataModule(
        str(city_root), crop_size=(16, 32), num_workers=0, crop_scale=(0.2, 0.6)
    )
    dm.setup("fit")
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    torch.manual_seed(0)
    checked = 0
    for _ in range(12):
        image, mask = dm.splits["train"][0]
        rgb = image * std + mean
        car, road = mask == 13, mask == 0
        if car.any() and road.any():
            # car pixels are red, road pixels grey, wherever the crop and flip put them
            assert (rgb[0][car] - rgb[1][car] > 0.5).float().mean() > 0.9
            assert ((rgb[0][road] - rgb[1][road]).abs() < 0.1).float().mean() > 0.9
            checked += 1
    assert checked >= 3


def test_class_count_must_match_background_choice() -> None:
    with pytest.raises(ValueError, match="num_classes=19 and ignore_index=255"):
        CityscapesDataModule("/nonexistent", num_classes=20, background_class=False)


def test_missing_and_malformed_roots(tmp_path: Path, city_root: Path) -> None:
    missing = tmp_path / "no_city"
    with pytest.raises(DatasetLayoutError) as error:
        CityscapesDataModule(str(missing)).setup("fit")
    message = str(error.value)
    assert (
        str(missing) in message
        and "leftImg8bit/train/<city>/" in message
        and "gtFine_labelIds.png" in message
    )
    mask = city_root / "gtFine" / "val" / "bonn" / "bonn_000000_000000_gtFine_labelIds.png"
    mask.unlink()
    with pytest.raises(
        DatasetLayoutError, match="1 of 2 gtFine val labelIds masks are missing"
    ) as error:
        CityscapesDataModule(str(city_root)).setup("fit")
    assert str(mask) in str(error.value)


@pytest.mark.slow
def test_train_fast_dev_run(city_root: Path, make_cfg) -> None:
    cfg = make_cfg(
        "data=cityscapes",
        f"data.root={city_root}",
        "data.crop_size=[32,64]",
        "data.batch_size=2",
        "model=torchvision_seg",
        "debug=fdr",
    )
    summary = train(cfg)
    assert summary["input_shape"] == [1, 3, 32, 64]
    assert 0.0 <= summary["metrics"]["val/mIoU"] <= 1.0
