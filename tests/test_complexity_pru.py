"""``complexity.py`` on the PRU language model's configs: every PTB and WikiText-2 row of the
official parameter counts (``pru/params.json``, the official RNNModel instantiated) from the
Table 4.1 experiments and the data configs alone, no corpus on disk."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from src.build import build_task
from src.commands.complexity import report
from src.utils.complexity import count_params
from tests.conftest import compose_config
from tests.parity.reference import reference_dir

DATA = {"PTB": "ptb", "WT2": "wikitext2"}


def official_rows() -> list:
    path = reference_dir() / "pru" / "params.json"
    if not path.is_file():
        reason = f"{path} absent; set REFERENCE_DIR to the folder holding pru/params.json"
        return [pytest.param(None, id="params-absent", marks=pytest.mark.skip(reason=reason))]
    rows = json.loads(path.read_text())["rows"]
    return [
        pytest.param(
            row, id=f"{row['dataset']}-{row['model'].split()[0]}-g{row['g']}-M{row['M(hidden)']}"
        )
        for row in rows
    ]


def experiment(row: dict[str, Any]) -> str:
    """The Table 4.1 experiment of a params.json row (standard dropout; AWD rows count the same)."""
    if row["model"] == "LSTM":
        return f"pru_lm/table4_1_lstm_m{row['M(hidden)']}"
    return f"pru_lm/table4_1_pru_g{row['g']}_m{row['M(hidden)']}"


@pytest.mark.parametrize("row", official_rows())
def test_complexity_py_reproduces_official_params(row: dict[str, Any], tmp_path) -> None:
    overrides = [f"experiment={experiment(row)}", f"data={DATA[row['dataset']]}"]
    cfg = compose_config("complexity", overrides, tmp_path)
    assert cfg.data.vocab_size == row["vocab"]
    assert (cfg.model.embedding_dim, cfg.model.num_layers) == (row["emsize"], row["layers"])
    if row["K"] is not None:
        assert (cfg.model.groups, cfg.model.levels) == (row["g"], row["K"])
    with torch.device("meta"):  # complexity.py's build and count, without filling 20-42 M weights
        _, task = build_task(cfg)
    assert count_params(task.net) == row["total_params"]


def test_the_issue_command_prints_the_awd_pru(tmp_path) -> None:
    """``python complexity.py data=ptb model=awd_lm``: AWD-PRU g = 4, K = 2, M = 1400."""
    cfg = compose_config("complexity", ["data=ptb", "model=awd_lm"], tmp_path)
    assert report(cfg)["params"] == 18_895_600
    lstm = ["data=ptb", "model=awd_lm", "model.rnn=lstm", "model.hidden_size=1000"]
    with torch.device("meta"):
        _, task = build_task(compose_config("complexity", lstm, tmp_path))
    assert count_params(task.net) == 19_869_200
