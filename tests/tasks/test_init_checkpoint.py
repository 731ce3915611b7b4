"""Every task starts from other weights with ``task.init_checkpoint`` (averaged and exported
checkpoints too), and ``ckpt_path=`` with a weights-only checkpoint says to use it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from src.build import build_task
from src.utils.run_record import CheckpointError
from tests.conftest import compose_config
from src.commands.train import train

# each task on its embedded data (no download), with the task's default model
EMBEDDED = {
    "classification": "digits",
    "language_model": "pydoc_chars",
    "word_language_model": "pydoc_words",
    "awd_language_model": "pydoc_ptb",
    "text_classification": "sentiment_tweets",
    "translation": "gettext_de_en",
}


def weights_only(task: torch.nn.Module, path: Path) -> dict[str, torch.Tensor]:
    """Save ``task``'s network as an averaged checkpoint does (a state dict, no optimiser state)
    and return the saved network state."""
    state = {f"net.{k}": v.detach().clone() for k, v in task.net.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3}, path)
    return state


@pytest.mark.parametrize("task_name", list(EMBEDDED))
def test_init_checkpoint_loads_the_network_when_fitting_starts(task_name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    overrides = [f"data={EMBEDDED[task_name]}"]
    _, donor = build_task(compose_config("train", overrides, tmp_path / "a"))
    path = tmp_path / "averaged.ckpt"
    saved = weights_only(donor, path)
    torch.manual_seed(1)  # another initialisation
    cfg = compose_config("train", [*overrides, f"task.init_checkpoint={path}"], tmp_path / "b")
    _, task = build_task(cfg)
    floats = [k for k, v in saved.items() if v.is_floating_point() and v.numel() > 1]
    assert floats and not torch.equal(task.net.state_dict()[floats[0][4:]], saved[floats[0]])
    task.setup("fit")
    for key, value in task.net.state_dict().items():
        assert torch.equal(value, saved[f"net.{key}"]), key


def test_a_weights_only_checkpoint_cannot_resume_and_names_init_checkpoint(tmp_path: Path) -> None:
    overrides = ["experiment=delight_mt_demo"]
    _, task = build_task(compose_config("train", overrides, tmp_path / "a"))
    path = tmp_path / "averaged.ckpt"
    weights_only(task, path)
    cfg = compose_config("train", [*overrides, f"ckpt_path={path}"], tmp_path / "b")
    with pytest.raises(CheckpointError) as error:
        train(cfg)
    assert str(error.value) == (
        f"ckpt_path={path} holds network weights only (no optimiser state: an averaged, exported "
        f"or weights-only checkpoint), so it cannot resume a run; to start a new run from these "
        f"weights pass task.init_checkpoint={path} instead"
    )
