"""Official EdgeNets (DiCENet, ESPNetv2) layer state dicts -> this project's ops.

Each ``*_key_map(official, ours, ...)`` returns an explicit map from official keys to ours (plus a
tensor transform where the layouts differ). ``official`` and ``ours`` are key prefixes, ``""`` or
ending in ``"."`` (``"level3.0."``), so a network-level converter composes the layer maps under its
own prefixes. ``*_from_official(state_dict, config)`` builds one op from the
official constructor arguments (``config``, the official argument names) and loads the converted
weights; :func:`from_official` dispatches on ``config["layer"]``, the official class path.

Layout differences:

- DiCE: the official layer applies BN + PReLU to the concatenation [channel, height, width] and
  shuffles afterwards; our DimConv interleaves first, so those 3C parameters are permuted
  (ours[3c + b] = official[b C + c]) unless ``shuffle`` is off.
- DiCE ``dilation`` is (channel, width, height) in the official constructor (the order of its
  ``conv_channel``, ``conv_width``, ``conv_height``) and (channel, height, width) here. Every
  released model uses (1, 1, 1), so this order is not exercised by the fixtures.
- ESPNetv2 names CBR parts ``conv``/``bn``/``act``; DiCENet uses ``cbr.0/1/2``.

Full networks (:func:`official_key_map`, :func:`load_official_weights`): DiCENet and ESPNetv2
ImageNet classifiers and the EdgeNets segmentation networks (``base_net.`` encoder + EPP decoder).
The maps are built by walking our model (its widths and units), so they hold for every width.
ESPNetv2's ``level5_0.inp_reinf.*`` (an image shortcut the official model builds but never calls)
is dropped. This module imports no model: it recognises them by class name.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from src.utils.state_dicts import mismatch_summary, project_network_state, torch_load
from src.ops.dice import DiCE, DiCEShuffleUnit, StridedDiCE
from src.ops.eesp import EESP, EESPDownsampler

Transform = Callable[[Tensor], Tensor]
KeyMap = dict[str, tuple[str, Transform | None]]

BN_KEYS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _weight(official: str, ours: str) -> KeyMap:
    return {f"{official}weight": (f"{ours}weight", None)}


def _prelu(official: str, ours: str, transform: Transform | None = None) -> KeyMap:
    return {f"{official}weight": (f"{ours}weight", transform)}


def _bn(official: str, ours: str, transform: Transform | None = None) -> KeyMap:
    return {
        f"{official}{key}": (f"{ours}{key}", None if key == "num_batches_tracked" else transform)
        for key in BN_KEYS
    }


def _cbr(official: str, ours: str, *, names: tuple[str, ...], first: int = 0) -> KeyMap:
    """conv (+ BN (+ PReLU)) ``official<names[i]>`` -> ``ours<first + i>`` (nn.Sequential)."""
    parts = (_weight, _bn, _prelu)[: len(names)]
    key_map: KeyMap = {}
    for i, (part, name) in enumerate(zip(parts, names)):
        key_map |= part(f"{official}{name}.", f"{ours}{first + i}.")
    return key_map


def _dicenet_cbr(official: str, ours: str, first: int = 0) -> KeyMap:
    return _cbr(f"{official}cbr.", ours, names=("0", "1", "2"), first=first)


def _espnet_cbr(official: str, ours: str, first: int = 0) -> KeyMap:
    return _cbr(official, ours, names=("conv", "bn", "act"), first=first)


def _espnet_cb(official: str, ours: str, first: int = 0) -> KeyMap:
    return _cbr(official, ours, names=("conv", "bn"), first=first)


def concat_to_interleaved(channels: int) -> Transform:
    """Reorder per-channel parameters from [branch][channel] to [channel][branch] order."""

    def transform(t: Tensor) -> Tensor:
        return t.unflatten(0, (3, channels)).transpose(0, 1).flatten()  # (3C,) -> (3, C) -> (C, 3)

    return transform


def dice_key_map(official: str, ours: str, *, channels: int, shuffle: bool) -> KeyMap:
    """Official ``DICE`` at ``official`` -> :class:`DiCE` at ``ours``."""
    order = concat_to_interleaved(channels) if shuffle else None
    return (
        {
            f"{official}conv_channel.weight": (f"{ours}dim_conv.weight_channel", None),
            f"{official}conv_height.weight": (f"{ours}dim_conv.weight_height", None),
            f"{official}conv_width.weight": (f"{ours}dim_conv.weight_width", None),
        }
        | _bn(f"{official}br_act.br.0.", f"{ours}dim_fuse.norm.", order)
        | _prelu(f"{official}br_act.br.1.", f"{ours}dim_fuse.act.", order)
        | _dicenet_cbr(f"{official}weight_avg_layer.", f"{ours}dim_fuse.local.")
        | _dicenet_cbr(f"{official}proj_layer.", f"{ours}dim_fuse.spatial.")
        | _weight(f"{official}linear_comb_layer.1.", f"{ours}dim_fuse.gate.1.")
        | _weight(f"{official}linear_comb_layer.3.", f"{ours}dim_fuse.gate.3.")
    )


def strided_dice_key_map(official: str, ours: str, *, channels: int, shuffle: bool) -> KeyMap:
    """Official ``StridedDICE`` -> :class:`StridedDiCE`."""
    return (
        _dicenet_cbr(f"{official}left_layer.0.", f"{ours}left.")
        | _dicenet_cbr(f"{official}left_layer.1.", f"{ours}left.", first=3)
        | dice_key_map(
            f"{official}right_layer.1.", f"{ours}dice.", channels=channels, shuffle=shuffle
        )
        | _dicenet_cbr(f"{official}right_layer.2.", f"{ours}right.")
    )


def dice_shuffle_unit_key_map(official: str, ours: str, *, dice_channels: int) -> KeyMap:
    """Official ``ShuffleDICEBlock`` -> :class:`DiCEShuffleUnit`."""
    return _dicenet_cbr(f"{official}layer_right.0.", f"{ours}reduce.") | dice_key_map(
        f"{official}layer_right.1.", f"{ours}dice.", channels=dice_channels, shuffle=True
    )


def eesp_key_map(official: str, ours: str, *, branches: int) -> KeyMap:
    """Official ``EESP`` -> :class:`EESP`."""
    key_map = _espnet_cbr(f"{official}proj_1x1.", f"{ours}reduce.")
    for i in range(branches):
        key_map |= _weight(f"{official}spp_dw.{i}.conv.", f"{ours}transform.{i}.")
    return (
        key_map
        | _bn(f"{official}br_after_cat.bn.", f"{ours}fuse_norm.")
        | _prelu(f"{official}br_after_cat.act.", f"{ours}fuse_act.")
        | _espnet_cb(f"{official}conv_1x1_exp.", f"{ours}merge.")
        | _prelu(f"{official}module_act.", f"{ours}act.")
    )


def eesp_downsampler_key_map(
    official: str, ours: str, *, branches: int, image_shortcut: bool
) -> KeyMap:
    """Official ``DownSampler`` -> :class:`EESPDownsampler`."""
    key_map = eesp_key_map(f"{official}eesp.", f"{ours}eesp.", branches=branches)
    if image_shortcut:
        key_map |= _espnet_cbr(f"{official}inp_reinf.0.", f"{ours}image_shortcut.")
        key_map |= _espnet_cb(f"{official}inp_reinf.1.", f"{ours}image_shortcut.", first=3)
    return key_map | _prelu(f"{official}act.", f"{ours}act.")


def convert(
    state_dict: Mapping[str, Tensor], key_map: KeyMap, *, ignored: Collection[str] = ()
) -> dict[str, Tensor]:
    """Rename (and transform) every official tensor; KeyError listing any key either side lacks.

    ``ignored`` official keys are dropped when present (parameters the official model builds but
    never uses)."""
    missing = [key for key in key_map if key not in state_dict]
    unexpected = [key for key in state_dict if key not in key_map and key not in ignored]
    if missing or unexpected:
        raise KeyError(
            f"official state dict does not match: missing {missing}, unexpected {unexpected}"
        )
    return {
        ours: state_dict[official] if transform is None else transform(state_dict[official])
        for official, (ours, transform) in key_map.items()
    }


def _br(official: str, ours: str) -> KeyMap:
    """Official ``BR`` (``official`` ends in ``br.``) or ``nn.Sequential(BN, PReLU)``."""
    return _bn(f"{official}0.", f"{ours}0.") | _prelu(f"{official}1.", f"{ours}1.")


def _linear(official: str, ours: str) -> KeyMap:
    return {f"{official}{key}": (f"{ours}{key}", None) for key in ("weight", "bias")}


def dicenet_backbone_key_map(backbone: nn.Module, official: str, ours: str) -> KeyMap:
    """Official DiCENet levels 1, 3, 4 (and 5) -> ``DiCENetBackbone`` (any width and depth)."""
    key_map = _dicenet_cbr(f"{official}level1.", f"{ours}level1.")
    for level in (3, 4, 5):
        stage = getattr(backbone, f"level{level}")
        if stage is None:
            continue
        for i, unit in enumerate(stage):
            src, dst = f"{official}level{level}.{i}.", f"{ours}level{level}.{i}."
            known = isinstance(unit, (StridedDiCE, DiCEShuffleUnit))
            if not known or not isinstance(unit.dice, DiCE):
                raise ValueError(
                    f"{dst.rstrip('.')} is a DiCE-unit ablation ({type(unit.dice).__name__}); "
                    "official weights exist only for the DiCE unit"
                )
            if isinstance(unit, StridedDiCE):
                key_map |= strided_dice_key_map(src, dst, channels=unit.in_channels, shuffle=True)
            else:
                if not isinstance(unit.reduce, nn.Sequential):
                    raise ValueError(f"{dst}reduce is an ablation; official weights cannot load")
                dice_channels = unit.out_channels - unit.passed
                key_map |= dice_shuffle_unit_key_map(src, dst, dice_channels=dice_channels)
    return key_map


def _check_plain_eesp(module: nn.Module, name: str) -> None:
    if type(module) is not EESP:
        raise ValueError(f"{name} is an EESP ablation; official weights exist only for the EESP")


def espnetv2_backbone_key_map(
    backbone: nn.Module, official: str, ours: str
) -> tuple[KeyMap, list[str]]:
    """Official ESPNetv2 levels -> ``ESPNetv2Backbone``; also the official keys to drop.

    The official level-5 down-sampler's image shortcut (``level5_0.inp_reinf``) never runs and
    is not built here: its keys are returned as ignored."""
    key_map = _espnet_cbr(f"{official}level1.", f"{ours}level1.")
    ignored: list[str] = []
    for level in (2, 3, 4, 5):
        down = getattr(backbone, f"level{level}_0")
        if down is None:
            continue
        src, dst = f"{official}level{level}_0.", f"{ours}level{level}_0."
        _check_plain_eesp(down.eesp, f"{dst}eesp")
        has_shortcut = down.image_shortcut is not None
        key_map |= eesp_downsampler_key_map(
            src, dst, branches=len(down.eesp.transform), image_shortcut=has_shortcut
        )
        if level == 5:
            shortcut = _espnet_cbr(f"{src}inp_reinf.0.", "") | _espnet_cb(f"{src}inp_reinf.1.", "")
            ignored += list(shortcut)
        if level == 2:
            continue
        for i, unit in enumerate(getattr(backbone, f"level{level}")):
            _check_plain_eesp(unit, f"{ours}level{level}.{i}")
            key_map |= eesp_key_map(
                f"{official}level{level}.{i}.",
                f"{ours}level{level}.{i}.",
                branches=len(unit.transform),
            )
    return key_map, ignored


def dicenet_key_map(model: nn.Module) -> tuple[KeyMap, list[str]]:
    """Official ``model.classification.dicenet.CNNModel`` -> :class:`src.models.dicenet.DiCENet`."""
    key_map = dicenet_backbone_key_map(model.backbone, "", "backbone.")
    key_map |= _weight("classifier.0.", "fc_group.") | _linear("classifier.2.", "fc.")
    return key_map, []


def espnetv2_key_map(model: nn.Module) -> tuple[KeyMap, list[str]]:
    """Official ``model.classification.espnetv2.EESPNet`` -> ``src.models.espnetv2.ESPNetv2``."""
    key_map, ignored = espnetv2_backbone_key_map(model.backbone, "", "backbone.")
    units = len(model.backbone.level5)
    key_map |= _espnet_cbr(f"level5.{units}.", "head_conv.")
    key_map |= _espnet_cbr(f"level5.{units + 1}.", "head_conv.", first=3)
    return key_map | _linear("classifier.", "classifier."), ignored


# official decoder module names, coarsest first: (EPP x 4, skip projections x 3, skip BR x 3)
DECODER_NAMES = {
    "DiCENetBackbone": (
        ("eff_pool_16x16", "eff_pool_32x32", "eff_pool_64x64", "eff_pool_128x128"),
        ("proj_enc_32x32", "proj_enc_64x64", "proj_enc_128x128"),
        ("bu_br_32x32", "bu_br_64x64", "bu_br_128x128"),
    ),
    "ESPNetv2Backbone": (
        ("bu_dec_l1", "bu_dec_l2", "bu_dec_l3", "bu_dec_l4"),
        ("merge_enc_dec_l2", "merge_enc_dec_l3", "merge_enc_dec_l4"),
        ("bu_br_l2", "bu_br_l3", "bu_br_l4"),
    ),
}


def epp_key_map(official: str, ours: str, *, last: bool) -> KeyMap:
    """Official ``EfficientPyrPool`` -> :class:`src.models.segmentation.EfficientPyramidPooling`."""
    key_map = _dicenet_cbr(f"{official}projection_layer.", f"{ours}project.")
    for i in range(5):
        key_map |= _weight(f"{official}stages.{i}.", f"{ours}stages.{i}.")
    key_map |= _br(f"{official}merge_layer.0.br.", f"{ours}merge_norm.")
    key_map |= _dicenet_cbr(f"{official}merge_layer.2.", f"{ours}merge.")
    if last:
        return key_map | _linear(f"{official}merge_layer.3.", f"{ours}expand.")
    return (
        key_map
        | _weight(f"{official}merge_layer.3.", f"{ours}expand.")
        | _br(f"{official}br.br.", f"{ours}out_norm.")
    )


def segmentation_key_map(model: nn.Module) -> tuple[KeyMap, list[str]]:
    """Official ``DiCENetSegmentation``/``ESPNetv2Segmentation`` -> ``EdgeNetsSegmentation``."""
    family = type(model.backbone).__name__
    if family == "DiCENetBackbone":
        key_map, ignored = dicenet_backbone_key_map(model.backbone, "base_net.", "backbone."), []
    elif family == "ESPNetv2Backbone":
        key_map, ignored = espnetv2_backbone_key_map(model.backbone, "base_net.", "backbone.")
    else:
        raise ValueError(f"no official EdgeNets segmentation weights for a {family} encoder")
    epp, skip, skip_norm = DECODER_NAMES[family]
    for i, name in enumerate(epp):
        key_map |= epp_key_map(f"{name}.", f"decoder.epp.{i}.", last=i == 3)
    for i, (proj, norm) in enumerate(zip(skip, skip_norm)):
        key_map |= _weight(f"{proj}.wt_layer.1.", f"decoder.skip.{i}.gate.1.")
        key_map |= _dicenet_cbr(f"{proj}.expansion_layer.", f"decoder.skip.{i}.expand.")
        key_map |= _br(f"{norm}.", f"decoder.skip_norm.{i}.")
    return key_map, ignored


NETWORKS: Mapping[str, Callable[[nn.Module], tuple[KeyMap, list[str]]]] = {
    "DiCENet": dicenet_key_map,
    "ESPNetv2": espnetv2_key_map,
    "EdgeNetsSegmentation": segmentation_key_map,
}


def official_key_map(model: nn.Module) -> tuple[KeyMap, list[str]]:
    """The official -> ours key map of a whole network, and the official keys it drops."""
    name = type(model).__name__
    if name not in NETWORKS:
        raise ValueError(f"no official EdgeNets key map for {name}; known: {sorted(NETWORKS)}")
    return NETWORKS[name](model)


def load_official_state_dict(path: str | Path) -> dict[str, Tensor]:
    """An official EdgeNets ``.pth`` (legacy pickle, CUDA tensors) as CPU tensors, ``module.``
    (DataParallel) prefixes removed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"official EdgeNets weights {path} do not exist")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping):
        raise TypeError(f"{path} holds a {type(state).__name__}, not a state dict")
    return {key.removeprefix("module."): value for key, value in state.items()}


