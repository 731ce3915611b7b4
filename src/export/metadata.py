"""What an exported ONNX file says about itself, in its ``metadata_props`` under one key.

``export.py`` writes: ``kind`` (the runtime of :mod:`src.export.runtime` that drives the graph:
``vision``, ``segment_lm``, ``awd_lm``, ``word_lm``, ``classifier``, ``translation``), ``graph``
(``network``, ``step``, ``encoder``, ``decoder_step``), the settings the runtime needs
(``mem_len``, ``padding_idx``, ...) and ``record``: the run record of the network
(:mod:`src.utils.run_record`), so ``predict.py``, ``generate.py`` and ``translate.py`` rebuild the
data pipeline, vocabulary and post-processing from the file alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
