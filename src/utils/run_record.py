"""What a checkpoint knows about the run that wrote it, and reading checkpoints with clear errors.

Every checkpoint a run writes carries a *run record* under ``checkpoint["lightnets"]``: the
project version, the config choices (``model=...``, ``data=...``, ...) and the ``model``,
``data`` and ``task`` sections of the config, resolved except for references to ``paths``
(``data.root: ${paths.data_dir}/enwik8`` stays a reference: where data lives belongs to the
machine that reads the checkpoint, not to the run). ``eval.py``, ``predict.py`` and
``generate.py`` rebuild the network from it; ``train.py`` checks a resume against it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from src.utils.errors import UserError, user_error_of
from src.utils.files import write_json
from src.utils.state_dicts import mismatch_summary, torch_load

log = logging.getLogger(__name__)

RECORD_KEY = "lightnets"
SECTIONS = ("model", "data", "task")
# the config groups whose choice is recorded (and shown in messages)
CHOICES = ("model", "data", "task", "recipe", "experiment")
# model arguments that tell two networks apart in a message
MODEL_FACTS = (
    "name", "scale", "num_classes", "in_chans", "n_token", "d_model", "n_layer", "n_head",
    "groups", "input_size", "stem_stride",
)  # fmt: skip
# modules and classes renamed since run records were first written: old dotted path -> new (a
# module maps everything in it; the longest match wins, so a class listed apart overrides it)
RENAMED_TARGETS: dict[str, str] = {
    "src.tasks.schedules": "src.optim.schedules",
    "src.tasks.clipping": "src.optim.clipping",
    "src.tasks.beam_search": "src.decoding.beam_search",
    "src.tasks.generation": "src.decoding.generation",
    "src.tasks.bleu": "src.evaluation.bleu",
    "src.tasks.voc_eval": "src.evaluation.voc_eval",
    "src.tasks.dynamic_eval": "src.evaluation.dynamic_eval",
    "src.tasks.memory_format": "src.utils.memory_format",
    "src.tasks.language_model.LanguageModel": "src.tasks.char_lm.CharLMTask",
    "src.tasks.language_model": "src.tasks.char_lm",
    "src.tasks.word_language_model.WordLanguageModel": "src.tasks.word_lm.WordLMTask",
    "src.tasks.word_language_model": "src.tasks.word_lm",
    "src.tasks.awd_language_model.AWDLanguageModelTask": "src.tasks.awd_lm.AWDLMTask",
    "src.tasks.awd_language_model": "src.tasks.awd_lm",
    "src.tasks.classification.ImageClassification": "src.tasks.classification.ClassificationTask",
    "src.tasks.multilabel.MultiLabelClassification": "src.tasks.multilabel.MultiLabelTask",
    "src.tasks.segmentation.SemanticSegmentation": "src.tasks.segmentation.SegmentationTask",
    "src.tasks.text_classification.TextClassification": (
        "src.tasks.text_classification.TextClassificationTask"
    ),
    "src.tasks.translation.Translation": "src.tasks.translation.TranslationTask",
    "src.models.delight": "src.models.delight_mt",
    "src.datamodules.word_stream.WordStreamDataModule": "src.datamodules.awd_lm.AWDLMDataModule",
    "src.datamodules.word_stream": "src.datamodules.awd_lm",
    "src.datamodules.word_lm.WikiTextDataModule": "src.datamodules.word_lm.WordLMDataModule",
    "src.models.dicenet.ChannelGate": "src.ops.dim_fuse.ChannelGate",
    "src.models.dicenet.GlobalFusion": "src.ops.dim_fuse.GlobalFusion",
    "src.models.dicenet.SpatialFusionBlock": "src.ops.dice.SpatialFusionBlock",
    "src.models.ssd.PyramidPoolingFusion": "src.ops.epp.EfficientPyramidPooling",
    # the torch primitives' fast paths left the papers' concepts for src.kernels
    "src.ops.batch_norm": "src.kernels.batch_norm",
    "src.ops.batch_norm_prelu": "src.kernels.batch_norm_prelu",
    "src.ops.prelu": "src.kernels.prelu",
    "src.ops.depthwise_conv": "src.kernels.depthwise_conv",
    "src.ops.local_fusion_conv": "src.kernels.local_fusion_conv",
    "src.ops.dropout": "src.kernels.dropout",
    "src.ops.residual_layer_norm": "src.kernels.residual_layer_norm",
    "src.ops.relative_softmax": "src.kernels.relative_softmax",
    "src.ops.fan_out": "src.kernels.fan_out",
    "src.ops.pointwise_conv": "src.kernels.pointwise_conv",
    "src.ops.pooling": "src.kernels.pooling",
    "src.ops.linear": "src.kernels.linear",
    "src.ops.inference_folding": "src.kernels.inference_folding",
    "src.ops.lstm": "src.kernels.lstm",
    "src.ops.relative_attention_cpu": "src.kernels.relative_attention.one_node_cpu",
    "src.kernels.relative_attention_cpu": "src.kernels.relative_attention.one_node_cpu",
    "src.ops.dim_conv_cpu": "src.kernels.dim_conv",
    "src.ops.pru_recurrence": "src.kernels.pru_recurrence",
}
# model arguments that loaded official weights, now task.init_checkpoint's job (src.compat)
RETIRED_MODEL_KEYS = ("pretrained", "backbone_weights")
# config options renamed since: group -> {old: new}
RENAMED_CHOICES: dict[str, dict[str, str]] = {
    "task": {
        "language_model": "char_lm",
        "word_language_model": "word_lm",
        "awd_language_model": "awd_lm",
    },
}
HOW_TO_FIND = (
    "a run writes its checkpoints under <run dir>/checkpoints/; metrics.json names the best one"
)


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be used as asked; the message says why and what to do."""


