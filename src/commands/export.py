"""Export a checkpoint for devices: ``python export.py ckpt_path=/path/to.ckpt [format=onnx]
[quantize=int8] [images=DIR] [out=/path/stem]``.

The network is rebuilt from the checkpoint's run record (as ``eval.py`` does; without a checkpoint,
from the command line's config with ``allow_random=true``), exported to ONNX with a dynamic batch
(and image size where the network takes other sizes: :mod:`src.export.vision`), and run by
onnxruntime against eager PyTorch on images (:mod:`src.export.images`): those of ``images=DIR``,
else the validation split, else, where the dataset is not there, generated tensors of the
network's input shape. Writes ``<out>.onnx`` and the card ``<out>.json`` (model, parameters and
MACs, inputs and their dynamic dimensions, opset, exporter, parity at each size checked and on
what, notes); with ``quantize=int8`` also ``<out>.int8.onnx``, calibrated on ``calibration_images``
images read 8 at a time, and the task metric on the validation split before and after (with
``images=``: how often int8 agrees with fp32). Progress lines go to the log as each stage ends; the
ONNX libraries' own log lines go to the run's log file only; a summary is printed at the end.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor

from src.build import (
    build_from_checkpoint,
    check_served,
    complexity_of,
    hydra_choices,
    hydra_overrides,
)
from src.export.metadata import attach_metadata, vision_metadata
from src.export.text import is_text_network
from src.models.delight_mt import DeLighTEncoderDecoder
from src.models.ssd import SSD
from src.utils.errors import UsageError
from src.utils.extras import require
from src.utils.run_record import make_record, override_key, read_checkpoint, record_of

log = logging.getLogger("export")  # the command's name in its log lines

FORMATS = ("onnx", "executorch")
QUANTIZATIONS = (None, "int8")
EXPORT_BATCH = 2  # images in the traced example; the batch is dynamic
# the detection task's post-processing settings that nms=true bakes into the graph
NMS_SETTINGS = ("score_threshold", "nms_threshold", "max_per_class", "pre_nms_top_k")


def check_options(cfg: DictConfig) -> None:
    """One-line errors for options that cannot work, before anything is built."""
    if cfg.format not in FORMATS:
        raise UsageError(f"format must be one of {list(FORMATS)}, got {cfg.format!r}")
    if cfg.quantize not in QUANTIZATIONS:
        raise UsageError(f"quantize must be null or 'int8', got {cfg.quantize!r}")
    if cfg.ckpt_path is None and not cfg.allow_random:
        raise UsageError(
            "no weights: pass ckpt_path=<a run's .ckpt> (metrics.json names the best one); "
            "allow_random=true exports the randomly initialised network"
        )
    if cfg.ckpt_path is not None and not Path(cfg.ckpt_path).is_file():
        raise UsageError(f"checkpoint {cfg.ckpt_path} does not exist")
    if cfg.int8_activations not in ("uint8", "uint16"):
        raise UsageError(f"int8_activations must be uint8 or uint16, got {cfg.int8_activations!r}")
    if cfg.int8_activations != "uint8" and cfg.format != "onnx":
        raise UsageError("int8_activations=uint16 is written for format=onnx")
    count = cfg.calibration_images
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(
            "calibration_images must be a whole number of images >= 1 (128 by default), "
            f"got {count!r}"
        )
    if cfg.images is not None:
        from src.export.images import image_files

        image_files(cfg.images)  # a folder that holds images, before anything is built
    for distribution in ("onnx", "onnxruntime", "onnxscript"):
        require(distribution, "export", "python export.py")
    if cfg.format == "executorch":
        from src.export.executorch import require_executorch

        require_executorch()


def first_val_batch(datamodule: L.LightningDataModule) -> Any:
    """The first batch of the validation split (of its first loader, when there are several)."""
    loaders = datamodule.val_dataloader()
    loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
    return next(iter(loader))


def task_metric(
    kind: str, predict: Callable[[Tensor], Tensor], batches: Iterable[Any], ignore_index: int
) -> dict[str, float]:
    """Top-1 accuracy (classification) or mIoU over the classes present (segmentation) of
    ``predict`` (images -> logits) on ``batches``, in percent."""
    correct = total = 0
    confusion: Tensor | None = None
    for images, targets in batches:
        logits = predict(images)
        if kind == "classification":
            correct += int((logits.argmax(1) == targets).sum())
            total += targets.numel()
            continue
        classes = logits.shape[1]
        keep = targets != ignore_index
        pairs = targets[keep] * classes + logits.argmax(1)[keep]
        counts = torch.bincount(pairs, minlength=classes * classes).view(classes, classes)
        confusion = counts if confusion is None else confusion + counts
    if kind == "classification":
        return {"accuracy": 100.0 * correct / max(total, 1)}
    assert confusion is not None
    hits = confusion.diag().double()
    union = confusion.sum(0).double() + confusion.sum(1).double() - hits
    present = union > 0
    return {"miou": 100.0 * (hits[present] / union[present]).mean().item()}


def agreement(
    reference: Callable[[Tensor], Tensor],
    candidate: Callable[[Tensor], Tensor],
    batches: Iterable[Tensor],
) -> dict[str, Any]:
    """How often ``candidate``'s argmax class equals ``reference``'s on unlabelled images, in
    percent: of the images (classification, logits (B, K)) or of the pixels (segmentation,
    (B, K, H, W)); with the number of images and which of the two was counted."""
    same = total = images = 0
    counted = "images"
    for batch in batches:
        expected, got = reference(batch).argmax(1), candidate(batch).argmax(1)
        same += int((expected == got).sum())
        total += expected.numel()
        images += len(batch)
        counted = "pixels" if expected.dim() > 1 else "images"
    return {"agreement": 100.0 * same / max(total, 1), "of": counted, "images": images}


class Progress:
    """Progress lines: a stage's name when it starts and, when it ends, what it did and its
    seconds (``export: wrote net.onnx (41.3 s)``)."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()

    def begin(self, message: str, *args: Any) -> None:
        self.last = time.perf_counter()
        log.info(message, *args)

    def end(self, message: str, *args: Any, at: float | None = None) -> float:
        """Log the stage that ended ``at`` (a ``time.perf_counter()``; default: now)."""
        now = time.perf_counter() if at is None else at
        seconds, self.last = now - self.last, now
        log.info(f"{message} (%.1f s)", *args, seconds)
        return seconds

    def total(self) -> float:
        return round(time.perf_counter() - self.start, 2)