def load_official_weights(model: nn.Module, weights: str | Path | Mapping[str, Tensor]) -> None:
    """Load official EdgeNets weights (a ``.pth`` path or a state dict) into ``model`` in place.
    A path to a Lightning checkpoint of this project loads its network's weights instead.

    Raises ``KeyError`` listing the official keys the map expects but the file lacks, the
    file's keys the map does not know, and shape mismatches (e.g. another width or class count).
    """
    if isinstance(weights, (str, Path)):
        path = Path(weights)
        loaded = torch_load(path, "pretrained")
        own = project_network_state(loaded)
        if own is not None:  # a Lightning checkpoint of this project: our key names already
            problems = mismatch_summary(model.state_dict(), own)
            if problems:
                raise KeyError(f"{path} does not fit {type(model).__name__}: {problems}")
            model.load_state_dict(own)
            return
        if not isinstance(loaded, Mapping):
            raise TypeError(f"{path} holds a {type(loaded).__name__}, not a state dict")
        weights = {key.removeprefix("module."): value for key, value in loaded.items()}
    state = weights
    key_map, ignored = official_key_map(model)
    converted = convert(state, key_map, ignored=ignored)
    expected = model.state_dict()
    mismatched = [
        f"{official} -> {key_map[official][0]}: file {tuple(state[official].shape)} vs model "
        f"{tuple(expected[ours].shape)}"
        for official, (ours, _) in key_map.items()
        if ours in expected and converted[ours].shape != expected[ours].shape
    ]
    if mismatched:
        raise KeyError(f"official weights do not fit {type(model).__name__}: {mismatched}")
    model.load_state_dict(converted, strict=True)