def project_version() -> str:
    try:
        return version("lightnets")
    except PackageNotFoundError:  # a source tree that was not installed
        return "unknown"


def _keep_path_references(raw: Any, resolved: Any) -> Any:
    """``resolved``, except where ``raw`` is a string that refers to ``${paths...}``."""
    if isinstance(raw, dict) and isinstance(resolved, dict):
        return {key: _keep_path_references(raw.get(key), value) for key, value in resolved.items()}
    if isinstance(raw, list) and isinstance(resolved, list) and len(raw) == len(resolved):
        return [_keep_path_references(r, v) for r, v in zip(raw, resolved)]
    if isinstance(raw, str) and "${paths." in raw:
        return raw
    return resolved


def make_record(cfg: DictConfig, choices: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run record of ``cfg`` (plain data: loads with ``weights_only=True``)."""
    config = {}
    for section in SECTIONS:
        node = cfg[section]
        config[section] = _keep_path_references(
            OmegaConf.to_container(node, resolve=False), OmegaConf.to_container(node, resolve=True)
        )
    choices = {k: v for k, v in (choices or {}).items() if k in CHOICES and v is not None}
    return {"version": project_version(), "choices": dict(choices), "config": config}


class RunRecord(Callback):
    """Writes the run record into every checkpoint the Trainer saves, with the run's wall time so
    far (``wall_time_s``: ``previous_time`` of the runs it resumes plus the time since ``start``,
    a ``time.perf_counter()`` value)."""

    def __init__(self, record: Mapping[str, Any], start: float, previous_time: float = 0.0) -> None:
        self.record = dict(record)
        self.start = start
        self.previous_time = previous_time

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        wall_time = self.previous_time + time.perf_counter() - self.start
        checkpoint[RECORD_KEY] = {**self.record, "wall_time_s": round(wall_time, 2)}


def read_checkpoint(path: str | Path, what: str = "ckpt_path") -> dict[str, Any]:
    """Load a Lightning checkpoint (tensors and plain data only) or raise a short, clear error.

    ``what`` names the setting the path came from, for the message.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what}={path}: no such file ({HOW_TO_FIND})")
    try:
        checkpoint = torch_load(path, what)
    except ValueError as error:
        raise CheckpointError(
            f"{error}. Pass a .ckpt file of this project ({HOW_TO_FIND})."
        ) from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(
            f"{what}={path} is not a Lightning checkpoint of this project (no 'state_dict'); "
            f"{HOW_TO_FIND}"
        )
    return checkpoint


