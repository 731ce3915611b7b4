"""``python export.py``: options that cannot work stop with one line."""

from __future__ import annotations

import importlib.util

import pytest

from src.commands.export import export
from src.export.images import NoCalibrationImagesError
from src.utils.errors import UsageError
from src.utils.extras import MissingExtraError
from tests.conftest import compose_config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["format=tflite", "allow_random=true"],
            "format must be one of ['onnx', 'executorch'], got 'tflite'",
        ),
        (["quantize=int4", "allow_random=true"], "quantize must be null or 'int8', got 'int4'"),
        (["nms=true", "allow_random=true"], "nms=true puts SSD's post-processing into"),
        ([], "no weights: pass ckpt_path="),
        (["ckpt_path=/no/such.ckpt"], "checkpoint /no/such.ckpt does not exist"),
        (
            ["calibration_images=0", "allow_random=true"],
            "calibration_images must be a whole number of images >= 1 (128 by default), got 0",
        ),
        (["calibration_images=2.5", "allow_random=true"], "got 2.5"),
        (["calibration_images=many", "allow_random=true"], "got 'many'"),
        (
            ["images=/no/such/folder", "allow_random=true"],
            "images=/no/such/folder is not a folder; pass images=<a folder of images>",
        ),
    ],
)
def test_bad_option_is_one_line(tmp_path, overrides: list[str], message: str) -> None:
    cfg = compose_config("export", overrides, tmp_path)
    with pytest.raises(UsageError) as raised:
        export(cfg)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_int8_without_images_names_the_fix(tmp_path) -> None:
    overrides = ["data=imagenet", f"data.root={tmp_path / 'no_imagenet'}", "model.scale=0.2",
                 "allow_random=true", "quantize=int8", f"out={tmp_path / 'net'}"]  # fmt: skip
    with pytest.raises(NoCalibrationImagesError) as raised:
        export(compose_config("export", overrides, tmp_path))
    message = str(raised.value)
    assert message.startswith(
        "quantize=int8 calibrates on images and there are none (dataset root "
    )
    assert "pass images=DIR" in message and "\n" not in message
    assert not list(tmp_path.glob("net*"))  # stopped before exporting anything


@pytest.mark.skipif(
    importlib.util.find_spec("executorch") is not None, reason="executorch is installed"
)
def test_missing_executorch_names_the_documented_install(tmp_path) -> None:
    cfg = compose_config("export", ["format=executorch", "allow_random=true"], tmp_path)
    with pytest.raises(MissingExtraError) as raised:
        export(cfg)
    assert str(raised.value).startswith(
        "format=executorch needs executorch, which is not installed: pip install executorch ("
    )
