"""``python export.py``: options that cannot work stop with one line."""

from __future__ import annotations

import pytest

from src.commands.export import export
from src.utils.errors import UsageError
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
    ],
)
def test_bad_option_is_one_line(tmp_path, overrides: list[str], message: str) -> None:
    cfg = compose_config("export", overrides, tmp_path)
    with pytest.raises(UsageError) as raised:
        export(cfg)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
