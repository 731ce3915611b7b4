"""Checks on a composed config that Hydra does not make: keys nobody reads, model/data pairs that
cannot work, a GPU Trainer without a GPU. They run before anything is built, so a mistake costs one
line, not a crash deep inside instantiation. Also the one-line messages for what Hydra's composition
refuses (an unknown config-group option or key: :func:`unknown_option`, :func:`unknown_key`)."""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Iterable, Mapping
from pathlib import Path

from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator
from omegaconf import DictConfig, OmegaConf

from src.utils.errors import UserError

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
    "group_transformer": frozenset({"char_lm"}),
    "transformer_xl": frozenset({"char_lm"}),
    "group_transformer_lm": frozenset({"segment_word_lm"}),
    "transformer_xl_lm": frozenset({"segment_word_lm"}),
    "delight_lm": frozenset({"word_lm"}),
    "transformer_lm": frozenset({"word_lm"}),
    "awd_lm": frozenset({"awd_lm"}),
    "delight_mt": frozenset({"translation"}),
    "transformer_mt": frozenset({"translation"}),
    "delight_classifier": frozenset({"text_classification"}),
    "transformer_classifier": frozenset({"text_classification"}),
}


class ConfigError(UserError, ValueError):
    """A composed config that cannot run as asked; the message names the fix."""


def known_top_level_keys(config_name: str) -> set[str]:
    """The config groups under ``conf/`` and the keys of the primary config ``conf/<name>.yaml``."""
    groups = {path.name for path in CONF.iterdir() if path.is_dir()}
    primary = OmegaConf.load(CONF / f"{config_name}.yaml")
    return groups | {str(key) for key in primary.keys() if key != "defaults"} | {"hydra"}


def reject_unknown_keys(cfg: DictConfig, known: Iterable[str]) -> None:
    """Raise :class:`ConfigError` for top-level keys nobody reads (``+modle=dicenet`` adds
    ``modle``)."""
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


def closest_first(name: str, names: Iterable[str]) -> list[str]:
    """``names`` sorted by their likeness to ``name`` (difflib's ratio), the closest first."""
    likeness = {other: difflib.SequenceMatcher(None, name, other).ratio() for other in names}
    return sorted(likeness, key=lambda other: (-likeness[other], other))


def nested_options(missing: str) -> tuple[str, str, list[str]] | None:
    """For ``missing``, a config path Hydra could not find (``experiment/char_lm/demoo``), the
    config group under ``conf/`` it names (``experiment``), the option asked for (``char_lm/demoo``)
    and the group's options in its sub-folders (``char_lm/demo``, ...); None where ``conf/`` has no
    such group. Hydra lists only the options directly in a group's folder."""
    parts = missing.split("/")
    for depth in range(1, len(parts)):
        folder = CONF.joinpath(*parts[:depth])
        if folder.is_dir():
            files = folder.rglob("*.yaml")
            options = sorted(p.relative_to(folder).with_suffix("").as_posix() for p in files)
            return "/".join(parts[:depth]), "/".join(parts[depth:]), options
    return None


def unknown_option(group: str, option: str, options: Iterable[str]) -> ConfigError:
    """The error for ``group=option`` where ``conf/<group>/`` has no ``option``: the group's
    options, closest first (``model=dicnet``)."""
    ranked = closest_first(option, options)
    close = difflib.get_close_matches(option, ranked, n=1)
    hint = f" (did you mean {group}={close[0]}?)" if close else ""
    return ConfigError(
        f"{group}={option}: no such option{hint}. The options of {group}, closest first: "
        f"{', '.join(ranked)}"
    )


def unknown_key(full_key: str, keys: Iterable[str]) -> ConfigError:
    """The error for overriding ``full_key`` (``data.batchsize=64``) where its parent holds only
    ``keys``: the closest key and all of them, as :func:`check_config_values` names them for the
    ``+`` form."""
    parent, _, key = full_key.rpartition(".")
    prefix = f"{parent}." if parent else ""
    keys = sorted(str(k) for k in keys if not str(k).startswith("_"))  # not Hydra's _target_
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
    known = ", ".join(prefix + k for k in keys) or "no keys"
    if not parent:  # a new top-level key is one nobody reads (reject_unknown_keys)
        return ConfigError(f"{full_key}{hint}: no such key or config group; the config has {known}")
    return ConfigError(
        f"{full_key}{hint}: no such key; {parent} has {known} (+{full_key}=... adds a new key)"
    )


