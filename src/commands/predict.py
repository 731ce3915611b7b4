"""Predict on one image: ``python predict.py image=/path/to.jpg ckpt_path=... [overrides]``.

With ``ckpt_path`` (a checkpoint of this project) the network is rebuilt from the checkpoint's run
record (command-line overrides still win); without it, from the command line's config with the
weights of ``task.init_checkpoint=`` (a checkpoint of ours or an official release file) or
``model.weights=`` (timm/torchvision). A network without weights is refused unless
``allow_random=true``. The image is read as the EdgeNets scripts read it (PIL, bilinear resize to
(W, H), ``to_tensor``, per-channel normalisation). A network output of shape:

- (1, C, H, W) (segmentation): the per-pixel argmax is drawn over the image in class colours
  (``alpha`` opacity, at the image's own size) with a legend of the classes present underneath,
  and written as a PNG (``output``, default ``<run dir>/<image stem>_overlay.png``);
- (1, C) (classification): the ``top_k`` classes and their softmax probabilities are written to
  stdout as a table and logged;
- a pair (1, P, 4), (1, P, C) (SSD detection): the detections (softmax, decoding, NMS as in
  evaluation) scoring at least ``score_threshold`` are drawn on the image as boxes tagged with the
  class name and score, and written as a PNG (``output``, default
  ``<run dir>/<image stem>_detections.png``); the best ``SHOWN_DETECTIONS`` are logged with their
  boxes (x1, y1, x2, y2) in pixels of the image, clipped to it, as every drawn and returned box.
"""

from __future__ import annotations

import colorsys
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torchvision.transforms.functional as TF
from omegaconf import DictConfig, open_dict
from PIL import Image, ImageDraw
from torch import Tensor

from src.build import build_from_checkpoint, check_served
from src.datamodules.image_conventions import (
    classification_names,
    detection_names,
    image_normalisation,
    segmentation_names,
)
from src.datamodules.voc_seg import VOC_CLASSES
from src.models.ssd_boxes import postprocess, to_pixels
from src.tasks.finetune import load_network_weights
from src.utils.errors import InputFileError, UsageError, WrongRunError

log = logging.getLogger("predict")  # the command's name in its log lines

SIZE_MULTIPLE = 32  # segmentation_demo.py floors the image's own size to a multiple of 32
LEGEND_SWATCH = 12  # pixels
LEGEND_ROW = 16  # pixels
LEGEND_PAD = 4  # pixels
SHOWN_DETECTIONS = 10  # detections named in the log; all are drawn and returned


def voc_palette(num_classes: int) -> np.ndarray:
    """The PASCAL VOC colour map (VOCdevkit ``labelcolormap``): bits of the class id spread over
    R, G, B from the most significant bit down. (num_classes, 3) uint8."""
    palette = np.zeros((num_classes, 3), dtype=np.uint8)
    for index in range(num_classes):
        value, r, g, b = index, 0, 0, 0
        for bit in range(7, -1, -1):
            r |= (value & 1) << bit
            g |= ((value >> 1) & 1) << bit
            b |= ((value >> 2) & 1) << bit
            value >>= 3
        palette[index] = (r, g, b)
    return palette


