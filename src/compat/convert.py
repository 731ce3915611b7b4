"""Official weights as a checkpoint of this project: ``python -m src.compat.convert``.

    python -m src.compat.convert <official file> family=edgenets|delight|pru|group_transformer \\
        model=<config> data=<config> [model.x=... data.y=...] out=<path.ckpt>

The train config is composed with the overrides (as ``train.py`` composes it), the datamodule,
network and task are built (:func:`src.build.build_task`; no dataset is read), the official
weights fill the network through the family's converter (:mod:`src.compat`), and a checkpoint in
the layout the commands read is written, whole or not at all: ``state_dict`` (the task's, keys
``net.*``), the run record (``lightnets``: the choices and the ``model``, ``data`` and ``task``
sections, plus ``converted_from``) and ``pytorch-lightning_version``. ``eval.py``, ``predict.py``,
``generate.py``, ``translate.py`` and ``export.py`` then run from that file alone
(``ckpt_path=<out>``), and ``train.py ... task.init_checkpoint=<out>`` fine-tunes it.

The official file is read with ``torch.load(..., weights_only=True)`` on the CPU: a flat state dict
(the EdgeNets ``.pth`` releases, a PRU ``RNNModel`` or ``MemTransformerLM`` state dict), a dict
holding one under ``state_dict`` (and its constructor arguments under ``config``, as the reference
fixtures store them), or a fairseq checkpoint (``{"args": Namespace, "model": state_dict}``, the
DeLighT releases). Where the file gives sizes (``config``, fairseq ``args``, the embedding's rows,
the classifier's classes), they are checked against the composed model before anything is built:
a difference names the key and the override that fixes it. A size the config leaves to the data
(``data.vocab_size: null``) is taken from the file.

``family=`` must be the family that converts to the composed network
(:func:`src.compat.family_of`); the families are listed in :data:`FAMILY_NAMES`. ``eval.py`` and
``export.py`` still read the dataset (a split, a batch to trace), as for any checkpoint.

Like ``python -m src.datamodules.check``, a command under ``src/``: the one module of
:mod:`src.compat` that composes configs with Hydra and builds through :mod:`src.build`; the
converters it calls never import it.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from torch import Tensor

from src.build import build_task, check_config, hydra_choices
from src.compat import (
    FAMILIES,
    OfficialWeightsError,
    delight,
    edgenets,
    family_of,
    group_transformer,
    pru,
)
from src.ops.dextra import dextra_max_groups
from src.utils.errors import InputFileError, UsageError, reported_in_one_line
from src.utils.files import atomic_path
from src.utils.run_record import RECORD_KEY, describe_data, describe_model, make_record

log = logging.getLogger("convert")  # the command's name in its log lines

CONF = Path(__file__).resolve().parents[2] / "conf"

# family= on the command line -> the converter family's name (src.compat.FAMILIES)
FAMILY_NAMES: Mapping[str, str] = {
    "edgenets": edgenets.FAMILY,
    "delight": delight.FAMILY,
    "pru": pru.FAMILY,
    "group_transformer": group_transformer.FAMILY,
}

# the official Transformer-XL / Group-Transformer constructor arguments -> ours
MEM_TRANSFORMER_ARGUMENTS = {
    "n_token": "n_token",
    "n_layer": "n_layer",
    "d_model": "d_model",
    "n_head": "n_head",
    "d_inner": "d_inner",
    "n_group": "n_group",
    "tgt_len": "tgt_len",
    "mem_len": "mem_len",
    "tie_weight": "tie_weight",
    "pre_lnorm": "pre_norm",
}
# official tensors whose first dimension is a model argument: (family, tensor, argument)
ROWS = (
    (group_transformer.FAMILY, "word_emb.emb_layers.0.weight", "n_token"),
    (pru.FAMILY, "encoder.weight", "num_embeddings"),
    (delight.FAMILY, "encoder.embed_tokens.map_layer.weight", "src_vocab"),
    (delight.FAMILY, "decoder.embed_tokens.map_layer.weight", "tgt_vocab"),
    (delight.FAMILY, "decoder.embed_tokens.map_layer.weight", "vocab_size"),  # language model
    (edgenets.FAMILY, "classifier.weight", "num_classes"),  # ESPNetv2
    (edgenets.FAMILY, "classifier.2.weight", "num_classes"),  # DiCENet
    (edgenets.FAMILY, "bu_dec_l4.merge_layer.3.bias", "num_classes"),  # ESPNetv2 segmentation
    (edgenets.FAMILY, "eff_pool_128x128.merge_layer.3.bias", "num_classes"),  # DiCENet seg.
)
# the DeLighT language model's adaptive-input bands
ADAPTIVE_BANDS = re.compile(r"decoder\.embed_tokens\.map_layer\.embeddings\.\d+\.weight")
# model arguments whose null means a value computed from others (the models' own rules)
NULL_MEANS = {
    "num_blocks": lambda model: model.get("n_max"),
    "max_groups": lambda model: dextra_max_groups(model["d_model"]) if "d_model" in model else None,
}
# what to run with the checkpoint, by the task choice (besides eval.py and export.py)
USES = {
    "classification": "python predict.py ckpt_path={out} image=<image file>",
    "multilabel": "python predict.py ckpt_path={out} image=<image file>",
    "segmentation": "python predict.py ckpt_path={out} image=<image file>",
    "detection": "python predict.py ckpt_path={out} image=<image file>",
    "char_lm": "python generate.py ckpt_path={out} prompt='<text>'",
    "word_lm": "python generate.py ckpt_path={out} prompt='<text>'",
    "awd_lm": "python generate.py ckpt_path={out} prompt='<text>'",
    "translation": "python translate.py ckpt_path={out} '<a source sentence>'",
}


# the official names a family's whole-model file holds, quoted when a file does not fit
LAYOUTS = {
    edgenets.FAMILY: "an EdgeNets release: level1.*, level2_0.* ... (classification) or base_net.* "
    "with the EPP decoder (segmentation)",
    delight.FAMILY: "a fairseq DeLighT checkpoint: encoder.embed_tokens.*, encoder.layers.<b>.*, "
    "decoder.embed_tokens.*, decoder.layers.<b>.*, decoder.project_out_dim.weights (a language "
    "model: the decoder's alone, with decoder.adaptive_softmax.*)",
    pru.FAMILY: "an RNNModel state dict: encoder.weight, rnns.<l>.pt.pyramid.<k>.{weight,bias}, "
    "rnns.<l>.glt.{W,bias} (or an LSTM's rnns.<l>.{weight,bias}_{ih,hh}_l0), decoder.{weight,bias}",
    group_transformer.FAMILY: "a MemTransformerLM state dict: word_emb.emb_layers.0.weight, "
    "layers.<i>.*, r_w_bias, r_r_bias, crit.out_layers.0.*",
}


class ConvertError(OfficialWeightsError):
    """Official weights that cannot become a checkpoint as asked; the message is one line naming
    the file, what differs and the fix."""


def read_official_file(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The state dict an official file holds and the sizes it states (``config`` or fairseq
    ``args``; empty when it states none).

    Read with ``weights_only=True`` (fairseq's ``argparse.Namespace`` allowed); ``module.``
    prefixes (DataParallel) are removed.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"official weights {path}: no such file")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ConvertError(
            f"official weights {path}: torch.load(weights_only=True) cannot read it "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        ) from None
    if not isinstance(loaded, Mapping):
        raise ConvertError(
            f"official weights {path} hold a {type(loaded).__name__}, not a state dict"
        )
    config: dict[str, Any] = {}
    if isinstance(loaded.get("model"), Mapping):  # a fairseq checkpoint
        loaded, config = delight.unwrap_checkpoint(loaded)
    elif isinstance(loaded.get("state_dict"), Mapping):  # a reference fixture
        config = dict(loaded["config"]) if isinstance(loaded.get("config"), Mapping) else {}
        loaded = loaded["state_dict"]
    state = {str(key).removeprefix("module."): value for key, value in loaded.items()}
    not_tensors = sorted(key for key, value in state.items() if not isinstance(value, Tensor))
    if not_tensors:
        raise ConvertError(
            f"official weights {path} are not a state dict: {not_tensors[:5]} are not tensors"
        )
    return state, config


def official_sizes(
    family: str, state: Mapping[str, Tensor], config: Mapping[str, Any]
) -> dict[str, Any]:
    """The model arguments (our names) that an official file states or its tensors fix."""
    sizes: dict[str, Any] = {}
    for owner, tensor, argument in ROWS:
        if owner == family and tensor in state:
            sizes[argument] = int(state[tensor].shape[0])
    if family == group_transformer.FAMILY:
        sizes |= {
            ours: config[theirs]
            for theirs, ours in MEM_TRANSFORMER_ARGUMENTS.items()
            if theirs in config
        }
    elif family == delight.FAMILY:
        translation = any(key.startswith("encoder.") for key in state)
        bands = [v for k, v in state.items() if ADAPTIVE_BANDS.fullmatch(k)]
        if bands and not translation:  # the adaptive input's bands: the vocabulary in order
            sizes["vocab_size"] = sum(int(band.shape[0]) for band in bands)
        if config:
            sizes |= delight.mt_arguments(config) if translation else delight.lm_arguments(config)
    return sizes


def _reference(raw: Any) -> str | None:
    """``data.vocab_size`` of the value ``${data.vocab_size}``; None for any other value."""
    if isinstance(raw, str) and raw.startswith("${data.") and raw.endswith("}"):
        inner = raw[2:-1]
        if all(part.isidentifier() for part in inner.split(".")):
            return inner
    return None


def _same(stated: Any, composed: Any) -> bool:
    if isinstance(stated, float) or isinstance(composed, float):
        return composed is not None and math.isclose(float(stated), float(composed), abs_tol=1e-9)
    return stated == composed


def _override_value(value: Any) -> str:
    """``value`` as a command-line override writes it (``true``, ``[100,200]``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return f"[{','.join(_override_value(item) for item in value)}]"
    return str(value)


def apply_official_sizes(cfg: DictConfig, sizes: Mapping[str, Any], path: Path) -> None:
    """Check ``sizes`` against the composed model; a size the config leaves to the data
    (``${data.x}`` with ``data.x: null``) is set from the file. Raises naming each difference and
    the overrides that fix them."""
    raw = OmegaConf.to_container(cfg.model, resolve=False)
    differences, fixes = [], []
    resolved = OmegaConf.to_container(cfg.model, resolve=True)
    for key, stated in sizes.items():
        if key not in raw:  # an argument the config leaves at the constructor's default
            if key in NULL_MEANS and not _same(stated, NULL_MEANS[key](resolved)):
                differences.append(
                    f"{key}={stated} in the file, {NULL_MEANS[key](resolved)} composed"
                )
                fixes.append(f"+model.{key}={_override_value(stated)}")
            continue
        data_key = _reference(raw[key])
        if data_key is not None and OmegaConf.select(cfg, data_key) is None:
            OmegaConf.update(cfg, data_key, stated)
            log.info("%s=%s from %s", data_key, stated, path)
            continue
        composed = resolved[key]
        if composed is None and key in NULL_MEANS:
            composed = NULL_MEANS[key](resolved)
        if not _same(stated, composed):
            override = data_key or f"model.{key}"
            differences.append(f"{key}={stated} in the file, {composed} composed")
            fixes.append(f"{override}={_override_value(stated)}")
    if differences:
        raise ConvertError(
            f"official weights {path} do not fit the composed model: {'; '.join(differences)}; "
            f"pass {' '.join(fixes)}"
        )


def compose_train_config(overrides: Sequence[str]) -> DictConfig:
    """``conf/train.yaml`` composed with ``overrides``, as ``train.py`` sees it (checked)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:  # a typo in an override
        raise UsageError(f"{' '.join(str(error).split())}") from None
    HydraConfig.instance().set_config(cfg)  # hydra.runtime.* as a run sees it (paths.output_dir)
    with open_dict(cfg):
        del cfg["hydra"]
    check_config(cfg, "train")
    return cfg


def check_family(family: str) -> str:
    """The converter family of ``family=``; a one-line error listing the valid names."""
    if family not in FAMILY_NAMES:
        raise UsageError(f"family={family} is not one of {sorted(FAMILY_NAMES)}")
    return FAMILY_NAMES[family]


def convert(
    weights: str | Path, family: str, overrides: Sequence[str], out: str | Path
) -> dict[str, Any]:
    """Write the checkpoint of ``weights`` (an official file of ``family``) for the network that
    ``overrides`` compose; returns the checkpoint written."""
    name, path, out = check_family(family), Path(weights), Path(out)
    state, config = read_official_file(path)
    cfg = compose_train_config(overrides)
    apply_official_sizes(cfg, official_sizes(name, state, config), path)
    _, task = build_task(cfg)
    found = family_of(task.net)
    if found != name:
        valid = [cli for cli, family_name in FAMILY_NAMES.items() if family_name == found]
        fits = f"family={valid[0]} converts to it" if valid else "no family converts to it"
        raise UsageError(
            f"family={family} does not convert to {type(task.net).__name__} (model="
            f"{hydra_choices().get('model')}): {fits}; valid families: {sorted(FAMILY_NAMES)}"
        )
    try:
        FAMILIES[name].load_official(task.net, state)
    except OfficialWeightsError as error:
        raise ConvertError(
            f"official weights {path} do not fit {type(task.net).__name__}: {error} (expected "
            f"{LAYOUTS[name]})"
        ) from None
    record = make_record(cfg, hydra_choices())
    record["converted_from"] = {"path": str(path.resolve()), "family": family}
    checkpoint = {
        "state_dict": task.state_dict(),
        RECORD_KEY: record,
        "pytorch-lightning_version": L.__version__,
        "epoch": 0,
        "global_step": 0,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as temporary:
        torch.save(checkpoint, temporary)
    return checkpoint


def usage_lines(checkpoint: Mapping[str, Any], out: Path, overrides: Sequence[str]) -> list[str]:
    """What was written, and the command lines that use it (``overrides``: the conversion's, for
    fine-tuning the same network)."""
    record = checkpoint[RECORD_KEY]
    choices, sections = record["choices"], record["config"]
    what = (
        f"{describe_model(sections['model'], choices.get('model'))}, "
        f"{describe_data(sections['data'], choices.get('data'))}"
    )
    lines = [f"wrote {out} ({what})", "use it with:", f"  python eval.py ckpt_path={out}"]
    if choices.get("task") in USES:
        lines.append(f"  {USES[choices['task']].format(out=out)}")
    lines += [
        f"  python export.py ckpt_path={out}",
        (
            f"  python train.py {' '.join(overrides)} task.init_checkpoint={out}   "
            "(fine-tuning: a fresh optimiser and schedule)"
        ),
    ]
    return lines


def split_arguments(arguments: Sequence[str]) -> tuple[str | None, str | None, list[str]]:
    """``family=`` and ``out=`` apart from the config overrides."""
    family = out = None
    overrides = []
    for argument in arguments:
        if argument.startswith("family="):
            family = argument.split("=", 1)[1]
        elif argument.startswith("out="):
            out = argument.split("=", 1)[1]
        else:
            overrides.append(argument)
    return family, out, overrides


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring); 0 when the checkpoint was written."""
    parser = argparse.ArgumentParser(
        prog="python -m src.compat.convert",
        description="Write official weights as a checkpoint of this project, runnable by eval.py, "
        "predict.py, generate.py, translate.py and export.py (ckpt_path=<out>).",
        epilog="example: python -m src.compat.convert espnetv2_s_0.5_pascal_256x256.pth "
        "family=edgenets model=espnetv2_seg data=voc_seg model.scale=0.5 out=espnetv2_voc.ckpt",
    )
    parser.add_argument("weights", help="the official weights file (.pth, .pt, fairseq checkpoint)")
    parser.add_argument(
        "arguments",
        nargs="*",
        help=f"family={{{','.join(FAMILY_NAMES)}}}, out=<path.ckpt> and train config overrides "
        "(model=..., data=..., model.scale=0.5, data.vocab_size=...)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    family, out, overrides = split_arguments(args.arguments)
    with reported_in_one_line():
        if family is None or out is None:
            missing = " ".join(
                name for name, value in (("family=", family), ("out=", out)) if value is None
            )
            raise UsageError(f"pass {missing} (family: one of {sorted(FAMILY_NAMES)})")
        checkpoint = convert(args.weights, family, overrides, out)
        print("\n".join(usage_lines(checkpoint, Path(out), overrides)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