def size_text(path: Path) -> str:
    """The file's size in MB (KB under 0.1 MB)."""
    size = path.stat().st_size
    return f"{size / 1e6:.2f} MB" if size >= 100_000 else f"{size / 1e3:.1f} KB"


def metric_text(metrics: dict[str, dict[str, Any]]) -> str:
    """``accuracy eager 97.04%, fp32_onnx 97.04%, int8_onnx 97.04%`` (or ``miou ...``; SSD:
    ``map ...; map_coco ...``; unlabelled: ``int8's class = fp32's for 98.44% of the pixels of 64
    images``, for SSD how many of fp32's confident detections int8 finds)."""
    if "int8_vs_fp32" in metrics:
        found = metrics["int8_vs_fp32"]
        if found["of"] == "detections":
            return (
                f"int8 finds {found['agreement']:.2f}% of fp32's {found['detections']} detections "
                f"scoring >= {found['score']} on {found['images']} images "
                f"({found['precision']:.2f}% of its own {found['int8_detections']} match fp32's)"
            )
        of = "" if found["of"] == "images" else "the pixels of "
        return (
            f"int8's class = fp32's for {found['agreement']:.2f}% of {of}{found['images']} images"
        )
    keys = list(next(iter(metrics.values())))
    return "; ".join(
        f"{key} " + ", ".join(f"{name} {values[key]:.2f}%" for name, values in metrics.items())
        for key in keys
    )


