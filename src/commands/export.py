"""Export a checkpoint for devices: ``python export.py ckpt_path=/path/to.ckpt [format=onnx]
[quantize=int8] [out=/path/stem]``.

The network is rebuilt from the checkpoint's run record (as ``eval.py`` does; without a checkpoint,
from the command line's config with ``allow_random=true``), exported to ONNX with a dynamic batch
(and image size where the network takes other sizes: :mod:`src.export.vision`), and run by
onnxruntime on real images of the validation split against eager PyTorch. Writes ``<out>.onnx`` and
the card ``<out>.json`` (model, parameters and MACs, inputs and their dynamic dimensions, opset,
exporter, parity at each size checked, notes); with ``quantize=int8`` also ``<out>.int8.onnx``,
calibrated on batches of the training split, and the task metric on the validation split before
and after.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor

from src.build import build_from_checkpoint, complexity_of, hydra_choices, hydra_overrides
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
    if cfg.calibration_batches < 1:
        raise UsageError(f"calibration_batches must be >= 1, got {cfg.calibration_batches}")
    for distribution in ("onnx", "onnxruntime", "onnxscript"):
        require(distribution, "export", "python export.py")


def first_val_batch(datamodule: L.LightningDataModule) -> Any:
    """The first batch of the validation split (of its first loader, when there are several)."""
    loaders = datamodule.val_dataloader()
    loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
    return next(iter(loader))


def images_of(batch: Any) -> Tensor:
    """The images of a data batch: ``(images, targets)`` or images alone."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


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


def export(cfg: DictConfig) -> dict:
    """Export the configured network (module docstring); returns the card."""
    from src.export.card import write_card
    from src.export.detection import detection_parity, ssd_nms_spec
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

    check_options(cfg)
    start = time.perf_counter()
    L.seed_everything(cfg.seed)
    datamodule, task = build_from_checkpoint(cfg)
    task.eval()
    net = task.net.eval()
    datamodule.prepare_data()
    datamodule.setup("fit")
    out = Path(cfg.out) if cfg.out else Path(cfg.paths.output_dir) / type(net).__name__.lower()
    if is_text_network(net) or isinstance(net, DeLighTEncoderDecoder):
        if cfg.format != "onnx" or cfg.quantize is not None:
            raise UsageError(
                f"{type(net).__name__} exports as float32 ONNX only (format=onnx, quantize=null); "
                "ExecuTorch and int8 are written for the vision networks"
            )
        return text_card(cfg, task, datamodule, net, out, start)
    first = images_of(first_val_batch(datamodule))
    if cfg.get("nms"):
        if not isinstance(net, SSD) or cfg.format != "onnx" or cfg.quantize is not None:
            raise UsageError("nms=true puts SSD's post-processing into a float32 ONNX graph: "
                             "an SSD model, format=onnx, quantize=null")  # fmt: skip
        settings = {key: getattr(task, key) for key in NMS_SETTINGS}
        spec = ssd_nms_spec(net, first, settings)
    else:
        spec = vision_spec(net, first[:EXPORT_BATCH])
    if cfg.format == "executorch":
        return executorch_card(cfg, task, datamodule, net, first, out, start)
    onnx_path = export_onnx(spec, out.with_suffix(".onnx"), opset=cfg.opset or DEFAULT_OPSET)
    metadata = {"kind": "vision", "graph": spec.name, "record": record_of_run(cfg)}
    attach_metadata(onnx_path, {**metadata, **vision_metadata(datamodule, spec)})
    log.info("wrote %s", onnx_path)
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
    for check in checks:
        log.info("parity: %s", check)
    complexity = complexity_of(task, datamodule)
    card: dict[str, Any] = {
        "model": {
            "choice": hydra_choices().get("model"),
            "target": cfg.model.get("_target_"),
            "class": f"{type(net).__module__}.{type(net).__name__}",
        },
        **complexity.as_dict(),
        "checkpoint": None if cfg.ckpt_path is None else str(cfg.ckpt_path),
        "file": str(onnx_path),
        "format": cfg.format,
        "exporter": EXPORTER,
        "opset": cfg.opset or DEFAULT_OPSET,
        "inputs": graph_inputs(onnx_path),
        "outputs": spec.output_names,
        "parity": {
            "against": "eager PyTorch (eval mode) on validation images",
            "max_rel_is": "max abs error / max abs eager output",
            "checks": checks,
        },
        "operators": op_counts(onnx_path),
        "notes": spec.notes,
    }
    if cfg.quantize == "int8":
        card["int8"] = quantized(cfg, task, datamodule, spec, onnx_path, runner)
    card_path = write_card(out.with_suffix(".json"), {**card, "wall_time_s": 0.0})
    card["wall_time_s"] = round(time.perf_counter() - start, 2)
    write_card(card_path, card)
    log.info("wrote %s", card_path)
    return card


