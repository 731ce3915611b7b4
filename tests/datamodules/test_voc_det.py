"""PASCAL VOC detection on a generated VOCdevkit tree with every kind of bad input."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.datamodules.bad_files import BadFilesError
from src.datamodules.image_folder import DatasetLayoutError
from src.datamodules.voc_det import VOC_OBJECTS, VOCDetectionDataModule, read_voc_xml

H, W = 40, 60
DOG, PERSON, CAT, HORSE = (VOC_OBJECTS.index(n) + 1 for n in ("dog", "person", "cat", "horse"))

# image id -> objects (name, 1-based VOC box, difficult); None: the image file is missing
TRAIN_07 = {
    "000001": [
        ("dog", (11, 6, 30, 25), 0),
        ("person", (31, 11, 50, 30), 1),  # difficult: dropped for training
        ("cat", (41, 21, 80, 50), 0),  # reaches outside: clipped
        ("car", (20, 5, 20, 30), 0),  # zero width: dropped
        ("unicorn", (5, 5, 15, 15), 0),  # unknown class: dropped
    ],
    "000002": [("bird", (3, 3, 20, 20), 1)],  # only a difficult object: skipped for training
    "000003": [("dog", (3, 3, 20, 20), 0)],  # its image is missing
}
TRAIN_12 = {"2008_000001": [("horse", (1, 1, 60, 40), 0)]}
TEST_07 = {
    "000004": [("dog", (11, 6, 30, 25), 0), ("person", (31, 11, 50, 30), 1)],
    "000005": [],  # no objects: kept for evaluation
}
MISSING = {"000003"}


def voc_xml(objects: list, size: tuple[int, int] = (H, W)) -> str:
    parts = [
        f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox><xmin>{x1}</xmin>"
        f"<ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
        for name, (x1, y1, x2, y2), difficult in objects
    ]
    size_xml = f"<size><width>{size[1]}</width><height>{size[0]}</height><depth>3</depth></size>"
    return f"<annotation>{size_xml}{''.join(parts)}</annotation>"


def write_set(base: Path, lists: dict[str, dict[str, list]]) -> None:
    for folder in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (base / folder).mkdir(parents=True, exist_ok=True)
    for list_name, images in lists.items():
        for image_id, objects in images.items():
            (base / "Annotations" / f"{image_id}.xml").write_text(voc_xml(objects))
            if image_id not in MISSING:
                pixels = np.random.default_rng(len(image_id)).integers(0, 255, (H, W, 3), np.uint8)
                Image.fromarray(pixels).save(base / "JPEGImages" / f"{image_id}.jpg")
        (base / "ImageSets/Main" / f"{list_name}.txt").write_text("\n".join(images) + "\n")


@pytest.fixture
def voc_root(tmp_path: Path) -> Path:
    root = tmp_path / "voc"
    write_set(root / "VOCdevkit/VOC2007", {"trainval": TRAIN_07, "test": TEST_07})
    write_set(root / "VOCdevkit/VOC2012", {"trainval": TRAIN_12})
    return root


def datamodule(root: Path, **kwargs: object) -> VOCDetectionDataModule:
    return VOCDetectionDataModule(str(root), image_size=32, batch_size=2, num_workers=0, **kwargs)


def test_read_voc_xml_subtracts_one(voc_root: Path) -> None:
    size, objects = read_voc_xml(voc_root / "VOCdevkit/VOC2007/Annotations/000004.xml")
    assert size == (H, W)
    assert objects == [
        ("dog", (10.0, 5.0, 29.0, 24.0), False),
        ("person", (30.0, 10.0, 49.0, 29.0), True),
    ]


def test_bad_inputs_are_counted_and_reported(
    voc_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dm = datamodule(voc_root, on_bad_file="skip")
    with caplog.at_level(logging.INFO):
        dm.setup()
    train, test = dm.reports["train"], dm.reports["test"]
    assert (train.images, train.boxes, train.difficult) == (2, 3, 2)
    assert (train.clipped, train.zero_area, train.unknown_class) == (1, 1, 1)
    assert (train.without_objects, train.bad_files, train.unknown_names) == (1, 1, ["unicorn"])
    assert (test.images, test.boxes, test.difficult, test.without_objects) == (2, 2, 1, 1)
    assert (test.clipped, test.zero_area, test.unknown_class, test.bad_files) == (0, 0, 0, 0)
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [2, 2, 2]
    assert "unknown classes: 'unicorn'" in caplog.text
    assert "1 clipped to the image" in caplog.text
    assert "000003.jpg\tunreadable" in (voc_root / "bad_files.txt").read_text()


def test_targets_of_training_and_evaluation(voc_root: Path) -> None:
    dm = datamodule(voc_root, on_bad_file="skip")
    dm.setup()
    train = dm.splits["train"].records
    assert [r.path.stem for r in train] == ["000001", "2008_000001"]
    assert train[0].labels.tolist() == [DOG, CAT] and not train[0].difficult.any()
    np.testing.assert_array_equal(train[0].boxes, [[10, 5, 29, 24], [40, 20, 60, 40]])
    image, target = dm.splits["test"][0]
    assert image.shape == (3, 32, 32)
    scale = torch.tensor([W, H, W, H], dtype=torch.float32)
    expected = torch.tensor([[10, 5, 29, 24], [30, 10, 49, 29]], dtype=torch.float32) / scale
    torch.testing.assert_close(target["boxes"], expected)
    assert target["labels"].tolist() == [DOG, PERSON]
    assert target["difficult"].tolist() == [False, True]
    assert (target["image_id"], target["orig_size"]) == (0, (H, W))
    _, empty = dm.splits["test"][1]
    assert empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,)


def test_loaders_collate_variable_box_counts(voc_root: Path) -> None:
    dm = datamodule(voc_root, on_bad_file="skip")
    dm.setup()
    images, targets = next(iter(dm.test_dataloader()))
    assert images.shape == (2, 3, 32, 32)
    assert [t["boxes"].shape[0] for t in targets] == [2, 0]
    torch.manual_seed(0)
    images, targets = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 32, 32) and len(targets) == 2
    for target in targets:
        assert ((target["boxes"] >= 0) & (target["boxes"] <= 1)).all()


def test_missing_image_stops_setup_naming_it(voc_root: Path) -> None:
    with pytest.raises(BadFilesError, match=r"1 of the 5 files.*\n.*000003\.jpg: unreadable"):
        datamodule(voc_root).setup()


def test_image_of_another_size_than_its_annotation_is_a_bad_file(voc_root: Path) -> None:
    path = voc_root / "VOCdevkit/VOC2007/JPEGImages/000004.jpg"
    Image.fromarray(np.zeros((H, W + 2, 3), np.uint8)).save(path)
    dm = datamodule(voc_root, on_bad_file="skip", train_sets=[["VOCdevkit/VOC2012", "trainval"]])
    dm.setup()
    assert (dm.reports["test"].bad_files, dm.reports["test"].images) == (1, 1)
    listing = (voc_root / "bad_files.txt").read_text()
    assert "000004.jpg\t" in listing and "62x40 but its annotation says 60x40" in listing


def test_absent_dataset_names_the_layout(tmp_path: Path) -> None:
    layout = r"(?s)does not exist.*VOCdevkit/VOC2007.*Annotations"
    with pytest.raises(DatasetLayoutError, match=layout):
        datamodule(tmp_path / "nowhere").setup()


def test_attributes_without_reading_data(tmp_path: Path) -> None:
    dm = VOCDetectionDataModule(str(tmp_path), image_size=300)
    assert dm.example_input(2).shape == (2, 3, 300, 300)
    assert dm.num_classes == 21 and len(dm.class_names) == 21
    assert dm.class_names[0] == "background" and dm.class_names[12] == "dog"
    with pytest.raises(ValueError, match="num_classes must be 21"):
        VOCDetectionDataModule(str(tmp_path), num_classes=20)