def summary(card: dict[str, Any], files: list[Path]) -> str:
    """What a person reads at the end: the network, where the parity inputs came from, parity at
    each size, int8's calibration and metric, the files written with their sizes, the time."""
    model = card["model"]
    lines = [
        f"exported {model['class'].rsplit('.', 1)[-1]} ({card.get('params', '?'):,} parameters, "
        + ("random weights)" if card["checkpoint"] is None else f"weights of {card['checkpoint']})")
    ]
    parity = card["parity"]
    lines.append(f"parity against eager PyTorch on {parity['inputs']}:")
    for check in parity["checks"]:
        shape = check["shapes"][0] if "shapes" in check else None
        where = (
            check.get("compared", "")
            if shape is None
            else "x".join(str(side) for side in shape[2:]) or str(shape)
        )
        rel = f", max rel {check['max_rel']:.2g}" if "max_rel" in check else ""
        lines.append(f"  {where:<10} max abs {check['max_abs']:.2g}{rel}")
    int8 = card.get("int8")
    if int8 is not None:
        lines.append(f"int8: calibrated on {int8['calibration_images']} {int8['calibrated_on']}")
        on = "the validation split" if int8["split"] == "val" else "the calibration images"
        lines.append(f"  on {on}: {metric_text(int8['metric'])}")
    lines.append("files:")
    width = max(len(str(path)) for path in files)
    lines += [f"  {str(path):<{width}}  {size_text(path)}" for path in files if path.is_file()]
    lines.append(f"took {card['wall_time_s']:.1f} s")
    return "\n".join(lines) + "\n"


def export(cfg: DictConfig) -> dict:
    """Export the configured network (module docstring); prints the summary, returns the card."""
    from src.export.onnx import library_logs_to_file

    check_options(cfg)
    with library_logs_to_file():
        card, files = export_files(cfg)
    sys.stdout.write(summary(card, files))
    sys.stdout.flush()
    return card


def export_files(cfg: DictConfig) -> tuple[dict, list[Path]]:
    """The work of :func:`export`: the card and the files written (the card's last)."""
    from src.export.card import write_card
    from src.export.detection import detection_parity, ssd_nms_spec
    from src.export.images import NoCalibrationImagesError, export_images
    from src.export.onnx import (
        DEFAULT_OPSET,
        EXPORTER,
        export_onnx,
        graph_inputs,
        op_counts,
        parity,
        run_session,
        session,
    )
    from src.export.vision import other_sizes, vision_spec

    progress = Progress()
    L.seed_everything(cfg.seed, verbose=False)
    datamodule, task = build_from_checkpoint(cfg)
    check_served("export.py", cfg, datamodule, task)
    task.eval()
    net = task.net.eval()
    name = type(net).__name__
    out = Path(cfg.out) if cfg.out else Path(cfg.paths.output_dir) / name.lower()
    if is_text_network(net) or isinstance(net, DeLighTEncoderDecoder):
        if cfg.format != "onnx" or cfg.quantize is not None:
            raise UsageError(
                f"{name} exports as float32 ONNX only (format=onnx, quantize=null); "
                "ExecuTorch and int8 are written for the vision networks"
            )
        if cfg.images is not None:
            raise UsageError(f"images= holds images for a vision network; {name} is a text network")
        datamodule.prepare_data()
        datamodule.setup("fit")
        return text_card(cfg, task, datamodule, net, out, progress)
    images, unread = export_images(datamodule, cfg.images)
    if cfg.quantize == "int8" and images.calibration is None:
        raise NoCalibrationImagesError(
            f"quantize=int8 calibrates on images and there are none ({unread}); pass "
            "images=DIR, a folder of images like those the network will see (any sizes), "
            "or the dataset's data.root"
        )
    if unread is not None:
        log.warning(
            "the dataset cannot be read (%s): parity is checked on generated inputs; "
            "images=DIR checks on your images",
            unread,
        )
    first = images.check
    if cfg.get("nms"):
        if not isinstance(net, SSD) or cfg.format != "onnx" or cfg.quantize is not None:
            raise UsageError("nms=true puts SSD's post-processing into a float32 ONNX graph: "
                             "an SSD model, format=onnx, quantize=null")  # fmt: skip
        settings = {key: getattr(task, key) for key in NMS_SETTINGS}
        spec = ssd_nms_spec(net, first, settings)
    else:
        spec = vision_spec(net, first[:EXPORT_BATCH], fixed_size=bool(cfg.get("fixed_size")))
    if cfg.format == "executorch":
        return executorch_card(cfg, task, datamodule, net, images, out, progress)
    progress.begin("export: %s to ONNX (the exporter takes one to three minutes on 2 cores)", name)
    onnx_path = export_onnx(spec, out.with_suffix(".onnx"), opset=cfg.opset or DEFAULT_OPSET)
    record = record_of_run(cfg)
    metadata = {"kind": "vision", "graph": spec.name, "record": record}
    attach_metadata(onnx_path, {**metadata, **vision_metadata(datamodule, spec)})
    progress.end("export: wrote %s", onnx_path)
    runner = session(onnx_path)
    if cfg.get("nms"):
        checks = [
            detection_parity(
                lambda image: run_session(runner, spec.input_names, (image,)), spec.module, first
            )
        ]
    else:
        checks = [parity(runner, spec, (first,))]
    for height, width in other_sizes(spec):
        resized = F.interpolate(first, size=(height, width), mode="bilinear", align_corners=False)
        checks.append(parity(runner, spec, (resized,)))
    progress.end(
        "check: parity at %d size(s) on %s, max abs %.2g",
        len(checks), images.source, max(check["max_abs"] for check in checks),
    )  # fmt: skip
    complexity = complexity_of(task, datamodule)
    card: dict[str, Any] = {
        "model": {
            "choice": record["choices"].get("model"),  # the run's, not the export config's default
            "target": cfg.model.get("_target_"),
            "class": f"{type(net).__module__}.{name}",
        },
        **complexity.as_dict(),
        "checkpoint": None if cfg.ckpt_path is None else str(cfg.ckpt_path),
        "file": str(onnx_path),
        "format": cfg.format,
        "exporter": EXPORTER,
        "opset": cfg.opset or DEFAULT_OPSET,
        "inputs": graph_inputs(onnx_path),
        "outputs": spec.output_names,
        "parity_inputs": images.source,
        "parity": {
            "against": "eager PyTorch (eval mode)",
            "inputs": images.description,
            "max_rel_is": "max abs error / max abs eager output",
            "checks": checks,
        },
        "operators": op_counts(onnx_path),
        "notes": spec.notes,
    }
    files = [onnx_path]
    if cfg.quantize == "int8":
        card["int8"] = quantized(cfg, task, images, spec, onnx_path, runner, progress)
        files.append(Path(card["int8"]["file"]))
    card["wall_time_s"] = progress.total()
    files.append(write_card(out.with_suffix(".json"), card))
    return card, files


