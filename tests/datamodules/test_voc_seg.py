"""PASCAL VOC 2012 (+ SBD) segmentation on a generated VOCdevkit tree in the real file formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image

from src.commands.train import train
from src.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD, DatasetLayoutError
from src.datamodules.voc_seg import VOCSegmentationDataModule

PERSON = 15
RED, BLUE = (220, 20, 20), (20, 20, 220)
H, W = 36, 48


def scene(flip: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A red person on the left third, blue background elsewhere, a 255 border between them.

    The layout is not mirror-symmetric, so flipping only the image or only the mask shows.
    """
    image = np.empty((H, W, 3), np.uint8)
    image[:] = BLUE
    image[:, : W // 3] = RED
    mask = np.zeros((H, W), np.uint8)
    mask[:, : W // 3] = PERSON
    mask[:, W // 3 - 1 : W // 3 + 1] = 255
    return (image[:, ::-1].copy(), mask[:, ::-1].copy()) if flip else (image, mask)


def palette_png(mask: np.ndarray, path: Path) -> None:
    png = Image.fromarray(mask, mode="P")
    png.putpalette(
        [v for i in range(256) for v in ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)]
    )
    png.save(path)


def make_voc(root: Path, train_ids: list[str], val_ids: list[str]) -> Path:
    voc = root / "VOCdevkit" / "VOC2012"
    for folder in ["JPEGImages", "SegmentationClass", "ImageSets/Segmentation"]:
        (voc / folder).mkdir(parents=True, exist_ok=True)
    for k, image_id in enumerate(train_ids + val_ids):
        image, mask = scene(flip=k % 2 == 1)
        Image.fromarray(image).save(voc / "JPEGImages" / f"{image_id}.jpg", quality=95)
        palette_png(mask, voc / "SegmentationClass" / f"{image_id}.png")
    (voc / "ImageSets/Segmentation/train.txt").write_text("\n".join(train_ids) + "\n")
    (voc / "ImageSets/Segmentation/val.txt").write_text("\n".join(val_ids) + "\n")
    return root


def make_sbd(root: Path, ids: list[str], classes: dict[str, int]) -> Path:
    dataset = root / "dataset"
    (dataset / "img").mkdir(parents=True)
    (dataset / "cls").mkdir()
    for image_id in ids:
        image, mask = scene()
        mask = np.where(mask == PERSON, classes[image_id], 0).astype(
            np.uint8
        )  # SBD has no 255 borders
        Image.fromarray(image).save(dataset / "img" / f"{image_id}.jpg", quality=95)
        scipy.io.savemat(
            dataset / "cls" / f"{image_id}.mat",
            {"GTcls": {"Segmentation": mask, "CategoriesPresent": 1}},
        )
    (dataset / "train.txt").write_text("\n".join(ids[:-1]) + "\n")
    (dataset / "val.txt").write_text(ids[-1] + "\n")
    return root


def denormalised(images: torch.Tensor) -> torch.Tensor:
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return images * std + mean


@pytest.fixture
def voc_root(tmp_path: Path) -> Path:
    return make_voc(
        tmp_path / "voc",
        ["2007_000001", "2007_000002", "2007_000003", "2007_000004"],
        ["2007_000005", "2007_000006"],
    )


def test_batches_labels_and_non_square_crop(voc_root: Path) -> None:
    dm = VOCSegmentationDataModule(str(voc_root), crop_size=(24, 40), batch_size=2, num_workers=0)
    dm.setup("fit")
    assert len(dm.splits["train"]) == 4 and len(dm.splits["val"]) == 2
    images, masks = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 24, 40) and images.dtype == torch.float32
    assert masks.shape == (2, 24, 40) and masks.dtype == torch.int64
    val_images, val_masks = next(iter(dm.val_dataloader()))
    assert val_images.shape == (2, 3, 24, 40) and val_masks.shape == (2, 24, 40)
    # nearest-neighbour resampling: only the stored class ids, borders kept as 255
    assert set(val_masks.unique().tolist()) == {0, PERSON, 255}
    assert dm.example_input(2).shape == (2, 3, 24, 40)


def test_image_and_mask_stay_aligned_under_crop_and_flip(voc_root: Path) -> None:
    dm = VOCSegmentationDataModule(
        str(voc_root), crop_size=(20, 20), batch_size=2, num_workers=0, crop_scale=(0.3, 1.0)
    )
    dm.setup("fit")
    torch.manual_seed(0)
    flips_seen = set()
    for _ in range(12):
        image, mask = dm.splits["train"][0]
        rgb = denormalised(image)
        person, background = mask == PERSON, mask == 0
        if person.any():
            assert (
                rgb[0][person] > rgb[2][person]
            ).float().mean() > 0.9  # red where the mask says person
            flips_seen.add(bool(person[:, -1].any()))  # the person reached the right edge: flipped
        assert (rgb[2][background] > rgb[0][background]).float().mean() > 0.9  # blue background
    assert flips_seen == {True, False}


def test_sbd_train_aug(voc_root: Path, tmp_path: Path) -> None:
    # 2007_000001 is in VOC train (VOC mask wins), 2007_000005 in VOC val (left out of training)
    ids = ["2007_000001", "2008_000010", "2008_000011", "2007_000005"]
    sbd = make_sbd(tmp_path / "benchmark_RELEASE", ids, {i: 3 + k for k, i in enumerate(ids)})
    dm = VOCSegmentationDataModule(
        str(voc_root), crop_size=(36, 48), batch_size=2, num_workers=0, sbd_root=str(sbd)
    )
    dm.setup("fit")
    files = [(image.name, mask.name) for image, mask in dm.splits["train"].samples]
    assert len(files) == 6 and ("2008_000010.jpg", "2008_000010.mat") in files
    assert ("2007_000001.jpg", "2007_000001.png") in files and "2007_000005.mat" not in {
        m for _, m in files
    }
    sbd_index = files.index(("2008_000011.jpg", "2008_000011.mat"))
    _, mask = dm.splits["train"][sbd_index]
    assert set(mask.unique().tolist()) == {0, 5}


def test_missing_root_names_path_and_layout(tmp_path: Path) -> None:
    missing = tmp_path / "no_voc"
    with pytest.raises(DatasetLayoutError) as error:
        VOCSegmentationDataModule(str(missing)).setup("fit")
    message = str(error.value)
    assert (
        str(missing) in message
        and "VOCdevkit/VOC2012/" in message
        and "SegmentationClass/<id>.png" in message
    )


def test_malformed_root_names_missing_files(voc_root: Path, tmp_path: Path) -> None:
    voc = voc_root / "VOCdevkit" / "VOC2012"
    (voc / "SegmentationClass" / "2007_000002.png").unlink()
    with pytest.raises(
        DatasetLayoutError, match="1 of 8 VOC train images and masks are missing"
    ) as error:
        VOCSegmentationDataModule(str(voc_root)).setup("fit")
    assert str(voc / "SegmentationClass" / "2007_000002.png") in str(error.value)
    (voc / "ImageSets" / "Segmentation" / "val.txt").unlink()
    with pytest.raises(DatasetLayoutError, match="val.txt does not exist"):
        VOCSegmentationDataModule(str(voc_root)).setup("fit")
    with pytest.raises(DatasetLayoutError, match="SBD folder .*dataset does not exist"):
        make_voc(tmp_path / "voc2", ["a"], ["b"])
        VOCSegmentationDataModule(str(tmp_path / "voc2"), sbd_root=str(tmp_path / "no_sbd")).setup(
            "fit"
        )


def test_constructor_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="21 classes"):
        VOCSegmentationDataModule("/nonexistent", num_classes=20)
    with pytest.raises(ValueError, match="crop_size"):
        VOCSegmentationDataModule("/nonexistent", crop_size=(256,))


@pytest.mark.slow
def test_train_fast_dev_run(voc_root: Path, make_cfg) -> None:
    cfg = make_cfg(
        "data=voc_seg",
        f"data.root={voc_root}",
        "data.crop_size=[32,48]",
        "data.batch_size=2",
        "model=torchvision_seg",
        "task.head_lr_multiplier=10",
        "debug=fdr",
    )
    summary = train(cfg)
    assert summary["input_shape"] == [1, 3, 32, 48]
    assert 0.0 <= summary["metrics"]["val/mIoU"] <= 1.0 and "val/pixel_acc" in summary["metrics"]