def _load(module: nn.Module, state_dict: Mapping[str, Tensor], key_map: KeyMap) -> nn.Module:
    # strict: our side must be covered exactly too (shape mismatches raise as well)
    module.load_state_dict(convert(state_dict, key_map), strict=True)
    return module


def _dice_dilation(config: Mapping) -> tuple[int, int, int]:
    d_channel, d_width, d_height = config.get("dilation", (1, 1, 1))  # official order
    return (d_channel, d_height, d_width)


def dice_from_official(state_dict: Mapping[str, Tensor], config: Mapping) -> DiCE:
    """Official ``nn_layers.dice.DICE``: channel_in, channel_out, height, width, kernel_size,
    dilation, shuffle."""
    channels, shuffle = config["channel_in"], config.get("shuffle", True)
    module = DiCE(
        channels,
        config["channel_out"],
        config["height"],
        config["width"],
        kernel_size=config.get("kernel_size", 3),
        dilation=_dice_dilation(config),
        shuffle=shuffle,
    )
    return _load(module, state_dict, dice_key_map("", "", channels=channels, shuffle=shuffle))


def strided_dice_from_official(state_dict: Mapping[str, Tensor], config: Mapping) -> StridedDiCE:
    """``nn_layers.dice.StridedDICE(channel_in, height, width, kernel_size, dilation, shuffle)``."""
    channels, shuffle = config["channel_in"], config.get("shuffle", True)
    module = StridedDiCE(
        channels,
        config["height"],
        config["width"],
        kernel_size=config.get("kernel_size", 3),
        dilation=_dice_dilation(config),
        shuffle=shuffle,
    )
    return _load(
        module, state_dict, strided_dice_key_map("", "", channels=channels, shuffle=shuffle)
    )


