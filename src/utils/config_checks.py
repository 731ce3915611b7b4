"""Checks on a composed config that Hydra does not make: keys nobody reads, and model/data pairs
that cannot work. Both run before anything is built, so a mistake costs one line, not a crash
deep inside instantiation."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"

# The tasks each model config can serve. A model config missing here is a test failure
# (tests/test_config_checks.py), so a new model must say what it is for.
IMAGE_CLASSIFIERS = frozenset({"classification", "multilabel"})
MODEL_TASKS: dict[str, frozenset[str]] = {
    "dicenet": IMAGE_CLASSIFIERS,
    "dice_mobilenet": IMAGE_CLASSIFIERS,
    "dice_resnet": IMAGE_CLASSIFIERS,
    "espnetv2": IMAGE_CLASSIFIERS,
    "timm": IMAGE_CLASSIFIERS,
    "torchvision": IMAGE_CLASSIFIERS,
    "dicenet_seg": frozenset({"segmentation"}),
    "espnetv2_seg": frozenset({"segmentation"}),
    "torchvision_seg": frozenset({"segmentation"}),
    "ssd": frozenset({"detection"}),
    "group_transformer": frozenset({"language_model"}),
    "transformer_xl": frozenset({"language_model"}),
    "delight_lm": frozenset({"word_language_model"}),
    "transformer_lm": frozenset({"word_language_model"}),
    "awd_lm": frozenset({"awd_language_model"}),
    "delight_mt": frozenset({"translation"}),
    "transformer_mt": frozenset({"translation"}),
    "delight_classifier": frozenset({"text_classification"}),
    "transformer_classifier": frozenset({"text_classification"}),
}


class ConfigError(ValueError):
    """A composed config that cannot run as asked; the message names the fix."""


def known_top_level_keys(config_name: str) -> set[str]:
    """The config groups under ``conf/`` and the keys of the primary config ``conf/<name>.yaml``."""
    groups = {path.name for path in CONF.iterdir() if path.is_dir()}
    primary = OmegaConf.load(CONF / f"{config_name}.yaml")
    return groups | {str(key) for key in primary.keys() if key != "defaults"} | {"hydra"}


def reject_unknown_keys(cfg: DictConfig, known: Iterable[str]) -> None:
    """Raise :class:`ConfigError` for top-level keys nobody reads (``+modle=dicenet`` adds ``modle``)."""
    known = set(known)
    unknown = [str(key) for key in cfg.keys() if key not in known]
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    raise ConfigError(
        f"unknown top-level config key {', '.join(hints)}: nothing reads it. Known keys and config "
        f"groups: {', '.join(sorted(known))}. Choose a group option as group=option "
        "(e.g. model=dicenet), without '+'."
    )


def check_pairing(choices: Mapping[str, str | None]) -> None:
    """Raise :class:`ConfigError` in one line when the chosen model cannot serve the data's task.

    ``choices``: Hydra's runtime choices (``model``, ``data``, ``task``).
    """
    model, data, task = choices.get("model"), choices.get("data"), choices.get("task")
    if model is None or task is None or model not in MODEL_TASKS:
        return
    if task not in MODEL_TASKS[model]:
        fitting = sorted(name for name, tasks in MODEL_TASKS.items() if task in tasks)
        raise ConfigError(
            f"model={model} does not fit data={data}: {model} serves {'/'.join(sorted(MODEL_TASKS[model]))}, "
            f"data={data} is a {task} dataset; choose one of model={'|'.join(fitting)}"
        )