def distinct_palette(num_classes: int) -> np.ndarray:
    """Fixed, well-separated colours for any number of classes: hues stepped by the golden ratio,
    alternating saturation and value so neighbours differ. (num_classes, 3) uint8."""
    colours = [
        colorsys.hsv_to_rgb(
            (index * 0.618033988749895) % 1.0,
            0.95 - 0.3 * (index % 2),
            0.95 - 0.25 * (index // 2 % 2),
        )
        for index in range(num_classes)
    ]
    return np.round(np.array(colours) * 255).astype(np.uint8).reshape(num_classes, 3)


def palette_for(num_classes: int) -> np.ndarray:
    """The VOC colour map for up to 21 classes, :func:`distinct_palette` beyond."""
    if num_classes <= len(VOC_CLASSES):
        return voc_palette(num_classes)
    return distinct_palette(num_classes)


def input_size(cfg: DictConfig, image_size: tuple[int, int]) -> tuple[int, int]:
    """The (W, H) the network sees: ``size``, else the data config's crop (``crop_size`` (H, W) or
    a square side, digits' ``image_size``), else ``image_size`` floored to a multiple of 32."""
    if cfg.size is not None:
        size = tuple(int(s) for s in cfg.size)
        if len(size) != 2 or min(size) < 1:
            raise UsageError(f"size must be [W, H] with positive sides, got {cfg.size}")
        return size  # type: ignore[return-value]
    crop = cfg.data.get("crop_size", cfg.data.get("image_size"))
    if isinstance(crop, int):
        return crop, crop
    if crop is not None:
        height, width = (int(s) for s in crop)
        return width, height
    width, height = (s // SIZE_MULTIPLE * SIZE_MULTIPLE for s in image_size)
    if min(width, height) < SIZE_MULTIPLE:
        raise UsageError(
            f"image of size {image_size} is smaller than {SIZE_MULTIPLE} pixels; pass size=[W,H]"
        )
    return width, height


def preprocess(
    image: Image.Image, datamodule: L.LightningDataModule, size: tuple[int, int]
) -> Tensor:
    """Resize (PIL bilinear) to ``size`` = (W, H), ``to_tensor``, normalise with the datamodule's
    statistics (digits: its grey mean/std, repeated over ``in_chans``; else ``mean``/``std`` or
    ImageNet's).

    Shape:
        -> (1, in_chans, H, W)
    """
    in_chans = getattr(datamodule, "in_chans", 3)  # detection data: RGB
    mode, mean, std = image_normalisation(datamodule)
    if mode == "RGB" and in_chans != 3:
        raise UsageError(
            f"images are read as RGB; {type(datamodule).__name__} has in_chans={in_chans}"
        )
    x = TF.to_tensor(image.convert(mode).resize(size, Image.BILINEAR))  # (c, H, W), c = 1 or 3
    x = TF.normalize(x, list(mean), list(std))
    return x.expand(in_chans, -1, -1).unsqueeze(0)  # (1, in_chans, H, W)


def overlay(
    image: Image.Image, mask: np.ndarray, palette: np.ndarray, names: Sequence[str], alpha: float
) -> Image.Image:
    """``image`` blended with the class colours of ``mask`` (resized to the image, nearest), with a
    legend of the classes present drawn in a strip underneath.

    Shape:
        mask: (h, w) class ids; returns an RGB image (W, H + legend height) for an image (W, H).
    """
    image = image.convert("RGB")
    colours = Image.fromarray(palette[mask]).resize(image.size, Image.NEAREST)  # (H, W, 3) colours
    blended = Image.blend(image, colours, alpha)

    draw = ImageDraw.Draw(blended)  # only for measuring text
    entries = []  # (x, row, class id) of each legend entry, wrapped to the image's width
    x, row = LEGEND_PAD, 0
    for index in np.unique(mask).tolist():
        text_width = int(np.ceil(draw.textlength(names[index])))
        width = LEGEND_SWATCH + LEGEND_PAD + text_width + 2 * LEGEND_PAD
        if x > LEGEND_PAD and x + width > image.width:
            x, row = LEGEND_PAD, row + 1
        entries.append((x, row, index))
        x += width
    rows = row + 1 if entries else 0
    legend_height = rows * LEGEND_ROW + 2 * LEGEND_PAD
    canvas = Image.new("RGB", (image.width, image.height + legend_height), "white")
    canvas.paste(blended, (0, 0))
    draw = ImageDraw.Draw(canvas)
    for x, row, index in entries:
        top = image.height + LEGEND_PAD + row * LEGEND_ROW
        swatch_top = top + (LEGEND_ROW - LEGEND_SWATCH) // 2
        colour = tuple(int(c) for c in palette[index])
        swatch = (x, swatch_top, x + LEGEND_SWATCH - 1, swatch_top + LEGEND_SWATCH - 1)
        draw.rectangle(swatch, fill=colour)
        draw.text((x + LEGEND_SWATCH + LEGEND_PAD, top + 2), names[index], fill="black")
    return canvas


def image_boxes(boxes: Tensor, image_size: tuple[int, int]) -> Tensor:
    """Normalised (x1, y1, x2, y2) boxes in pixels of an image of ``image_size`` = (W, H), clipped
    to it: the decoded boxes of priors at the border reach past the image.

    Shape:
        (N, 4) -> (N, 4)
    """
    width, height = image_size
    pixels = to_pixels(boxes.float(), (height, width))
    limits = pixels.new_tensor([width, height, width, height])
    return pixels.clamp(min=0).minimum(limits)


def detection_rows(
    detections: dict[str, Tensor], names: Sequence[str], image_size: tuple[int, int]
) -> list[tuple[str, float, list[float]]]:
    """(class name, score, [x1, y1, x2, y2] in pixels of the image, clipped) of each detection, in
    the order of ``detections`` (best score first), rounded as logged."""
    boxes = image_boxes(detections["boxes"], image_size)
    return [
        (names[label], round(score, 4), [round(v, 1) for v in box])
        for box, label, score in zip(
            boxes.tolist(), detections["labels"].tolist(), detections["scores"].tolist()
        )
    ]


def describe_detections(
    rows: Sequence[tuple[str, float, list[float]]],
    score_threshold: float,
    image_size: tuple[int, int],
    shown: int = SHOWN_DETECTIONS,
) -> str:
    """One log line: how many detections there are, how many of them follow, and those."""
    if not rows:
        return f"no detections scoring >= {score_threshold}"
    count = f"top {shown} of {len(rows)}" if len(rows) > shown else f"{len(rows)}"
    return (
        f"{count} detections scoring >= {score_threshold} "
        "(class, score, box x1, y1, x2, y2 in pixels "
        f"of the {image_size[0]}x{image_size[1]} image): {list(rows[:shown])}"
    )


def draw_detections(
    image: Image.Image,
    rows: Sequence[tuple[str, float, list[float]]],
    labels: Sequence[int],
    palette: np.ndarray,
) -> Image.Image:
    """``image`` with each detection's box (``rows`` of :func:`detection_rows`: pixels of the image)
    outlined in the colour of its class (``labels``) and tagged "name score" above its top-left
    corner."""
    out = image.convert("RGB")
    draw = ImageDraw.Draw(out)
    for (name, score, (x1, y1, x2, y2)), label in zip(rows, labels):
        colour = tuple(int(c) for c in palette[label])
        draw.rectangle((x1, y1, x2, y2), outline=colour, width=2)
        tag = f"{name} {score:.2f}"
        left, top, right, bottom = draw.textbbox((0, 0), tag)
        tag_top = max(0.0, y1 - (bottom - top) - 2)
        tag_box = (x1, tag_top, x1 + right - left + 2, tag_top + bottom - top + 2)
        draw.rectangle(tag_box, fill=colour)
        draw.text((x1 + 1, tag_top), tag, fill=(255, 255, 255))
    return out


def top_k_table(probabilities: Tensor, names: Sequence[str], k: int) -> list[tuple[str, float]]:
    """The ``k`` most probable classes (at most C), highest first.

    Shape:
        probabilities: (C,)
    """
    values, indices = probabilities.topk(min(k, probabilities.numel()))
    return [(names[i], float(p)) for p, i in zip(values.tolist(), indices.tolist())]


def has_weights(cfg: DictConfig) -> bool:
    """Whether the config loads weights without a checkpoint of a run: ``task.init_checkpoint=``
    (ours or an official release) or the model's own ``weights=`` (timm, torchvision)."""
    return cfg.task.get("init_checkpoint") is not None or cfg.model.get("weights") is not None


def read_image(path: Path) -> Image.Image:
    """The image at ``path`` as RGB, or a ``ValueError`` naming the file when PIL cannot read it."""
    try:
        with Image.open(path) as file:
            return file.convert("RGB")
    except (OSError, SyntaxError, ValueError) as error:  # UnidentifiedImageError is an OSError
        raise UsageError(
            f"image={path} cannot be read as an image ({error}); "
            "pass a JPEG, PNG or another format PIL reads"
        ) from None


def exported_network(path: str) -> torch.nn.Module:
    """The vision network of an exported file, run by onnxruntime (:mod:`src.export.runtime`)."""
    from src.export.metadata import exported_file
    from src.export.runtime import OnnxVisionNetwork, kind_of

    kind = kind_of(exported_file(path))
    if kind != "vision":
        raise WrongRunError(
            f"predict.py runs exported vision networks; onnx={path} holds a {kind} graph"
        )
    return OnnxVisionNetwork(exported_file(path))


def predict(cfg: DictConfig) -> dict:
    """Run the configured network on ``cfg.image``; returns what was predicted (and written)."""
    image_path = Path(cfg.image)
    if not image_path.is_file():
        raise InputFileError(f"image {image_path} does not exist; pass image=/path/to/file.jpg")
    if cfg.top_k < 1:
        raise UsageError(f"top_k must be >= 1, got {cfg.top_k}")
    if not 0.0 <= cfg.alpha <= 1.0:
        raise UsageError(f"alpha must be in [0, 1], got {cfg.alpha}")
    if (
        cfg.ckpt_path is None
        and cfg.get("onnx") is None
        and not has_weights(cfg)
        and not cfg.allow_random
    ):
        raise UsageError(
            "no weights: pass ckpt_path=<a run's .ckpt> (metrics.json names the best one) or "
            "task.init_checkpoint=/model.weights=<file>; allow_random=true predicts with the "
            "randomly initialised network"
        )
    image = read_image(image_path)
    L.seed_everything(cfg.seed)
    datamodule, task = build_from_checkpoint(cfg)
    check_served("predict.py", cfg, datamodule, task)
    if cfg.get("onnx") is not None:
        eager, task.net = task.net, exported_network(cfg.onnx)
        if hasattr(eager, "priors"):  # SSD's priors and classes follow from its config
            task.net.priors, task.net.num_classes = eager.priors, eager.num_classes
        if cfg.size is None and task.net.image_size is not None:
            with open_dict(cfg):  # a graph of fixed image size takes that size only
                cfg.size = list(reversed(task.net.image_size))
    elif cfg.ckpt_path is None and cfg.task.get("init_checkpoint") is not None:
        load_network_weights(task.net, cfg.task.init_checkpoint)
    size = input_size(cfg, image.size)
    x = preprocess(image, datamodule, size)
    log.info("image %s (%dx%d) -> network input %s", image_path, *image.size, tuple(x.shape))
    task.eval()
    with torch.no_grad():
        logits = task.net(x)

    if isinstance(logits, tuple) and len(logits) == 3:  # an exported SSD with NMS in its graph
        # NMS keeps the same boxes above a higher threshold as it keeps above the graph's
        boxes, scores, labels = logits
        chosen = scores > cfg.score_threshold
        found = {"boxes": boxes[chosen], "scores": scores[chosen], "labels": labels[chosen]}
        num_classes = task.net.num_classes
    if isinstance(logits, tuple) and len(logits) == 2:  # SSD: (1, P, 4) offsets, (1, P, C)
        locations, scores = logits
        # the task's NMS settings; only the drawing threshold is predict.py's own
        found = postprocess(
            locations, scores, task.net.priors, cfg.score_threshold, task.nms_threshold,
            task.max_per_class, task.pre_nms_top_k,
        )[0]  # fmt: skip
        num_classes = scores.shape[-1]
    if isinstance(logits, tuple):
        names = detection_names(datamodule, num_classes)
        default = Path(cfg.paths.output_dir) / f"{image_path.stem}_detections.png"
        output = Path(cfg.output) if cfg.output is not None else default
        output.parent.mkdir(parents=True, exist_ok=True)
        listed = detection_rows(found, names, image.size)
        labels = found["labels"].tolist()
        draw_detections(image, listed, labels, palette_for(num_classes)).save(output)
        log.info("%s", describe_detections(listed, cfg.score_threshold, image.size))
        log.info("detections drawn to %s", output)
        return {"task": "detection", "output": str(output), "detections": listed}
    if logits.ndim == 4 and logits.shape[0] == 1:  # (1, C, H, W): segmentation
        num_classes = logits.shape[1]
        mask = logits[0].argmax(0).cpu().numpy()  # (H, W) class ids
        names = segmentation_names(num_classes)
        default = Path(cfg.paths.output_dir) / f"{image_path.stem}_overlay.png"
        output = Path(cfg.output) if cfg.output is not None else default
        output.parent.mkdir(parents=True, exist_ok=True)
        overlay(image, mask, palette_for(num_classes), names, cfg.alpha).save(output)
        ids, counts = np.unique(mask, return_counts=True)
        present = {names[i]: round(c / mask.size, 4) for i, c in zip(ids.tolist(), counts.tolist())}
        log.info("classes present (pixel fraction): %s", present)
        log.info("overlay written to %s", output)
        return {"task": "segmentation", "output": str(output), "classes": present}
    if logits.ndim == 2 and logits.shape[0] == 1:  # (1, C): classification
        names = classification_names(datamodule, logits.shape[1])
        top = top_k_table(logits[0].softmax(0), names, cfg.top_k)
        width = max(len("class"), *(len(name) for name, _ in top))
        rows = [f"rank  {'class':<{width}}  probability"]
        rows += [f"{rank:>4}  {name:<{width}}  {p:.4f}" for rank, (name, p) in enumerate(top, 1)]
        sys.stdout.write("\n".join(rows) + "\n")
        log.info("top-%d: %s", len(top), ", ".join(f"{name} {p:.4f}" for name, p in top))
        return {"task": "classification", "top_k": top}
    raise ValueError(f"expected network output (1, C, H, W) or (1, C), got {tuple(logits.shape)}")