def executorch_card(
    cfg: DictConfig,
    task: L.LightningModule,
    datamodule: L.LightningDataModule,
    net: torch.nn.Module,
    images: Any,
    out: Path,
    progress: Progress,
) -> tuple[dict, list[Path]]:
    """``format=executorch``: the network lowered to XNNPACK for one image of the input size
    (ExecuTorch plans fixed shapes), its parity on the first images of ``images``
    (:class:`~src.export.images.ExportImages`), and the card; with ``quantize=int8`` also
    ``<out>.int8.pte`` (PT2E, XNNPACK quantizer, calibrated on ``calibration_images`` images) and
    the validation metric of eager PyTorch, the fp32 and the int8 program (with ``images=``: how
    often int8 agrees with fp32). Returns the card and the files written."""
    from src.export.card import write_card
    from src.export.executorch import export_executorch, load_program
    from src.export.vision import vision_spec

    first = images.check
    spec = vision_spec(net, first[:1])
    progress.begin("export: %s to ExecuTorch (XNNPACK)", type(net).__name__)
    path = export_executorch(spec, out.with_suffix(".pte"))
    progress.end("export: wrote %s", path)
    program = load_program(path)
    errors = []
    with torch.no_grad():
        for image in first[: min(len(first), 4)]:
            expected = net(image[None])
            expected = expected[0] if isinstance(expected, (tuple, list)) else expected
            errors.append(float((program([image[None]])[0] - expected).abs().max()))
    progress.end("check: parity on %d image(s), max abs %.2g", len(errors), max(errors))
    card = {
        "model": {
            "choice": record_of_run(cfg)["choices"].get("model"),
            "target": cfg.model.get("_target_"),
            "class": f"{type(net).__module__}.{type(net).__name__}",
        },
        **complexity_of(task, datamodule).as_dict(),
        "checkpoint": None if cfg.ckpt_path is None else str(cfg.ckpt_path),
        "file": str(path),
        "format": "executorch",
        "backend": "XNNPACK",
        "input": {"name": "image", "shape": list(first[:1].shape), "dynamic": []},
        "parity_inputs": images.source,
        "parity": {
            "against": "eager PyTorch (eval mode), one image at a time",
            "inputs": images.description,
            "checks": [{"shapes": [list(first[:1].shape)], "max_abs": max(errors)}],
        },
        "notes": [*spec.notes, "ExecuTorch program planned for this one input shape"],
    }
    files = [path]
    if cfg.quantize == "int8":
        card["int8"] = executorch_int8(cfg, task, images, spec, out, program, progress)
        files.append(Path(card["int8"]["file"]))
    card["wall_time_s"] = progress.total()
    files.append(write_card(out.with_suffix(".json"), card))
    return card, files


