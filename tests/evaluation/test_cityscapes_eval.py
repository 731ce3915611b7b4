"""Our Cityscapes mIoU against the official cityscapesScripts on a generated gtFine tree, and the
full-resolution evaluation path."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import Tensor, nn
from torchmetrics.classification import MulticlassJaccardIndex

from src.build import build_trainer
from src.commands.eval import check_official_eval
from src.datamodules.cityscapes import CityscapesDataModule, train_id_table
from src.evaluation.cityscapes_eval import (
    OfficialEvalError,
    evaluate_cityscapes,
    full_size_prediction,
    label_id_table,
    official_scores,
    prediction_file,
    write_label_ids,
)
from src.tasks.segmentation import SegmentationTask
from src.utils.errors import UsageError
from tests.conftest import compose_config

official = pytest.importorskip(
    "cityscapesscripts.evaluation.evalPixelLevelSemanticLabeling",
    reason="the official Cityscapes evaluation needs cityscapesScripts: "
    "pip install -e '.[official-eval]'",
)

H, W = 32, 64  # the stored label size of the generated tree
CITIES = ("aachen", "bonn")
# (background_class, num_classes, ignore_index): the EdgeNets layout and the standard 19 classes
LAYOUTS = [(True, 20, 19), (False, 19, 255)]


def label_file(root: Path, split: str, stem: str) -> Path:
    return root / "gtFine" / split / stem.split("_")[0] / f"{stem}_gtFine_labelIds.png"


def make_tree(
    root: Path, rng: np.random.Generator, per_city: int = 1, label_ids: int = 34
) -> list[Path]:
    """leftImg8bit/gtFine train and val of ``per_city`` frames per city: random RGB images and
    random label ids 0..label_ids-1 (void ids included); returns the val label files."""
    files = []
    for split in ("train", "val"):
        for city in CITIES:
            for i in range(per_city):
                stem = f"{city}_000000_{i:06d}"
                image = root / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png"
                label = label_file(root, split, stem)
                image.parent.mkdir(parents=True, exist_ok=True)
                label.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8)).save(image)
                ids = rng.integers(0, label_ids, (H, W), dtype=np.uint8)
                Image.fromarray(ids).save(label)  # one channel of label ids
                if split == "val":
                    files.append(label)
    return files


def read_ids(path: Path) -> Tensor:
    with Image.open(path) as image:
        return torch.from_numpy(np.array(image)).long()


def ours(
    predictions: list[Tensor],
    label_files: list[Path],
    num_classes: int,
    ignore_index: int,
    average: str = "macro",
) -> Tensor:
    """mIoU as SegmentationTask computes it: train ids of the datamodule's table, torchmetrics'
    Jaccard index accumulated over the images."""
    table = train_id_table(background_class=num_classes == 20)
    metric = MulticlassJaccardIndex(num_classes, average=average, ignore_index=ignore_index)
    for prediction, label in zip(predictions, label_files):
        metric.update(prediction[None], table[read_ids(label)][None])
    return metric.compute()


def official_of(predictions: list[Tensor], label_files: list[Path], out_dir: Path) -> dict:
    """The official script's result for train-id predictions, written as label-id PNGs."""
    files = []
    for prediction, label in zip(predictions, label_files):
        path = prediction_file(out_dir, label)
        write_label_ids(prediction, path)
        files.append(path)
    return official_scores(files, label_files)


def noisy_predictions(
    label_files: list[Path], num_classes: int, rng: np.random.Generator, keep: float = 0.6
) -> list[Tensor]:
    """The true train ids on a ``keep`` share of the pixels, random classes elsewhere (background
    included in the 20-class layout); void pixels get a random class."""
    table = train_id_table(background_class=num_classes == 20)
    predictions = []
    for label in label_files:
        truth = table[read_ids(label)]
        noise = torch.from_numpy(rng.integers(0, num_classes, (H, W)))
        kept = torch.from_numpy(rng.random((H, W)) < keep) & (truth < num_classes)
        predictions.append(torch.where(kept, truth, noise))
    return predictions


def test_label_id_table_inverts_the_train_id_table() -> None:
    to_label, to_train = label_id_table(), train_id_table(background_class=True)
    for train_id in range(19):
        assert to_train[int(to_label[train_id])] == train_id
    assert to_label[19] == to_label[255] == 0  # background and ignore: "unlabeled"
    assert (to_label[0], to_label[13], to_label[18]) == (7, 26, 33)  # road, car, bicycle


