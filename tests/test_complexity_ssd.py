"""``complexity.py model=ssd data=voc_det model.scale=2.0``: ESPNetv2-SSD at 300 and 512
beside the EdgeNets model zoo (params within 1%, conv MACs within 5%), and DiCENet-SSD's row."""

from __future__ import annotations

from src.commands.complexity import report, table
from tests.conftest import compose_config


def test_espnetv2_ssd_beside_the_model_zoo(tmp_path) -> None:
    """The VOC rows (the COCO counts are tests/models/test_ssd.py's)."""
    overrides = ["model=ssd", "data=voc_det", "model.scale=2.0"]
    cfg = compose_config("complexity", overrides, tmp_path)
    result = report(cfg)
    sizes = result["ssd_sizes"]
    assert [row["image_size"] for row in sizes] == [300, 512]
    assert sizes[0]["macs_conv"] == result["macs_conv"]  # the configured size, counted once more
    for row in sizes:
        zoo_params, zoo_flops, source = row["reported"]
        assert source == "EdgeNets model zoo"
        assert row["params"] == 4_745_668 and abs(row["params"] / 1e6 / zoo_params - 1) < 0.01
        # the zoo truncates to one decimal (0.913 -> 0.9): within 0.1 B above, 5% of ours
        assert 0 <= row["macs_conv"] / 1e9 - zoo_flops < 0.1
        assert abs(row["macs_conv"] / 1e9 / zoo_flops - 1) < 0.06
    assert tuple(row["macs_conv"] for row in sizes) == (913_125_567, 2_519_261_184)
    printed = table(result)
    assert "SSD300" in printed and "SSD512" in printed and "EdgeNets model zoo: " in printed


def test_dicenet_ssd_names_the_thesis_row(tmp_path) -> None:
    overrides = ["experiment=detection/ssd_dicenet_300", "data=coco_det"]
    result = report(compose_config("complexity", overrides, tmp_path))
    at_300, at_512 = result["ssd_sizes"]
    assert at_300["reported"] == (5.0, 0.9, "thesis Table 3.6(a), params 'about 5 M'")
    assert at_512["reported"] is None and "none published" in table(result)
    assert round(at_300["params"] / 1e6, 2) == 7.51 and round(at_300["macs_conv"] / 1e9, 2) == 1.26
