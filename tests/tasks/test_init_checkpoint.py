"""Every task starts from other weights with ``task.init_checkpoint`` (averaged and exported
checkpoints too, and official release files through ``src.compat``), a file that does not fit is
one line naming it, and ``ckpt_path=`` with a weights-only checkpoint says to use it."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from src.build import build_task
from src.commands.train import train
from src.compat import load_official
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.models.segmentation import espnetv2_segmentation
from src.models.ssd import SSD
from src.tasks.detection import DetectionTask
from src.tasks.finetune import InitCheckpointError, load_network_weights
from src.tasks.segmentation import SegmentationTask
from src.utils.errors import UserError
from src.utils.run_record import CheckpointError
from tests.compat.official_files import official_file
from tests.conftest import compose_config
from tests.parity.reference import reference_dir

# each task on its embedded data (no download), with the task's default model
EMBEDDED = {
    "classification": "digits",
    "char_lm": "pydoc_chars",
    "word_lm": "pydoc_words",
    "awd_lm": "pydoc_ptb",
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
def test_init_checkpoint_loads_the_network_when_fitting_starts(
    task_name: str, tmp_path: Path
) -> None:
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
    overrides = ["experiment=delight_mt/demo"]
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


SGD = functools.partial(torch.optim.SGD, lr=0.1)


def test_init_checkpoint_takes_an_official_file(tmp_path: Path) -> None:
    """``task.init_checkpoint=<official .pth>`` fills the composed DiCENet through the converter."""
    torch.manual_seed(0)
    _, donor = build_task(compose_config("train", ["data=digits", "model=dicenet"], tmp_path / "a"))
    path = tmp_path / "dicenet_s_0.5_imagenet.pth"
    saved = official_file(donor.net, path)
    torch.manual_seed(1)
    overrides = ["data=digits", "model=dicenet", f"task.init_checkpoint={path}"]
    _, task = build_task(compose_config("train", overrides, tmp_path / "b"))
    task.setup("fit")
    for key, value in task.net.state_dict().items():
        assert torch.equal(value, saved[key]), key


def test_official_segmentation_weights_initialise_the_segmentation_task() -> None:
    weights = reference_dir() / "edgenets" / "weights" / "espnetv2_s_0.5_pascal_256x256.pth"
    if not weights.is_file():
        pytest.skip(f"no official EdgeNets weights {weights}; set REFERENCE_DIR")
    expected = espnetv2_segmentation(0.5, 21)
    load_official(expected, weights)
    net = espnetv2_segmentation(0.5, 21)
    task = SegmentationTask(net, 21, SGD, init_checkpoint=str(weights))
    task.setup("fit")
    for key, value in expected.state_dict().items():
        assert torch.equal(task.net.state_dict()[key], value), key


def test_ssd_backbone_from_an_imagenet_classifier(tmp_path: Path) -> None:
    """An official ImageNet ESPNetv2 file or this project's classifier checkpoint (any number of
    classes) fills the SSD's backbone and head_conv; the neck and heads keep their init."""
    torch.manual_seed(0)
    official = tmp_path / "espnetv2_s_0.5_imagenet_224x224.pth"
    imagenet = official_file(ESPNetv2(0.5, num_classes=1000), official)
    classifier = ESPNetv2(0.5, num_classes=10)
    checkpoint = tmp_path / "classifier.ckpt"
    state = {f"net.{k}": v for k, v in classifier.state_dict().items()}
    torch.save({"state_dict": state}, checkpoint)
    for path, source in ((official, imagenet), (checkpoint, classifier.state_dict())):
        torch.manual_seed(1)
        task = DetectionTask(SSD(2, scale=0.5), SGD, init_checkpoint=str(path))
        fresh = {k: v.clone() for k, v in task.net.state_dict().items()}
        task.setup("fit")
        state = task.net.state_dict()
        backbone = [k for k in state if k.startswith(("backbone.", "head_conv."))]
        assert len(backbone) > 100
        assert all(torch.equal(state[k], source[k]) for k in backbone)
        assert torch.equal(state["cls_heads.0.weight"], fresh["cls_heads.0.weight"])


def test_a_file_that_does_not_fit_is_one_line_naming_it(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not weights\n")
    official = tmp_path / "espnetv2_s_0.5_imagenet_224x224.pth"
    official_file(ESPNetv2(0.5, num_classes=1000), official)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weight": torch.zeros(1)}, foreign)
    cases = [
        (DiCENet(0.5, num_classes=10), text, f"init_checkpoint={text} is not a weights file"),
        (
            DiCENet(0.5, num_classes=10),
            official,
            (
                f"init_checkpoint={official} is neither a checkpoint of this project for DiCENet "
                "nor official EdgeNets weights for it: official state dict does not match: "
                "missing ["
            ),
        ),
        (
            ESPNetv2(1.0, num_classes=1000),
            official,
            (
                f"init_checkpoint={official} is neither a checkpoint of this project for ESPNetv2 "
                "nor official EdgeNets weights for it: "
            ),
        ),
        (torch.nn.Conv2d(3, 2, 1), foreign, f"init_checkpoint={foreign} does not fit Conv2d: "),
    ]
    for net, path, start in cases:
        with pytest.raises(InitCheckpointError) as error:
            load_network_weights(net, path)
        message = str(error.value)
        assert isinstance(error.value, UserError) and message.startswith(start), message
        assert len(message.splitlines()) == 1 and len(message) < 800, message
    missing = tmp_path / "none.pth"
    with pytest.raises(FileNotFoundError, match=f"init_checkpoint={missing}: no such file"):
        load_network_weights(DiCENet(0.5, num_classes=10), missing)