def one_at_a_time(
    predict: Callable[[Tensor], list[Tensor]], size: tuple[int, ...]
) -> Callable[[Tensor], Any]:
    """``predict`` (one image -> the program's outputs) for a program planned for one image of
    ``size`` (C, H, W), over a batch: each image alone (a batch's last, smaller one too). Returns
    the one output batched, or the tuple of them (SSD's locations and logits)."""

    def run(images: Tensor) -> Any:
        if tuple(images.shape[1:]) != size:
            raise UsageError(
                f"the program takes images of {size}; "
                f"the validation split has {tuple(images.shape[1:])}"
            )
        outputs = [predict(image[None]) for image in images]
        batched = tuple(torch.cat(parts) for parts in zip(*outputs))
        return batched[0] if len(batched) == 1 else batched

    return run


def executorch_int8(
    cfg: DictConfig,
    task: L.LightningModule,
    images: Any,
    spec: Any,
    out: Path,
    fp32_program: Callable[[list[Tensor]], list[Tensor]],
    progress: Progress,
) -> dict[str, Any]:
    """Write ``<out>.int8.pte`` calibrated on the first ``calibration_images`` images (each alone,
    the program's shape); the validation metric before and after, or int8's agreement with fp32
    on unlabelled images."""
    from src.export.executorch import export_executorch, load_program
    from src.export.images import limited

    kind = task_kind(spec)
    size = tuple(spec.inputs[0].shape[1:])
    calibration = [
        (image[None],)
        for batch in limited(images.calibration(), cfg.calibration_images)
        for image in batch
        if image.shape == size
    ]
    progress.begin("calibrate and quantize: %d images", len(calibration))
    path = export_executorch(spec, out.with_suffix(".int8.pte"), calibration=calibration)
    progress.end("quantize: wrote %s", path)
    int8_program = load_program(path)
    fp32 = one_at_a_time(lambda x: fp32_program([x]), size)
    int8 = one_at_a_time(lambda x: int8_program([x]), size)
    metrics = int8_metrics(cfg, task, images, kind, fp32, int8, "executorch")
    progress.end("measure: %s", metric_text(metrics))
    return {
        "file": str(path),
        "method": "PT2E with the XNNPACK quantizer: symmetric int8, weights per channel, static",
        "calibration_images": len(calibration),
        "calibrated_on": images.calibration_source,
        "split": "val" if images.labelled is not None else None,
        "metric": metrics,
    }


def int8_metrics(
    cfg: DictConfig,
    task: L.LightningModule,
    images: Any,
    kind: str,
    fp32: Callable[[Tensor], Tensor],
    int8: Callable[[Tensor], Tensor],
    runtime: str,
) -> dict[str, dict[str, Any]]:
    """The task metric (``kind``: :func:`task_kind`) of eager PyTorch and of the fp32 and int8
    files (named ``fp32_<runtime>``, ``int8_<runtime>``) on the validation split; on unlabelled
    images (``images=``) how often int8's class agrees with fp32's (for SSD: how many of fp32's
    confident detections int8 finds), on the first ``calibration_images`` of them."""
    from src.export.detection_checks import detection_agreement, detection_map
    from src.export.images import limited

    if images.labelled is None:
        calibration = limited(images.calibration(), cfg.calibration_images)
        if kind == "detection":
            return {"int8_vs_fp32": detection_agreement(task, fp32, int8, calibration)}
        return {"int8_vs_fp32": agreement(fp32, int8, calibration)}

    def eager(batch: Tensor) -> Any:
        with torch.no_grad():
            return task.net(batch)

    predictors = (("eager", eager), (f"fp32_{runtime}", fp32), (f"int8_{runtime}", int8))
    if kind == "detection":
        return {name: detection_map(task, run, images.labelled()) for name, run in predictors}
    ignore = getattr(task, "ignore_index", 255)
    return {name: task_metric(kind, run, images.labelled(), ignore) for name, run in predictors}