def executorch_card(
    cfg: DictConfig,
    task: L.LightningModule,
    datamodule: L.LightningDataModule,
    net: torch.nn.Module,
    images: Tensor,
    out: Path,
    start: float,
) -> dict:
    """``format=executorch``: the network lowered to XNNPACK for one image of the validation
    size (ExecuTorch plans fixed shapes), its parity on validation images, and the card; with
    ``quantize=int8`` also ``<out>.int8.pte`` (PT2E, XNNPACK quantizer, calibrated on images of
    the training split) and the validation metric of eager PyTorch, the fp32 and the int8 program."""
    from src.export.card import write_card
    from src.export.executorch import export_executorch, load_program
    from src.export.vision import vision_spec

    spec = vision_spec(net, images[:1])
    path = export_executorch(spec, out.with_suffix(".pte"))
    log.info("wrote %s", path)
    program = load_program(path)
    errors = []
    with torch.no_grad():
        for image in images[: min(len(images), 4)]:
            expected = net(image[None])
            expected = expected[0] if isinstance(expected, (tuple, list)) else expected
            errors.append(float((program([image[None]])[0] - expected).abs().max()))
    card = {
        "model": {"choice": hydra_choices().get("model"), "target": cfg.model.get("_target_")},
        **complexity_of(task, datamodule).as_dict(),
        "checkpoint": None if cfg.ckpt_path is None else str(cfg.ckpt_path),
        "file": str(path),
        "format": "executorch",
        "backend": "XNNPACK",
        "input": {"name": "image", "shape": list(images[:1].shape), "dynamic": []},
        "parity": {
            "against": "eager PyTorch (eval mode), one validation image at a time",
            "max_abs": max(errors),
        },
        "notes": [*spec.notes, "ExecuTorch program planned for this one input shape"],
    }
    if cfg.quantize == "int8":
        card["int8"] = executorch_int8(cfg, task, datamodule, spec, out, program)
    card["wall_time_s"] = round(time.perf_counter() - start, 2)
    write_card(out.with_suffix(".json"), card)
    return card


def one_at_a_time(
    predict: Callable[[Tensor], Tensor], size: tuple[int, ...]
) -> Callable[[Tensor], Tensor]:
    """``predict`` for a program planned for one image of ``size`` (C, H, W), over a batch:
    each image alone (a batch's last, smaller one too)."""

    def run(images: Tensor) -> Tensor:
        if tuple(images.shape[1:]) != size:
            raise UsageError(
                f"the program takes images of {size}; the validation split has {tuple(images.shape[1:])}"
            )
        return torch.cat([predict(image[None]) for image in images])

    return run


def executorch_int8(
    cfg: DictConfig,
    task: L.LightningModule,
    datamodule: L.LightningDataModule,
    spec: Any,
    out: Path,
    fp32_program: Callable[[list[Tensor]], list[Tensor]],
) -> dict[str, Any]:
    """Write ``<out>.int8.pte`` calibrated on ``calibration_batches`` batches of the training split
    (each image alone, the program's shape); the validation metric before and after."""
    from src.export.executorch import export_executorch, load_program

    if spec.output_names != ["logits"]:
        raise UsageError("quantize=int8 measures classification and segmentation networks only")
    kind = "segmentation" if first_output_is_map(spec) else "classification"
    size = tuple(spec.inputs[0].shape[1:])
    calibration = []
    for number, batch in enumerate(datamodule.train_dataloader()):
        if number >= cfg.calibration_batches:
            break
        calibration += [(image[None],) for image in images_of(batch) if image.shape == size]
    path = export_executorch(spec, out.with_suffix(".int8.pte"), calibration=calibration)
    log.info("wrote %s", path)
    int8_program = load_program(path)

    def eager(images: Tensor) -> Tensor:
        with torch.no_grad():
            return task.net(images)

    ignore = getattr(task, "ignore_index", 255)
    metrics = {
        name: task_metric(kind, predict, datamodule.val_dataloader(), ignore)
        for name, predict in (
            ("eager", eager),
            ("fp32_executorch", one_at_a_time(lambda x: fp32_program([x])[0], size)),
            ("int8_executorch", one_at_a_time(lambda x: int8_program([x])[0], size)),
        )
    }
    log.info("validation %s: %s", kind, metrics)
    return {
        "file": str(path),
        "method": "PT2E with the XNNPACK quantizer: symmetric int8, weights per channel, static",
        "calibration": f"{len(calibration)} images of {cfg.calibration_batches} training batches",
        "split": "val",
        "metric": metrics,
    }


