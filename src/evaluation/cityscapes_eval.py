"""Cityscapes pixel-level semantic labelling scored by the official ``cityscapesScripts``
(``cityscapesscripts.evaluation.evalPixelLevelSemanticLabeling``), the numbers the EdgeNets and
ESPNet papers report.

Predictions are written as the benchmark expects them: one single-channel PNG of Cityscapes
label ids (not train ids) per image, at the size of its ``gtFine/.../*_gtFine_labelIds.png``,
named ``<city>_<seq>_<frame>_pred_labelIds.png`` (the script pairs ``<city>_<seq>_<frame>*.png``
with the ground truth of that name). Train ids 0..18 become their label ids through torchvision's
``Cityscapes.classes`` table; background (19) and ignore (255) become 0 (``unlabeled``), as the
official EdgeNets ``test_segmentation.py`` does.

The official class IoU is ``tp / (tp + fp + fn)`` from one confusion matrix over all images: ground
truth pixels of a label with ``ignoreInEval`` (void, ego vehicle, ...) are left out, a prediction
of such a label on a scored pixel is a miss of its class, and a class with neither ground truth
nor prediction on scored pixels has no IoU (NaN) and is left out of the mean. This is what
torchmetrics' ``MulticlassJaccardIndex(average="macro")`` computes from the datamodule's train ids
with its ``ignore_index`` (19 or 255): the two are equal (``tests/evaluation``).

``cityscapesScripts`` is the ``[official-eval]`` extra; it is imported where it is used.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets import Cityscapes

from src.utils.errors import UserError
from src.utils.extras import require

NUM_TRAIN_IDS = 19
UNLABELED = 0  # the label id of background and ignored predictions
GT_SUFFIX = "_gtFine_labelIds.png"
PRED_SUFFIX = "_pred_labelIds.png"


class OfficialEvalError(UserError, RuntimeError):
    """The official script stopped on the files it was given (it prints ``ERROR: ...`` and
    exits); carries its message."""


def label_id_table() -> Tensor:
    """(256,) uint8 look-up table from train id to Cityscapes label id; 19 (background), 255 and
    every other value go to 0 (``unlabeled``). The inverse of
    :func:`src.datamodules.cityscapes.train_id_table` on the 19 classes."""
    table = torch.full((256,), UNLABELED, dtype=torch.uint8)
    for label in Cityscapes.classes:
        if 0 <= label.train_id < NUM_TRAIN_IDS:
            table[label.train_id] = label.id
    return table


def frame_stem(path: Path | str) -> str:
    """``<city>_<seq>_<frame>`` of a Cityscapes file name
    (``aachen_000000_000019_leftImg8bit.png``)."""
    parts = Path(path).name.split("_")
    if len(parts) < 4:
        raise ValueError(f"{path} is not a Cityscapes file name (<city>_<seq>_<frame>_<type>.png)")
    return "_".join(parts[:3])


def prediction_file(out_dir: Path, image_file: Path | str) -> Path:
    """Where the prediction for ``image_file`` goes:
    ``out_dir/<city>/<city>_<seq>_<frame>_pred_labelIds.png``."""
    stem = frame_stem(image_file)
    return out_dir / stem.split("_")[0] / f"{stem}{PRED_SUFFIX}"


def write_label_ids(train_ids: Tensor, path: Path) -> None:
    """Save an (H, W) map of train ids as a PNG of label ids.

    Shape:
        train_ids: (H, W) integer, values 0..18, 19 or 255.
    """
    if train_ids.ndim != 2:
        raise ValueError(f"need an (H, W) map of train ids, got shape {tuple(train_ids.shape)}")
    label_ids = label_id_table()[train_ids.long().cpu()].numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(label_ids).save(path)  # (H, W) uint8: mode "L"


def full_size_prediction(logits: Tensor, size: tuple[int, int]) -> Tensor:
    """Train ids of one image at the label size: the logits up-sampled bilinearly to ``size``
    (H, W), then the best class per pixel.

    Shape:
        (C, h, w) -> (H, W) int64.
    """
    if logits.shape[-2:] != size:
        logits = F.interpolate(
            logits[None].float(), size=size, mode="bilinear", align_corners=False
        )[0]
    return logits.argmax(dim=0)


@torch.inference_mode()
def write_predictions(
    forward: Callable[[Tensor], Tensor],
    dataset: Dataset,
    image_files: Sequence[Path | str],
    label_files: Sequence[Path | str],
    out_dir: Path,
    *,
    batch_size: int = 1,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
) -> list[Path]:
    """Run ``forward`` over ``dataset`` (items ``(image, mask)`` in the order of ``image_files``)
    and write each prediction at the size of its label file (:func:`full_size_prediction`).
    Returns the prediction files, in the order of ``label_files``.

    Shape:
        forward: (B, 3, h, w) normalised images -> (B, C, h', w') logits.
    """
    if not len(dataset) == len(image_files) == len(label_files):
        raise ValueError(
            f"{len(dataset)} items, {len(image_files)} images and {len(label_files)} label files "
            "differ in number"
        )
    files = []
    index = 0
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    for images, _ in loader:
        logits = forward(images.to(device))
        for one in logits:
            with Image.open(label_files[index]) as label:  # reads the header only
                width, height = label.size
            path = prediction_file(out_dir, image_files[index])
            write_label_ids(full_size_prediction(one, (height, width)), path)
            files.append(path)
            index += 1
    return files


def official_scores(
    prediction_files: Sequence[Path | str],
    label_files: Sequence[Path | str],
    *,
    json_file: Path | None = None,
    quiet: bool = True,
) -> dict[str, Any]:
    """The result dict of the official ``evaluateImgLists`` on paired label-id PNGs:
    ``averageScoreClasses`` (the class mIoU of the benchmark), ``averageScoreCategories``,
    ``classScores`` (name -> IoU, NaN for ignored or absent classes) and ``confMatrix``.

    Instance-level scores (which need ``*_instanceIds.png``) are off; ``json_file`` also writes
    the script's JSON result; ``quiet=False`` lets it print its tables.
    """
    require("cityscapesScripts", "official-eval", "the official Cityscapes evaluation")
    from cityscapesscripts.evaluation import evalPixelLevelSemanticLabeling as official

    if len(prediction_files) != len(label_files) or not label_files:
        raise ValueError(
            f"need one prediction per label file, got {len(prediction_files)} predictions "
            f"and {len(label_files)} label files"
        )
    for prediction, label in zip(prediction_files, label_files):
        if frame_stem(prediction) != frame_stem(label):
            raise ValueError(f"prediction {prediction} is not for label file {label}")
    # a fresh copy of the script's module-level settings, so that nothing is left changed there
    args = official.CArgs()
    vars(args).update(vars(official.args))
    args.evalInstLevelScore = False
    args.evalPixelAccuracy = False
    args.quiet = quiet
    args.colorized = False
    args.bold = args.nocol = ""
    args.JSONOutput = json_file is not None
    if json_file is not None:
        args.exportFile = str(json_file)
    printed = io.StringIO()
    try:
        # on a bad file the script prints "ERROR: ..." and calls sys.exit
        with contextlib.redirect_stdout(printed) if quiet else contextlib.nullcontext():
            return official.evaluateImgLists(
                [str(p) for p in prediction_files], [str(p) for p in label_files], args
            )
    except SystemExit:
        raise OfficialEvalError(
            f"the official Cityscapes evaluation stopped: {printed.getvalue().strip()}"
        ) from None


def label_files_of(dataset: Cityscapes) -> list[Path]:
    """The ``*_gtFine_labelIds.png`` of a torchvision ``Cityscapes(target_type="semantic")``, in
    item order."""
    files = [Path(targets[0]) for targets in dataset.targets]  # one list per item
    wrong = [f for f in files if not f.name.endswith(GT_SUFFIX)]
    if wrong:
        raise ValueError(f"the official evaluation needs *{GT_SUFFIX} targets, got e.g. {wrong[0]}")
    return files


def evaluate_cityscapes(
    forward: Callable[[Tensor], Tensor],
    dataset: Cityscapes,
    out_dir: Path,
    *,
    batch_size: int = 1,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
    json_file: Path | None = None,
) -> dict[str, Any]:
    """Predict every image of ``dataset`` into ``out_dir`` as label-id PNGs at full label size,
    then score them with the official script; returns its result dict (:func:`official_scores`)."""
    require("cityscapesScripts", "official-eval", "the official Cityscapes evaluation")
    label_files = label_files_of(dataset)
    prediction_files = write_predictions(
        forward, dataset, dataset.images, label_files, out_dir,
        batch_size=batch_size, num_workers=num_workers, device=device,
    )  # fmt: skip
    return official_scores(prediction_files, label_files, json_file=json_file)