def quantized(
    cfg: DictConfig,
    task: L.LightningModule,
    images: Any,
    spec: Any,
    onnx_path: Path,
    runner: Any,
    progress: Progress,
) -> dict[str, Any]:
    """Write ``<out>.int8.onnx`` calibrated on the first ``calibration_images`` images of
    ``images`` (:class:`~src.export.images.ExportImages`); the validation metric of eager
    PyTorch, the fp32 file and the int8 file, or, on unlabelled images, how often int8's argmax
    agrees with fp32's."""
    from src.export.onnx import run_session, session
    from src.export.quantize import CALIBRATION_BATCH, CalibrationFeeds, quantize_int8

    kind = task_kind(spec)
    int8_path = onnx_path.with_suffix(".int8.onnx")
    feeds = CalibrationFeeds(images.calibration(), spec.input_names[0], cfg.calibration_images)
    progress.begin(
        "calibrate: up to %d %s, %d at a time",
        feeds.limit, images.calibration_source, CALIBRATION_BATCH,
    )  # fmt: skip
    quantize_int8(onnx_path, int8_path, feeds, activations=cfg.int8_activations)
    progress.end("calibrate: min/max of %d images", feeds.images, at=feeds.finished)
    progress.end("quantize: wrote %s", int8_path)
    int8_runner = session(int8_path)

    def onnx_predict(which: Any) -> Callable[[Tensor], Any]:
        if kind == "detection":
            return lambda batch: tuple(run_session(which, spec.input_names, (batch,)))
        return lambda batch: run_session(which, spec.input_names, (batch,))[0]

    fp32, int8 = onnx_predict(runner), onnx_predict(int8_runner)
    metrics = int8_metrics(cfg, task, images, kind, fp32, int8, "onnx")
    progress.end("measure: %s", metric_text(metrics))
    return {
        "file": str(int8_path),
        "method": (
            "onnxruntime quantize_static, QDQ, weights int8 per channel, activations "
            f"{cfg.int8_activations}; the "
            "dense products only (convolutions of one group, matrix products with a constant "
            "weight)"
        ),
        "calibration_images": feeds.images,
        "calibrated_on": images.calibration_source,
        "split": "val" if images.labelled is not None else None,
        "metric": metrics,
    }


def task_kind(spec: Any) -> str:
    """What int8 is measured by: ``"detection"`` (SSD's locations and logits: mAP),
    ``"segmentation"`` (logits per pixel: mIoU) or ``"classification"`` (top-1)."""
    if spec.output_names == ["locations", "scores"]:
        return "detection"
    if spec.output_names != ["logits"]:
        raise UsageError("quantize=int8 measures classification, segmentation and SSD networks")
    with torch.no_grad():
        return "segmentation" if spec.module(*spec.inputs).dim() == 4 else "classification"


def record_of_run(cfg: DictConfig) -> dict[str, Any]:
    """The run record an exported file carries. From a checkpoint with a record: its choices (a
    group the command line chose wins, as in :func:`build_from_checkpoint`) and the ``model``,
    ``data`` and ``task`` sections the network was built from (``cfg`` after
    :func:`build_from_checkpoint` merged the checkpoint's in). Otherwise (``allow_random=true``, a
    checkpoint without a record) the command line's composition."""
    saved = None if cfg.ckpt_path is None else record_of(read_checkpoint(cfg.ckpt_path))
    if saved is None:
        return make_record(cfg, hydra_choices())
    chosen = {override_key(o) for o in hydra_overrides()}
    if "experiment" in chosen:  # it composed all three sections (config_from_checkpoint)
        chosen |= {"model", "data", "task"}
    # the export config's own defaults (model: dicenet, data: digits) are no choice of the run
    choices = {k: v for k, v in hydra_choices().items() if k in chosen}
    return make_record(cfg, {**saved.get("choices", {}), **choices})


