"""Where ``export.py`` reads its images (:mod:`src.export.images`), the streamed int8 calibration
feeds (:class:`src.export.quantize.CalibrationFeeds`), the ONNX libraries' log records kept off the
console (:func:`src.export.onnx.library_logs_to_file`) and the printed summary."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.commands.export import summary
from src.datamodules.digits import DIGITS_MEAN, DIGITS_STD, DigitsDataModule
from src.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD, ImageFolderDataModule
from src.datamodules.voc_seg import VOCSegmentationDataModule
from src.export.images import (
    BATCH,
    batched,
    eval_transform,
    export_images,
    folder_images,
    limited,
)
from src.export.quantize import CALIBRATION_BATCH, CalibrationFeeds
from src.utils.errors import UsageError

onnxruntime = pytest.importorskip("onnxruntime")


def write_images(folder: Path, sizes: list[tuple[int, int]], colour=(255, 0, 0)) -> list[Path]:
    """Plain images of the (W, H) ``sizes``, alternately PNG and JPEG."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, size in enumerate(sizes):
        path = folder / f"image{index:03d}.{'png' if index % 2 else 'jpg'}"
        Image.new("RGB", size, colour).save(path)
        paths.append(path)
    return paths


def test_eval_transform_of_class_folders_is_resize_then_centre_crop() -> None:
    data = ImageFolderDataModule(root="/nowhere", num_classes=None, crop_size=224, resize_size=256)
    # a 512x256 image: short side to 256 (512x256 stays), centre 224x224 crop of the middle
    pixels = np.zeros((256, 512, 3), dtype=np.uint8)
    pixels[:, 256:] = 255  # right half white: the crop's right half is white
    image = eval_transform(data)(Image.fromarray(pixels))
    assert tuple(image.shape) == (3, 224, 224)
    white = (1.0 - IMAGENET_MEAN[0]) / IMAGENET_STD[0]
    black = -IMAGENET_MEAN[0] / IMAGENET_STD[0]
    assert image[0, 112, 120].item() == pytest.approx(white, abs=1e-5)
    assert image[0, 112, 100].item() == pytest.approx(black, abs=1e-5)


def test_eval_transform_of_segmentation_and_digits_resizes_to_the_input() -> None:
    voc = VOCSegmentationDataModule(root="/nowhere", crop_size=(96, 128))
    image = eval_transform(voc)(Image.new("RGB", (40, 300), (255, 255, 255)))
    assert tuple(image.shape) == (3, 96, 128)  # (H, W), aspect not kept
    digits = eval_transform(DigitsDataModule(in_chans=3, image_size=32))
    grey = digits(Image.new("RGB", (70, 50), (0, 0, 0)))
    assert tuple(grey.shape) == (3, 32, 32)
    assert grey.unique().tolist() == pytest.approx([-DIGITS_MEAN / DIGITS_STD])


def test_folder_images_stream_every_file_in_batches(tmp_path) -> None:
    write_images(tmp_path / "mine", [(300, 200), (64, 90), (224, 224)] * 7)  # 21 images
    (tmp_path / "mine" / "notes.txt").write_text("not an image")
    data = ImageFolderDataModule(root="/nowhere", num_classes=None, crop_size=64, resize_size=72)
    images = folder_images(data, tmp_path / "mine")
    assert images.source == "folder" and images.labelled is None
    assert tuple(images.check.shape) == (BATCH, 3, 64, 64)
    assert images.description == f"{BATCH} images of {tmp_path / 'mine'}"
    assert [len(batch) for batch in images.calibration()] == [BATCH, 21 - BATCH]