def test_predictions_are_named_as_the_official_script_pairs_them(tmp_path: Path) -> None:
    label_files = make_tree(tmp_path / "cityscapes", np.random.default_rng(0))
    out_dir = tmp_path / "predictions"
    for label in label_files:
        write_label_ids(torch.zeros(H, W, dtype=torch.long), prediction_file(out_dir, label))
    args = official.CArgs()
    vars(args).update(vars(official.args))
    args.predictionPath, args.predictionWalk = str(out_dir), None
    for label in label_files:
        assert official.getPrediction(args, str(label)) == str(prediction_file(out_dir, label))
        with Image.open(prediction_file(out_dir, label)) as written:
            assert written.mode == "L" and written.size == (W, H)
            assert (np.array(written) == 7).all()  # train id 0 is stored as label id 7 (road)


@pytest.mark.parametrize(("background_class", "num_classes", "ignore_index"), LAYOUTS)
def test_our_miou_equals_the_official_one_on_random_labels(
    tmp_path: Path, background_class: bool, num_classes: int, ignore_index: int
) -> None:
    """Random label ids 0..33 (void ones too) and predictions right on 60 % of the pixels."""
    rng = np.random.default_rng(1)
    label_files = make_tree(tmp_path / "cityscapes", rng, per_city=2)
    predictions = noisy_predictions(label_files, num_classes, rng)
    result = official_of(predictions, label_files, tmp_path / "predictions")
    mine = ours(predictions, label_files, num_classes, ignore_index)
    assert 0.2 < result["averageScoreClasses"] < 0.9
    assert mine.item() == pytest.approx(result["averageScoreClasses"], abs=1e-6)