def text_card(
    cfg: DictConfig,
    task: L.LightningModule,
    datamodule: L.LightningDataModule,
    net: torch.nn.Module,
    out: Path,
    progress: Progress,
) -> tuple[dict, list[Path]]:
    """A text network's graphs (:func:`src.export.text.text_specs`; translation: the encoder and
    the decoder step), each ``<out>.<graph>.onnx`` for translation and ``<out>.onnx`` otherwise,
    checked through their runtimes against eager PyTorch on a validation batch; the card and the
    files written."""
    from src.export.card import write_card
    from src.export.onnx import DEFAULT_OPSET, EXPORTER, export_onnx, graph_inputs, op_counts
    from src.export.runtime import RUNTIMES
    from src.export.text import text_specs
    from src.export.text_checks import (
        awd_lm_checks,
        classifier_checks,
        segment_lm_checks,
        translation_checks,
        word_lm_checks,
    )
    from src.export.translate_onnx import OnnxTranslator, translation_specs
    from src.export.vocabulary import vocabulary_metadata

    record = record_of_run(cfg)
    vocabulary = vocabulary_metadata(datamodule)  # generate.py / translate.py onnx= read no corpus
    batch = first_val_batch(datamodule)
    if isinstance(net, DeLighTEncoderDecoder):
        kind, specs, settings = "translation", translation_specs(net), {}
    else:
        kind, specs, settings = text_specs(net)
    paths = []
    for spec in specs:
        path = out.with_suffix(f".{spec.name}.onnx" if len(specs) > 1 else ".onnx")
        path.parent.mkdir(parents=True, exist_ok=True)
        progress.begin("export: the %s graph of %s to ONNX", spec.name, type(net).__name__)
        export_onnx(spec, path, opset=cfg.opset or DEFAULT_OPSET)
        metadata = {"kind": kind, "graph": spec.name, **settings, "record": record}
        attach_metadata(path, {**metadata, "vocabulary": vocabulary})
        progress.end("export: wrote %s", path)
        paths.append(path)
    if kind == "translation":
        translator = OnnxTranslator.from_export(paths[0])

        def use_exported(exported: bool) -> None:
            task.net = translator if exported else net

        checks = translation_checks(task.translate, use_exported, batch)
    else:
        runtime = RUNTIMES[kind](paths[0])
        check = {
            "segment_lm": segment_lm_checks,
            "awd_lm": awd_lm_checks,
            "word_lm": word_lm_checks,
            "classifier": classifier_checks,
        }[kind]
        checks = check(net, runtime, batch)
    progress.end(
        "check: %d comparison(s) through the runtime, max abs %.2g",
        len(checks), max(found["max_abs"] for found in checks),
    )  # fmt: skip
    card: dict[str, Any] = {
        "model": {
            "choice": record["choices"].get("model"),
            "target": cfg.model.get("_target_"),
            "class": f"{type(net).__module__}.{type(net).__name__}",
        },
        **complexity_of(task, datamodule).as_dict(),
        "checkpoint": None if cfg.ckpt_path is None else str(cfg.ckpt_path),
        "format": "onnx",
        "exporter": EXPORTER,
        "opset": cfg.opset or DEFAULT_OPSET,
        "runtime": f"src.export.runtime ({kind})" if kind != "translation" else "OnnxTranslator",
        "graphs": [
            {
                "name": spec.name,
                "file": str(path),
                "inputs": graph_inputs(path),
                "outputs": spec.output_names,
                "operators": op_counts(path),
                "notes": spec.notes,
            }
            for spec, path in zip(specs, paths)
        ],
        "parity_inputs": "dataset",
        "parity": {
            "against": "eager PyTorch (eval mode), through the runtime",
            "inputs": "a validation batch",
            "checks": checks,
        },
        "wall_time_s": progress.total(),
    }
    return card, [*paths, write_card(out.with_suffix(".json"), card)]
