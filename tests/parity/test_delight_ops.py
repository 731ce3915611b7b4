"""Official DeLighT parity: GLT and DExTra built from the fixtures' own config and state dict.

The fixtures (README of the reference folder) hold the official module's eval-mode output in float32
and, from the same module cast to float64, ``output_float64``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from src.compat.delight import dextra_from_official, from_official, glt_from_official
from src.ops.dextra import dextra_max_groups, dextra_schedule
from tests.parity.reference import fixtures, load


def _check(module: torch.nn.Module, data: dict) -> None:
    module.eval()
    with torch.no_grad():
        y32 = module(data["input"].float())
        y64 = module.double()(data["input"].double())
    assert y32.shape == data["output"].shape
    assert (y32 - data["output"]).abs().max().item() <= 1e-5
    assert (y64 - data["output_float64"]).abs().max().item() <= 1e-10


@pytest.mark.parametrize("path", fixtures("delight", "glt_*.pt"))
def test_glt_matches_official(path: Path) -> None:
    data = load(path)
    _check(glt_from_official(data["state_dict"], data["config"]), data)


@pytest.mark.parametrize("path", fixtures("delight", "dextra_*.pt"))
def test_dextra_matches_official(path: Path) -> None:
    data = load(path)
    config = data["config"]
    unit = dextra_from_official(data["state_dict"], config)
    assert list(unit.plan.groups) == config["groups_per_layer"]
    assert [(layer["in"], layer["out"]) for layer in config["glt_layers"]] == list(
        zip(unit.plan.in_widths, unit.plan.out_widths, strict=True)
    )
    assert sum(p.numel() for p in unit.parameters()) == config["num_params"]
    _check(unit, data)


@pytest.mark.parametrize(
    "path", fixtures("delight", "glt_*.pt") + fixtures("delight", "dextra_*.pt")
)
def test_from_official_dispatches_on_the_config(path: Path) -> None:
    data = load(path)
    expected = dextra_from_official if path.name.startswith("dextra") else glt_from_official
    module = from_official(data["state_dict"], data["config"])
    assert type(module) is type(expected(data["state_dict"], data["config"]))


def test_from_official_rejects_other_configs() -> None:
    with pytest.raises(ValueError, match="neither a DExTra unit"):
        from_official({}, {"module": "TransformerEncoderLayer"})


@pytest.mark.parametrize("path", fixtures("delight", "dextra_config_table.json"))
def test_schedule_matches_official_table(path: Path) -> None:
    rows = json.loads(path.read_text())["rows"]
    assert rows
    for row in rows:
        plan = dextra_schedule(
            row["in_proj_features"],
            row["width_multiplier"] * row["in_features"],  # d_max, official max_features
            row["out_features"],
            depth=row["N"],
            max_groups=row["max_groups"],
        )
        assert (list(plan.groups), list(plan.in_widths), list(plan.out_widths)) == (
            row["groups"],
            row["glt_in"],
            row["glt_out"],
        ), row
        assert dextra_max_groups(row["d_m"]) == row["max_groups"], row