def dice_shuffle_unit_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping
) -> DiCEShuffleUnit:
    """Official ``model.classification.dicenet.ShuffleDICEBlock``: inplanes, outplanes, height,
    width, c_tag, groups."""
    module = DiCEShuffleUnit(
        config["inplanes"],
        config["outplanes"],
        config["height"],
        config["width"],
        split_ratio=config.get("c_tag", 0.5),
        groups=config.get("groups", 2),
    )
    dice_channels = module.out_channels - module.passed
    return _load(module, state_dict, dice_shuffle_unit_key_map("", "", dice_channels=dice_channels))


def eesp_from_official(state_dict: Mapping[str, Tensor], config: Mapping) -> EESP:
    """``nn_layers.eesp.EESP(nIn, nOut, stride, k, r_lim, down_method)``."""
    module = EESP(
        config["nIn"],
        config["nOut"],
        stride=config.get("stride", 1),
        branches=config["k"],
        r_lim=config["r_lim"],
        down_method=config.get("down_method", "esp"),
    )
    return _load(module, state_dict, eesp_key_map("", "", branches=len(module.transform)))


def eesp_downsampler_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping
) -> EESPDownsampler:
    """Official ``nn_layers.eesp.DownSampler``: nin, nout, k, r_lim, reinf; the image has
    ``config_inp_reinf`` channels."""
    reinf = config.get("reinf", True)
    module = EESPDownsampler(
        config["nin"],
        config["nout"],
        branches=config["k"],
        r_lim=config["r_lim"],
        image_channels=config.get("config_inp_reinf", 3) if reinf else None,
    )
    key_map = eesp_downsampler_key_map(
        "", "", branches=len(module.eesp.transform), image_shortcut=reinf
    )
    return _load(module, state_dict, key_map)


LAYERS: Mapping[str, Callable[[Mapping[str, Tensor], Mapping], nn.Module]] = {
    "nn_layers.dice.DICE": dice_from_official,
    "nn_layers.dice.StridedDICE": strided_dice_from_official,
    "model.classification.dicenet.ShuffleDICEBlock": dice_shuffle_unit_from_official,
    "nn_layers.eesp.EESP": eesp_from_official,
    "nn_layers.eesp.DownSampler": eesp_downsampler_from_official,
}


def from_official(state_dict: Mapping[str, Tensor], config: Mapping) -> nn.Module:
    """Build the op for the official class ``config["layer"]`` and load ``state_dict`` into it."""
    layer = config.get("layer")
    if layer not in LAYERS:
        raise ValueError(f"unknown official layer {layer!r}; known: {sorted(LAYERS)}")
    return LAYERS[layer](state_dict, config)