def quantized(
    cfg: DictConfig,
    task: L.LightningModule,
    datamodule: L.LightningDataModule,
    spec: Any,
    onnx_path: Path,
    runner: Any,
) -> dict[str, Any]:
    """Write ``<out>.int8.onnx`` calibrated on the training split; the validation metric of eager
    PyTorch, the fp32 file and the int8 file."""
    from src.export.onnx import run_session, session
    from src.export.quantize import calibration_feeds, quantize_int8

    if spec.output_names != ["logits"]:
        raise UsageError("quantize=int8 measures classification and segmentation networks only")
    kind = "segmentation" if first_output_is_map(spec) else "classification"
    int8_path = onnx_path.with_suffix(".int8.onnx")
    feeds = calibration_feeds(
        datamodule.train_dataloader(), spec.input_names[0], cfg.calibration_batches
    )
    quantize_int8(onnx_path, int8_path, feeds, activations=cfg.int8_activations)
    log.info("wrote %s", int8_path)
    int8_runner = session(int8_path)
    ignore = getattr(task, "ignore_index", 255)

    def onnx_predict(which: Any) -> Callable[[Tensor], Tensor]:
        return lambda images: run_session(which, spec.input_names, (images,))[0]

    def eager(images: Tensor) -> Tensor:
        with torch.no_grad():
            return task.net(images)

    metrics = {
        name: task_metric(kind, predict, datamodule.val_dataloader(), ignore)
        for name, predict in (
            ("eager", eager),
            ("fp32_onnx", onnx_predict(runner)),
            ("int8_onnx", onnx_predict(int8_runner)),
        )
    }
    log.info("validation %s: %s", kind, metrics)
    return {
        "file": str(int8_path),
        "method": (
            "onnxruntime quantize_static, QDQ, weights int8 per channel, activations "
            f"{cfg.int8_activations}; the "
            "dense products only (convolutions of one group, matrix products with a constant weight)"
        ),
        "calibration": f"{cfg.calibration_batches} batches of the training split (min/max)",
        "split": "val",
        "metric": metrics,
    }


def first_output_is_map(spec: Any) -> bool:
    """Whether the network's output is a per-pixel map (segmentation)."""
    with torch.no_grad():
        return spec.module(*spec.inputs).dim() == 4


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
    start: float,
) -> dict:
    """A text network's graphs (:func:`src.export.text.text_specs`; translation: the encoder and
    the decoder step), each ``<out>.<graph>.onnx`` for translation and ``<out>.onnx`` otherwise,
    checked through their runtimes against eager PyTorch on a validation batch; the card."""
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
        export_onnx(spec, path, opset=cfg.opset or DEFAULT_OPSET)
        metadata = {"kind": kind, "graph": spec.name, **settings, "record": record}
        attach_metadata(path, {**metadata, "vocabulary": vocabulary})
        log.info("wrote %s", path)
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
    for found in checks:
        log.info("parity, %s: max abs %.3g", found["compared"], found["max_abs"])
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
        "parity": {
            "against": "eager PyTorch (eval mode) on a validation batch, through the runtime",
            "checks": checks,
        },
        "wall_time_s": round(time.perf_counter() - start, 2),
    }
    write_card(out.with_suffix(".json"), card)
    log.info("wrote %s", out.with_suffix(".json"))
    return card