def record_of(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run record, or None for checkpoints written before records (or by other code); a
    record written before a rename names today's classes and options (:func:`renamed`)."""
    record = checkpoint.get(RECORD_KEY)
    return renamed(record) if isinstance(record, dict) else None


def _renamed_target(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _renamed_target(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_renamed_target(item) for item in value]
    if isinstance(value, str) and value.startswith("src."):
        for old, new in sorted(RENAMED_TARGETS.items(), key=lambda item: -len(item[0])):
            if value == old or value.startswith(old + "."):
                return new + value[len(old) :]
    return value


def renamed(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with the ``_target_`` paths and config choices of :data:`RENAMED_TARGETS` and
    :data:`RENAMED_CHOICES` replaced by today's names (the weights' keys did not change)."""
    choices = {
        group: RENAMED_CHOICES.get(group, {}).get(choice, choice)
        for group, choice in (record.get("choices") or {}).items()
    }
    config = _renamed_target(record.get("config") or {})
    if isinstance(config.get("model"), dict):  # the checkpoint holds the weights these loaded
        config["model"] = {k: v for k, v in config["model"].items() if k not in RETIRED_MODEL_KEYS}
    return {**record, "choices": choices, "config": config}


def describe_model(model: Mapping[str, Any], choice: str | None = None) -> str:
    """``model=dicenet (DiCENet, scale=0.5, num_classes=10)``: the choice and the telling args."""
    target = str(model.get("_target_", "?")).rsplit(".", 1)[-1]
    facts = [
        f"{key}={model[key]}" for key in MODEL_FACTS if key in model and model[key] is not None
    ]
    head = f"model={choice} " if choice else ""
    return f"{head}({', '.join([target, *facts])})"


def describe_data(data: Mapping[str, Any], choice: str | None = None) -> str:
    target = str(data.get("_target_", "?")).rsplit(".", 1)[-1]
    facts = [
        f"{key}={data[key]}"
        for key in ("num_classes", "vocab_size", "in_chans", "image_size")
        if data.get(key) is not None
    ]
    head = f"data={choice} " if choice else ""
    return f"{head}({', '.join([target, *facts])})"


def describe_record(record: Mapping[str, Any] | None) -> str:
    if record is None:
        return "unknown (the checkpoint carries no run record)"
    choices, config = record.get("choices", {}), record["config"]
    return (
        f"{describe_model(config['model'], choices.get('model'))}, "
        f"{describe_data(config['data'], choices.get('data'))}"
    )


def load_task_weights(
    task: torch.nn.Module,
    checkpoint: Mapping[str, Any],
    path: str | Path,
    asked: str,
    what: str = "ckpt_path",
) -> None:
    """Load ``checkpoint["state_dict"]`` into ``task``; when it does not fit, say in a few lines
    what the checkpoint was trained with and what was asked (``asked``: a description)."""
    state = checkpoint["state_dict"]
    problems = mismatch_summary(task.state_dict(), state)
    if problems:
        raise CheckpointError(
            f"{what}={path} does not fit the network asked for:\n"
            f"  trained with: {describe_record(record_of(checkpoint))}\n"
            f"  asked for:    {asked}\n"
            f"  {problems}.\n"
            "Drop the model=/data= overrides to rebuild the network the checkpoint was trained "
            "with."
        )
    task.load_state_dict(state)


def override_key(override: str) -> str:
    """``data.batch_size`` of ``data.batch_size=32`` (also ``+key=``, ``++key=``, ``~key``)."""
    return override.split("=", 1)[0].lstrip("+~")


def config_from_checkpoint(
    cfg: DictConfig, record: Mapping[str, Any], overrides: Sequence[str]
) -> list[str]:
    """Replace the ``model``, ``data`` and ``task`` sections of ``cfg`` with the record's, except
    where the command line (``overrides``) chose otherwise; edits ``cfg`` in place.

    A group choice on the command line (``model=...``; ``experiment=...`` for all three) keeps
    that composed section; a key override (``data.batch_size=32``) is applied over the record.
    Returns one line per decision, for the log.
    """
    keys = [override_key(o) for o in overrides]
    lines = []
    for section in SECTIONS:
        if section in keys or "experiment" in keys:
            chosen = next(o for o in overrides if override_key(o) in (section, "experiment"))
            lines.append(f"{section}: as composed for {chosen} (the checkpoint's is not used)")
            continue
        composed = cfg[section]
        saved = OmegaConf.create(record["config"][section])
        applied = []
        for key in keys:
            if key.startswith(f"{section}."):
                value = OmegaConf.select(composed, key[len(section) + 1 :])
                OmegaConf.update(saved, key[len(section) + 1 :], value, force_add=True)
                applied.append(f"{key}={value}")
        with open_dict(cfg):
            cfg[section] = saved
        suffix = f", with {', '.join(applied)} from the command line" if applied else ""
        lines.append(f"{section}: from the checkpoint{suffix}")
    return lines


def differences(saved: Any, current: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, current value)`` for every leaf that differs, in key order."""
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        found = []
        for key in sorted(set(saved) | set(current), key=str):
            found += differences(saved.get(key), current.get(key), f"{prefix}.{key}")
        return found
    return [] if saved == current else [(prefix, saved, current)]


def check_resume(cfg: DictConfig, checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """Refuse to resume with a network or task (optimiser, schedule, loss) other than the one the
    checkpoint was trained with: Lightning would restore the old optimiser and schedule state
    and silently ignore the new values. Data differences are logged."""
    record = record_of(checkpoint)
    if record is None:
        log.warning("resuming %s: it carries no run record, so the config cannot be checked", path)
        return
    now = make_record(cfg)["config"]
    changed = []
    for section in ("model", "task"):
        changed += differences(record["config"][section], now[section], section)
    if changed:
        listed = "; ".join(
            f"{key}: trained with {old!r}, now {new!r}" for key, old, new in changed[:8]
        )
        raise CheckpointError(
            f"cannot resume ckpt_path={path} with changed values: {listed}. Resuming restores the "
            "network, optimiser and schedule from the checkpoint, so these would not take effect. "
            "Drop the overrides to resume, or start a new run from the weights with "
            f"task.init_checkpoint={path} (fresh optimiser and schedule)."
        )
    for key, old, new in differences(record["config"]["data"], now["data"], "data"):
        log.warning("resuming with %s=%r (the run was trained with %r)", key, new, old)


@rank_zero_only
def write_failed(run_dir: Path, error: BaseException, wall_time_s: float) -> None:
    """``<run_dir>/metrics.json`` with status ``failed`` and the error, so that a run directory a
    command leaves behind tells its failure apart from a finished run: for a user's mistake what
    the command printed after ``error:`` (also when it is the exit that
    :func:`~src.utils.errors.reported_in_one_line` raised in its place), else the exception's type
    and message."""
    cause = user_error_of(error)
    if cause is None and isinstance(error, SystemExit):
        cause = user_error_of(error.__context__)
    if cause is not None:
        message = str(cause)
    else:
        message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    summary = {"status": "failed", "error": message, "wall_time_s": wall_time_s}
    write_json(run_dir / "metrics.json", {**summary, "output_dir": str(run_dir)})
