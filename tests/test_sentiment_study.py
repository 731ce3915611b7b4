"""sentiment_study.py turns run directories into the study's tables and curve plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from src.commands.sentiment_study import load_runs, main, variant_of

DELIGHT = "src.models.text_classifier.DeLighTClassifier"
TRANSFORMER = "src.models.text_classifier.TransformerClassifier"


def fake_run(
    folder: Path, model: dict, seed: int, acc: float, params: int, curve: list[float]
) -> None:
    """A run directory as train.py writes it: metrics.json, .hydra/config.yaml, the CSV log."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "model": model}))
    summary = {"status": "finished", "params": params, "wall_time_s": 10.0 + seed,
               "metrics": {"test/acc": acc, "test/f1": acc - 0.1}}  # fmt: skip
    (folder / "metrics.json").write_text(json.dumps(summary))
    log = folder / "csv" / "version_0"
    log.mkdir(parents=True)
    rows = ["epoch,step,test_epoch/acc,train/loss"]
    rows += [
        f"{epoch},{epoch * 10},{value},\n{epoch},{epoch * 10 + 5},,0.5".rstrip()
        for epoch, value in enumerate(curve)
    ]
    (log / "metrics.csv").write_text("\n".join(rows) + "\n")


def test_variant_names_follow_the_report() -> None:
    assert (
        variant_of({"_target_": DELIGHT, "block_scaling": True, "glt_shuffle": True})[0]
        == "DeLighT Scale+Shift"
    )
    assert variant_of({"_target_": DELIGHT, "block_scaling": False, "glt_shuffle": False}) == (
        "DeLighT",
        "block_scaling=false glt_shuffle=false",
    )
    assert variant_of({"_target_": TRANSFORMER, "dim_feedforward": 96})[0] == "Transformer"
    with pytest.raises(ValueError, match="not a model of the study"):
        variant_of({"_target_": "src.models.delight_mt.DeLighTEncoderDecoder"})


def test_tables_and_plot(tmp_path, capsys) -> None:
    shift = {"_target_": DELIGHT, "block_scaling": False, "glt_shuffle": True}
    transformer = {"_target_": TRANSFORMER, "dim_feedforward": 96}
    for seed, acc in zip((1, 2, 3), (0.60, 0.62, 0.64)):
        fake_run(tmp_path / "runs" / f"s{seed}", shift, seed, acc, 218_195, [0.5, acc])
    fake_run(tmp_path / "runs" / "t1", transformer, 1, 0.55, 216_227, [0.45, 0.55])
    (tmp_path / "runs" / "unfinished" / ".hydra").mkdir(parents=True)
    (tmp_path / "runs" / "unfinished" / "metrics.json").write_text('{"status": "interrupted"}')
    runs = load_runs([tmp_path / "runs"])
    assert len(runs) == 4 and runs[0].curve == {0: 0.5, 1: 0.6}
    text = main([str(tmp_path / "runs"), "--out", str(tmp_path / "docs")])
    assert (
        "| DeLighT Shift | block_scaling=false glt_shuffle=true | 218,195 | 224,701 "
        "| 12.0 ± 1.0 | 2,206 |" in text
    )
    # accuracy mean ± sample std over the seeds: 62.00 ± 2.00; F1 10 points lower
    assert (
        "| DeLighT Shift | 3 | 62.00 ± 2.00 | 52.00 ± 2.00 | 1: 60.00, 2: 62.00, 3: 64.00 |" in text
    )
    assert "| Transformer | 1 | 55.00 ± 0.00 |" in text
    assert text.index("DeLighT Shift") < text.index("Transformer")  # the report's order
    plot = tmp_path / "docs" / "delight_sentiment_accuracy.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
    assert "62.00 ± 2.00" in capsys.readouterr().out