def check_accelerator(trainer: Mapping[str, object], choice: str | None) -> None:
    """Raise :class:`ConfigError` when the Trainer asks for a GPU (``trainer=gpu``, ``ddp``,
    ``fsdp``) on a machine without one, where Lightning's own check would end in a traceback of
    its ``MisconfigurationException``. ``choice``: the ``trainer`` option chosen."""
    accelerator = str(trainer.get("accelerator"))
    cuda, mps = CUDAAccelerator.is_available(), MPSAccelerator.is_available()
    # Lightning's "gpu" is CUDA or Apple's MPS
    present = {"gpu": cuda or mps, "cuda": cuda, "mps": mps}.get(accelerator, True)
    if not present:
        raise ConfigError(
            f"trainer.accelerator={accelerator} (trainer={choice}): this machine has no GPU that "
            "PyTorch can use; train on the CPU with trainer=cpu (trainer=ddp_cpu for data-parallel "
            "CPU processes)"
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
            f"model={model} does not fit data={data}: {model} serves "
            f"{'/'.join(sorted(MODEL_TASKS[model]))}, data={data} is a {task} dataset; choose one "
            f"of model={'|'.join(fitting)}"
        )


# keys that must hold a positive integer wherever they appear under data.* and task.*
POSITIVE_INTS = frozenset({"batch_size", "eval_batch_size", "test_batch_size", "max_tokens",
                           "eval_max_tokens", "epochs"})  # fmt: skip
# keys that must hold a positive number wherever they appear under task.* (the optimiser's too)
POSITIVE_NUMBERS = frozenset({"lr"})
# Hydra's instantiation keys, and what the tools pass besides the config
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_"})
PASSED_BY_THE_TOOLS = {"task": frozenset({"net"})}


def check_config_values(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` before anything is built for a ``model.*``, ``data.*`` or
    ``task.*`` key that its constructor does not take (``+model.d_modle=64``, which Hydra suggests
    for a misspelt key, would otherwise end in a ``TypeError`` from the constructor), and for a
    batch size, token budget, epoch count or learning rate that is not positive (which would
    otherwise fail after the data's preparation, minutes later)."""
    for group in ("model", "data", "task"):
        node = cfg.get(group)
        if isinstance(node, DictConfig):
            _check_arguments(node, group, PASSED_BY_THE_TOOLS.get(group, frozenset()))
            _check_numbers(node, group)
    trainer = cfg.get("trainer")
    if isinstance(trainer, DictConfig):
        for key, lowest in (("max_epochs", -1), ("max_steps", -1)):
            value = _value(trainer, key)
            if (
                isinstance(value, int)
                and not isinstance(value, bool)
                and (value < lowest or value == 0)
            ):
                raise ConfigError(
                    f"trainer.{key}={value}: must be a positive integer, or -1 for no limit"
                )


def _value(node: DictConfig, key: str) -> object:
    """``node[key]``, None where it is missing or cannot be resolved yet (an interpolation of a
    value the data fills in later)."""
    try:
        return node.get(key)
    except Exception:  # an unresolved ${...}: checked where it is resolved
        return None


def _check_arguments(node: DictConfig, path: str, passed: frozenset[str]) -> None:
    """``node``'s keys against its ``_target_``'s signature, then its nested targets'."""
    target = node.get("_target_") if "_target_" in node else None
    if isinstance(target, str):
        parameters = _parameters(target)
        if parameters is not None:
            unknown = [str(k) for k in node if k not in HYDRA_KEYS | passed | parameters]
            if unknown:
                name = target.rsplit(".", 1)[-1]
                hints = []
                for key in unknown:
                    close = difflib.get_close_matches(key, sorted(parameters), n=1)
                    hint = f" (did you mean {path}.{close[0]}?)" if close else ""
                    hints.append(f"{path}.{key}{hint}")
                raise ConfigError(
                    f"{', '.join(hints)}: {name} ({target}) takes no such argument. Its "
                    f"arguments: {', '.join(f'{path}.{p}' for p in sorted(parameters))}"
                )
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            _check_arguments(child, f"{path}.{key}", frozenset())


def _parameters(target: str) -> set[str] | None:
    """The keyword arguments ``target`` (a class or function path) takes, or None when it takes
    any (``**kwargs``) or cannot be imported here (its own error comes at instantiation)."""
    try:
        signature = inspect.signature(_import(target))
    except Exception:  # not importable here, or no signature: instantiation reports it
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return None
    return {
        name for name, p in signature.parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }  # fmt: skip


def _import(target: str) -> object:
    """The object a ``_target_`` path names: a module's attribute, or an attribute of one."""
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"cannot import {target}")


def _check_numbers(node: DictConfig, path: str) -> None:
    """Positive batch sizes, token budgets and epoch counts; positive learning rates."""
    for key in node:
        child = node._get_node(key)
        where = f"{path}.{key}"
        if isinstance(child, DictConfig):
            if not child._is_missing() and not child._is_none():
                _check_numbers(child, where)
            continue
        value = _value(node, str(key))
        if value is None or isinstance(value, bool):
            continue
        if key in POSITIVE_INTS and (not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{where}={value}: must be a positive integer")
        if key in POSITIVE_NUMBERS and (not isinstance(value, int | float) or value <= 0):
            raise ConfigError(f"{where}={value}: must be a positive number (e.g. {where}=1e-3)")
