"""What an exported ONNX file says about itself, in its ``metadata_props`` under one key.

``export.py`` writes, as one JSON object: ``kind`` (the runtime of :mod:`src.export.runtime` that
drives the graph: ``vision``, ``segment_lm``, ``awd_lm``, ``word_lm``, ``classifier``,
``translation``), ``graph`` (``network``, ``step``, ``encoder``, ``decoder_step``), the settings
the runtime needs (``mem_len``, ``padding_idx``, ...) and ``record``: the run record of the
network (:mod:`src.utils.run_record`; the checkpoint's own when exported from one), so
``predict.py``, ``generate.py`` and ``translate.py`` rebuild the data pipeline and post-processing
from the file alone. A text graph adds ``vocabulary`` (:mod:`src.export.vocabulary`); a vision
graph adds ``task``, ``input`` and ``classes`` (:func:`vision_metadata`), which is all an
application that runs the file with onnxruntime alone needs to feed it an image and name what
it predicts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from src.export.spec import ExportSpec
from src.utils.errors import UsageError
from src.utils.files import atomic_path

KEY = "lightnets"


def attach_metadata(path: str | Path, metadata: dict[str, Any]) -> Path:
    """Write ``metadata`` (JSON-serialisable) into the ONNX file at ``path``, replacing what this
    project wrote there before; the file is rewritten whole or not at all."""
    import onnx

    path = Path(path)
    model = onnx.load(str(path))
    kept = [p for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=KEY, value=json.dumps(metadata, sort_keys=True))
    with atomic_path(path) as temporary:
        onnx.save(model, str(temporary))
    return path


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata this project wrote into the ONNX file at ``path`` ({} for another file)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == KEY:
            return json.loads(prop.value)
    return {}


def exported_file(path: str | Path) -> Path:
    """The ONNX file ``onnx=<path>`` names: the file itself, or for a stem ``<out>`` the file
    ``export.py`` wrote for it (``<out>.onnx``, or a translation's ``<out>.encoder.onnx``)."""
    path = Path(path)
    for candidate in (path, Path(f"{path}.onnx"), Path(f"{path}.encoder.onnx")):
        if candidate.is_file():
            return candidate
    raise UsageError(
        f"onnx={path}: no such file; pass the .onnx file export.py wrote (a translation export: "
        "<out>.encoder.onnx and <out>.decoder_step.onnx side by side)"
    )


def exported_record(path: str | Path) -> dict[str, Any]:
    """The run record an exported file carries, or a one-line error for a file without one."""
    record = read_metadata(exported_file(path)).get("record")
    if not isinstance(record, dict):
        raise UsageError(
            f"onnx={path} carries no run record of this project; export it with python export.py "
            "ckpt_path=<a run's .ckpt>"
        )
    return record


def vision_metadata(datamodule: Any, spec: ExportSpec) -> dict[str, Any]:
    """What a vision graph's file says about its input and output besides the run record.

    - ``task``: ``classification`` (logits (B, K)), ``segmentation`` (logits (B, K, H, W)) or
      ``detection`` (SSD's offsets and class logits, or with NMS in the graph boxes, scores and
      labels);
    - ``input``: how an image becomes the graph's input, as ``predict.py`` does it: ``name``,
      ``layout`` (``NCHW``), ``mode`` (the PIL mode it is converted to, ``L`` or ``RGB``),
      ``size`` ([H, W] the network was trained at: the resize target, PIL bilinear),
      ``dynamic_size`` (whether other H, W are taken) and ``size_step`` (their multiple, or null),
      ``scale`` (pixel values times this, 1/255), ``mean`` and ``std`` (one per plane of
      ``mode``, subtracted and divided after scaling) and ``channels`` (the planes are repeated to
      this many channels: a grey plane for a 3-channel network);
    - ``classes``: the class names in label order (detection: ``background`` first).
    """
    import torch

    from src.datamodules.image_conventions import (
        classification_names,
        detection_names,
        image_normalisation,
        segmentation_names,
    )

    mode, mean, std = image_normalisation(datamodule)
    name = spec.input_names[0]
    axes = spec.dynamic.get(name, {})
    height, width = datamodule.example_input().shape[-2:]
    with torch.no_grad():
        out = spec.module(*spec.inputs)
    if isinstance(out, (tuple, list)):
        task = "detection"
        classes = detection_names(datamodule, getattr(datamodule, "num_classes", 0))
    elif out.dim() == 4:
        task, classes = "segmentation", segmentation_names(out.shape[1])
    else:
        task, classes = "classification", classification_names(datamodule, out.shape[1])
    dynamic = 2 in axes and 3 in axes
    return {
        "task": task,
        "input": {
            "name": name,
            "layout": "NCHW",
            "mode": mode,
            "channels": int(spec.inputs[0].shape[1]),
            "size": [int(height), int(width)],
            "dynamic_size": dynamic,
            "size_step": spec.steps.get(axes[2]) if dynamic else None,
            "scale": 1 / 255,
            "mean": list(mean),
            "std": list(std),
        },
        "classes": list(classes),
    }
