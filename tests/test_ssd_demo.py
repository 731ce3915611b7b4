"""The SSD demo pipeline end to end at a small size: ``train.py experiment=detection/ssd_demo`` on
fewer coins crops and epochs. The untrained network's validation VOC07 mAP is near 0; a few epochs
take it well above, and ``predict.py`` with the best checkpoint then finds coins on the
photograph."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from PIL import Image

from src.commands.predict import predict
from src.commands.train import train
from tests.conftest import compose_config


@pytest.mark.slow
def test_the_demo_learns_to_find_coins(tmp_path) -> None:
    small = [
        "experiment=detection/ssd_demo", f"data.root={tmp_path / 'coins'}", "data.num_train=48",
        "data.num_test=16", "trainer.max_epochs=6", "callbacks.progress_bar=null",
    ]  # fmt: skip
    cfg = compose_config("train", small, tmp_path / "train")
    trained = train(cfg)
    (log,) = Path(cfg.paths.output_dir).glob("csv/version_*/metrics.csv")
    with log.open() as f:
        maps = [float(row["val/map"]) for row in csv.DictReader(f) if row.get("val/map")]
    assert len(maps) == 6 and maps[0] < 0.05  # one epoch from random weights: next to nothing
    assert trained["metrics"]["best_val/map"] > 0.15  # 0.39 (2 threads), 0.50 (1 thread) measured
    assert trained["metrics"]["test/map"] == pytest.approx(trained["metrics"]["best_val/map"])

    from skimage import data

    photo = tmp_path / "coins.png"
    Image.fromarray(data.coins()).save(photo)
    overrides = [
        f"ckpt_path={trained['best_checkpoint']}", f"image={photo}",
        f"output={tmp_path / 'found.png'}", "score_threshold=0.3",
    ]  # fmt: skip
    found = predict(compose_config("predict", overrides, tmp_path / "predict"))
    assert 3 <= len(found["detections"]) <= 100 and (tmp_path / "found.png").is_file()