def test_folder_without_images_is_one_line(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    data = DigitsDataModule()
    with pytest.raises(UsageError, match="holds no image files") as raised:
        folder_images(data, tmp_path / "empty")
    assert "\n" not in str(raised.value)
    (tmp_path / "empty" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(UsageError, match="broken.png cannot be read as an image"):
        folder_images(data, tmp_path / "empty")


def test_without_the_dataset_parity_inputs_are_generated(tmp_path) -> None:
    data = ImageFolderDataModule(root=str(tmp_path / "missing"), num_classes=1000, crop_size=224)
    images, reason = export_images(data, None)
    assert images.source == "generated" and images.calibration is None
    assert reason is not None and "does not exist" in reason and "\n" not in reason
    assert tuple(images.check.shape) == (BATCH, 3, 224, 224)
    again, _ = export_images(data, None)
    assert torch.equal(again.check, images.check)  # a fixed seed
    assert 0.9 < images.check.std().item() < 1.1


def test_the_dataset_is_read_a_few_images_at_a_time() -> None:
    data = DigitsDataModule(batch_size=256, num_workers=0)
    images, reason = export_images(data, None)
    assert reason is None and images.source == "dataset"
    assert tuple(images.check.shape) == (BATCH, 1, 32, 32)
    assert max(len(batch) for batch in images.calibration()) == BATCH
    assert max(len(batch) for batch, _ in images.labelled()) == BATCH


def test_calibration_feeds_are_small_batches_up_to_the_limit() -> None:
    batches = (torch.full((64, 3, 4, 4), float(i)) for i in range(100))  # a loader of batch 64
    feeds = CalibrationFeeds(batches, "image", 20)
    fed = [feed["image"] for feed in feeds]
    assert [len(f) for f in fed] == [
        CALIBRATION_BATCH,
        CALIBRATION_BATCH,
        20 - 2 * CALIBRATION_BATCH,
    ]
    assert feeds.images == 20 and feeds.finished is not None
    assert all(isinstance(f, np.ndarray) and f.shape[1:] == (3, 4, 4) for f in fed)
    with pytest.raises(ValueError, match="limit must be >= 1 image, got 0"):
        CalibrationFeeds(iter([]), "image", 0)


def test_batched_and_limited_regroup_images() -> None:
    singles = [torch.full((3, 2, 2), float(i)) for i in range(5)]
    assert [len(b) for b in batched(singles, 2)] == [2, 2, 1]
    assert [len(b) for b in limited(batched(singles, 2), 3)] == [2, 1]
    assert [b[:, 0, 0, 0].tolist() for b in limited(batched(singles, 2), 3)] == [[0, 1], [2]]


def test_library_logs_reach_the_file_not_the_console(tmp_path) -> None:
    from src.export.onnx import library_logs_to_file

    console, file_path = io.StringIO(), tmp_path / "run.log"
    handlers = [logging.StreamHandler(console), logging.FileHandler(file_path)]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    for handler in handlers:
        root.addHandler(handler)
    try:
        with library_logs_to_file():
            logging.getLogger("onnx_ir.passes.common").info("Replaced initializer 'a' with 'b'")
            logging.getLogger("onnxscript.rewriter").info("Applied 714 rewrite rules")
            # onnxruntime's quantizer warns through the root logger from inside its package
            quantizer = Path(onnxruntime.__file__).parent / "quantization" / "quantize.py"
            record = root.makeRecord(
                "root", logging.WARNING, str(quantizer), 1,
                "Please consider pre-processing before quantization", None, None,
            )  # fmt: skip
            root.handle(record)
            logging.getLogger("export").info("export: wrote net.onnx (1.0 s)")
        logging.getLogger("onnxscript.rewriter").info("after the block")
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)
    assert console.getvalue().splitlines() == ["export: wrote net.onnx (1.0 s)", "after the block"]
    logged = file_path.read_text()
    assert "Replaced initializer" in logged and "pre-processing" in logged
    assert "Applied 714" in logged and "export: wrote" in logged


def test_summary_names_parity_int8_and_files(tmp_path) -> None:
    onnx, int8 = tmp_path / "net.onnx", tmp_path / "net.int8.onnx"
    onnx.write_bytes(b"x" * 1_250_000)
    int8.write_bytes(b"x" * 2_000)
    card = {
        "model": {"class": "src.models.dicenet.DiCENet"},
        "params": 1_234_567,
        "checkpoint": None,
        "parity": {
            "inputs": "16 images of the validation split",
            "checks": [
                {"shapes": [[16, 3, 224, 224]], "max_abs": 7.3e-11, "max_rel": 5.6e-7},
                {"shapes": [[16, 3, 256, 288]], "max_abs": 1.0e-10, "max_rel": 6.1e-7},
            ],
        },
        "int8": {
            "calibration_images": 128,
            "calibrated_on": "images of the training split",
            "split": "val",
            "metric": {
                "eager": {"accuracy": 97.04},
                "fp32_onnx": {"accuracy": 97.04},
                "int8_onnx": {"accuracy": 96.3},
            },
        },
        "wall_time_s": 81.25,
    }
    lines = summary(card, [onnx, int8]).splitlines()
    assert lines == [
        "exported DiCENet (1,234,567 parameters, random weights)",
        "parity against eager PyTorch on 16 images of the validation split:",
        "  224x224    max abs 7.3e-11, max rel 5.6e-07",
        "  256x288    max abs 1e-10, max rel 6.1e-07",
        "int8: calibrated on 128 images of the training split",
        "  on the validation split: accuracy eager 97.04%, fp32_onnx 97.04%, int8_onnx 96.30%",
        "files:",
        f"  {onnx}       1.25 MB",
        f"  {int8}  2.0 KB",
        "took 81.2 s",
    ]