@pytest.mark.parametrize(("background_class", "num_classes", "ignore_index"), LAYOUTS)
def test_absent_classes_are_left_out_of_both_means(
    tmp_path: Path, background_class: bool, num_classes: int, ignore_index: int
) -> None:
    """Ground truth of label ids 0..8 only (void 0..6, road 7, sidewalk 8): a class predicted but
    absent from the ground truth scores 0 in both means, a class neither in the ground truth nor
    predicted on a scored pixel is left out of both (official IoU NaN; torchmetrics weight 0 with
    IoU 0 in its per-class vector), and predictions on void pixels count nowhere."""
    rng = np.random.default_rng(2)
    label_files = make_tree(tmp_path / "cityscapes", rng, per_city=1, label_ids=9)
    table = train_id_table(background_class)
    predictions = []
    for label in label_files:
        truth = table[read_ids(label)]
        pole = torch.full_like(truth, 5)
        prediction = torch.where(truth < 19, truth, pole)  # pole on the void pixels
        prediction[:4] = 13  # car, absent from the ground truth
        if background_class:
            prediction[-4:, : W // 2] = 19  # background predicted on labelled pixels: misses
        predictions.append(prediction)
    result = official_of(predictions, label_files, tmp_path / "predictions")
    per_class = ours(predictions, label_files, num_classes, ignore_index, average="none")
    scores = result["classScores"]
    assert math.isnan(scores["pole"])  # predicted on void pixels only
    assert scores["car"] == 0.0 and 0 < scores["road"] < 1 and 0 < scores["sidewalk"] < 1
    scored = {"road": 0, "sidewalk": 1, "car": 13}
    for name, train_id in scored.items():
        assert per_class[train_id].item() == pytest.approx(scores[name], abs=1e-6)
    assert result["averageScoreClasses"] == pytest.approx(sum(scores[n] for n in scored) / 3)
    mine = ours(predictions, label_files, num_classes, ignore_index)
    assert mine.item() == pytest.approx(result["averageScoreClasses"], abs=1e-6)


def test_full_size_prediction_upsamples_the_logits() -> None:
    logits = torch.zeros(20, 4, 8)
    logits[3, :, :4] = 1.0  # class 3 on the left half, class 7 on the right
    logits[7, :, 4:] = 1.0
    train_ids = full_size_prediction(logits, (16, 32))
    assert train_ids.shape == (16, 32) and train_ids.dtype == torch.int64
    assert (train_ids[:, :16] == 3).all() and (train_ids[:, 16:] == 7).all()
    assert full_size_prediction(logits, (4, 8)).equal(logits.argmax(dim=0))


class HalfResolutionNet(nn.Module):
    """A fixed random convolution that returns logits at half the input size."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, num_classes, 3, stride=2, padding=1)

    def forward(self, images: Tensor) -> Tensor:
        return self.conv(images)


@pytest.mark.parametrize(("background_class", "num_classes", "ignore_index"), LAYOUTS)
def test_full_resolution_validation_equals_the_official_score(
    tmp_path: Path, background_class: bool, num_classes: int, ignore_index: int
) -> None:
    """With ``eval_full_resolution`` the network sees images resized to ``crop_size`` while the
    masks keep their stored size; the task's val/mIoU then equals the official script's score of
    the same network's predictions written at full size."""
    root = tmp_path / "cityscapes"
    make_tree(root, np.random.default_rng(3), per_city=2)
    dm = CityscapesDataModule(
        str(root), num_classes, crop_size=(16, 32), batch_size=3, num_workers=0,
        background_class=background_class, ignore_index=ignore_index, eval_full_resolution=True,
    )  # fmt: skip
    dm.setup("validate")
    images, masks = next(iter(dm.val_dataloader()))
    assert images.shape == (3, 3, 16, 32) and masks.shape == (3, H, W)
    first = Path(dm.splits["val"].targets[0][0])
    assert masks[0].equal(train_id_table(background_class)[read_ids(first)])
    task = SegmentationTask(
        HalfResolutionNet(num_classes), num_classes, functools.partial(torch.optim.SGD, lr=0.1),
        ignore_index=ignore_index,
    )  # fmt: skip
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    ours_full = trainer.validate(task, datamodule=dm, verbose=False)[0]["val/mIoU"]
    result = evaluate_cityscapes(
        task.eval(), dm.splits["val"], tmp_path / "predictions", batch_size=3
    )
    assert len(list((tmp_path / "predictions").rglob("*_pred_labelIds.png"))) == 4
    assert not math.isnan(result["averageScoreClasses"])
    assert ours_full == pytest.approx(result["averageScoreClasses"], abs=1e-6)


def test_a_prediction_of_the_wrong_size_stops_with_the_scripts_message(tmp_path: Path) -> None:
    label_files = make_tree(tmp_path / "cityscapes", np.random.default_rng(4))
    predictions = tmp_path / "predictions"
    files = [prediction_file(predictions, label) for label in label_files]
    write_label_ids(torch.zeros(H, W, dtype=torch.long), files[0])
    write_label_ids(torch.zeros(H // 2, W // 2, dtype=torch.long), files[1])
    with pytest.raises(OfficialEvalError, match="Image widths of .* are not equal"):
        official_scores(files, label_files)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"official_eval": "yes"}, "must be true or false"),
        ({"split": "test"}, "pass split=val"),
    ],
)
def test_official_eval_options_are_checked_first(
    tmp_path: Path, overrides: dict, message: str
) -> None:
    cfg = OmegaConf.create({"official_eval": True, "split": "val", **overrides})
    dm = CityscapesDataModule(str(tmp_path), num_workers=0)
    task = SegmentationTask(HalfResolutionNet(20), 20, functools.partial(torch.optim.SGD, lr=0.1))
    with pytest.raises(UsageError, match=message):
        check_official_eval(cfg, task, dm)


def test_official_eval_needs_cityscapes_segmentation() -> None:
    cfg = OmegaConf.create({"official_eval": True, "split": "val"})
    with pytest.raises(UsageError, match="segmentation checkpoint with data=cityscapes"):
        check_official_eval(cfg, L.LightningModule(), L.LightningDataModule())


def test_eval_with_data_cityscapes_builds_no_partial_callback(tmp_path: Path) -> None:
    """eval.yaml composes no callbacks; the recipe's checkpoint monitor must not reach the
    Trainer."""
    cfg = compose_config("eval", ["ckpt_path=x.ckpt", "data=cityscapes"], tmp_path)
    assert "_target_" not in cfg.callbacks.model_checkpoint  # the recipe's monitor alone
    trainer = build_trainer(cfg)
    assert not any(isinstance(c, DictConfig) for c in trainer.callbacks)
