"""Official EdgeNets (DiCENet, ESPNetv2) state dicts -> this project's ops and networks.

:func:`from_official` builds the module an official class and its constructor arguments describe
and fills it; :func:`load_official` fills a module of ours in place: the ops (DiCE, strided DiCE,
the DiCENet unit, EESP, the ESPNetv2 down-sampler), the DiCENet and ESPNetv2 ImageNet classifiers,
the EdgeNets segmentation networks (``base_net.`` encoder + EPP decoder) and an SSD's backbone
(from an ImageNet classifier's weights, the official detection recipe's start).

Each ``*_key_map(official, ours, ...)`` returns an explicit map from official keys to ours (plus a
tensor transform where the layouts differ). ``official`` and ``ours`` are key prefixes, ``""`` or
ending in ``"."`` (``"level3.0."``), so a network-level map composes the layer maps under its own
prefixes. The network maps are built by walking our network (its widths and units), so they hold
for every width.

Layout differences:

- DiCE: the official layer applies BN + PReLU to the concatenation [channel, height, width] and
  shuffles afterwards; our DimConv interleaves first, so those 3C parameters are permuted
  (ours[3c + b] = official[b C + c]) unless ``shuffle`` is off.
- DiCE ``dilation`` is (channel, width, height) in the official constructor (the order of its
  ``conv_channel``, ``conv_width``, ``conv_height``) and (channel, height, width) here. Every
  released model uses (1, 1, 1), so this order is not exercised by the fixtures.
- ESPNetv2 names CBR parts ``conv``/``bn``/``act``; DiCENet uses ``cbr.0/1/2``.
- ESPNetv2's ``level5_0.inp_reinf.*`` (an image shortcut the official model builds but never
  calls) is not built here and is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from torch import Tensor, nn

from src.compat.common import (
    OfficialWeightsError,
    Weights,
    check_keys,
    fill,
    load_with,
    unsupported,
)
from src.models.dicenet import DiCENet, DiCENetBackbone
from src.models.espnetv2 import ESPNetv2, ESPNetv2Backbone
from src.models.segmentation import (
    EdgeNetsSegmentation,
    dicenet_segmentation,
    espnetv2_segmentation,
)
from src.models.ssd import SSD
from src.ops.dice import DiCE, DiCEShuffleUnit, StridedDiCE
from src.ops.eesp import EESP, EESPDownsampler
from src.utils.state_dicts import mismatch_summary

FAMILY = "EdgeNets"

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
        if t.shape != (3 * channels,):
            raise OfficialWeightsError(f"file {tuple(t.shape)} vs ({3 * channels},)")
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
    """Rename (and transform) every official tensor; :class:`OfficialWeightsError` naming any key
    either side lacks.

    ``ignored`` official keys are dropped when present (parameters the official model builds but
    never uses)."""
    check_keys({k: v for k, v in state_dict.items() if k not in ignored}, key_map)
    converted = {}
    for official, (ours, transform) in key_map.items():
        try:
            converted[ours] = (
                state_dict[official] if transform is None else transform(state_dict[official])
            )
        except OfficialWeightsError as error:
            raise OfficialWeightsError(
                f"{official} does not fit {ours} (another width?): {error}"
            ) from None
    return converted


def _br(official: str, ours: str) -> KeyMap:
    """Official ``BR`` (``official`` ends in ``br.``) or ``nn.Sequential(BN, PReLU)``."""
    return _bn(f"{official}0.", f"{ours}0.") | _prelu(f"{official}1.", f"{ours}1.")


def _linear(official: str, ours: str) -> KeyMap:
    return {f"{official}{key}": (f"{ours}{key}", None) for key in ("weight", "bias")}


def dicenet_backbone_key_map(backbone: DiCENetBackbone, official: str, ours: str) -> KeyMap:
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
                raise OfficialWeightsError(
                    f"{dst.rstrip('.')} is a DiCE-unit ablation ({type(unit.dice).__name__}); "
                    "official weights exist only for the DiCE unit"
                )
            if isinstance(unit, StridedDiCE):
                key_map |= strided_dice_key_map(src, dst, channels=unit.in_channels, shuffle=True)
            else:
                if not isinstance(unit.reduce, nn.Sequential):
                    raise OfficialWeightsError(
                        f"{dst}reduce is an ablation; official weights exist only for the DiCE unit"
                    )
                dice_channels = unit.out_channels - unit.passed
                key_map |= dice_shuffle_unit_key_map(src, dst, dice_channels=dice_channels)
    return key_map


def _check_plain_eesp(module: nn.Module, name: str) -> None:
    if type(module) is not EESP:
        raise OfficialWeightsError(
            f"{name} is an EESP ablation; official weights exist only for the EESP"
        )


def espnetv2_backbone_key_map(
    backbone: ESPNetv2Backbone, official: str, ours: str
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


def dicenet_key_map(model: DiCENet) -> tuple[KeyMap, list[str]]:
    """Official ``model.classification.dicenet.CNNModel`` -> :class:`DiCENet`."""
    key_map = dicenet_backbone_key_map(model.backbone, "", "backbone.")
    key_map |= _weight("classifier.0.", "fc_group.") | _linear("classifier.2.", "fc.")
    return key_map, []


def espnetv2_key_map(model: ESPNetv2) -> tuple[KeyMap, list[str]]:
    """Official ``model.classification.espnetv2.EESPNet`` -> :class:`ESPNetv2`."""
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
    """Official ``EfficientPyrPool`` -> :class:`EfficientPyramidPooling`."""
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


def segmentation_key_map(model: EdgeNetsSegmentation) -> tuple[KeyMap, list[str]]:
    """Official ``DiCENetSegmentation``/``ESPNetv2Segmentation`` ->
    :class:`EdgeNetsSegmentation`."""
    backbone = model.backbone
    if isinstance(backbone, DiCENetBackbone):
        key_map, ignored = dicenet_backbone_key_map(backbone, "base_net.", "backbone."), []
    elif isinstance(backbone, ESPNetv2Backbone):
        key_map, ignored = espnetv2_backbone_key_map(backbone, "base_net.", "backbone.")
    else:
        raise OfficialWeightsError(
            f"no official EdgeNets segmentation weights for a {type(backbone).__name__} encoder"
        )
    epp, skip, skip_norm = DECODER_NAMES[type(backbone).__name__]
    for i, name in enumerate(epp):
        key_map |= epp_key_map(f"{name}.", f"decoder.epp.{i}.", last=i == 3)
    for i, (proj, norm) in enumerate(zip(skip, skip_norm)):
        key_map |= _weight(f"{proj}.wt_layer.1.", f"decoder.skip.{i}.gate.1.")
        key_map |= _dicenet_cbr(f"{proj}.expansion_layer.", f"decoder.skip.{i}.expand.")
        key_map |= _br(f"{norm}.", f"decoder.skip_norm.{i}.")
    return key_map, ignored


def layer_key_map(module: nn.Module) -> KeyMap:
    """The official -> ours key map of one op, read from the op itself."""
    if isinstance(module, DiCE):
        conv = module.dim_conv
        return dice_key_map("", "", channels=conv.channels, shuffle=conv.interleave)
    if isinstance(module, StridedDiCE):
        conv = module.dice.dim_conv
        return strided_dice_key_map("", "", channels=conv.channels, shuffle=conv.interleave)
    if isinstance(module, DiCEShuffleUnit):
        dice_channels = module.out_channels - module.passed
        return dice_shuffle_unit_key_map("", "", dice_channels=dice_channels)
    if isinstance(module, EESP):
        return eesp_key_map("", "", branches=len(module.transform))
    if isinstance(module, EESPDownsampler):
        return eesp_downsampler_key_map(
            "",
            "",
            branches=len(module.eesp.transform),
            image_shortcut=module.image_shortcut is not None,
        )
    raise unsupported(module, FAMILY, NETWORKS)


def official_key_map(model: nn.Module) -> tuple[KeyMap, list[str]]:
    """The official -> ours key map of a network or op, and the official keys it drops."""
    if isinstance(model, DiCENet):
        return dicenet_key_map(model)
    if isinstance(model, ESPNetv2):
        return espnetv2_key_map(model)
    if isinstance(model, EdgeNetsSegmentation):
        return segmentation_key_map(model)
    return layer_key_map(model), []


# the ImageNet classifier whose backbone an SSD shares, by ``SSD.backbone_name``; and the key of
# its official classifier weight (num_classes rows)
CLASSIFIERS: Mapping[str, tuple[type[DiCENet | ESPNetv2], str]] = {
    "espnetv2": (ESPNetv2, "classifier.weight"),
    "dicenet": (DiCENet, "classifier.2.weight"),
}
SSD_BACKBONE_PREFIXES = ("backbone.", "head_conv.")


def _fill_ssd(ssd: SSD, state: Mapping[str, Tensor]) -> None:
    """An ImageNet classifier's weights over the SSD's ``backbone.*`` and ``head_conv.*``.

    ``state``: an official EdgeNets classification state dict of the same backbone and scale, or
    a classifier (any number of classes) or detector of this project (its names already ours).
    The names ``backbone.*`` and ``head_conv.*`` are the classification ESPNetv2's (DiCENet's
    classifier has no ``head_conv``: its grouped FC is not a convolution, so that stays as
    initialised unless the weights are a detector's).
    """
    if not any(key.startswith(SSD_BACKBONE_PREFIXES) for key in state):  # official names
        classifier_type, classifier_key = CLASSIFIERS[ssd.backbone_name]
        classes = state[classifier_key].shape[0] if classifier_key in state else 1000
        classifier = classifier_type(ssd.scale, num_classes=classes)
        key_map, ignored = official_key_map(classifier)
        fill(classifier, convert(state, key_map, ignored=ignored))
        state = classifier.state_dict()
    found = {k: v for k, v in state.items() if k.startswith(SSD_BACKBONE_PREFIXES)}
    # the ESPNetv2 classifier has our head_conv; DiCENet's only where the weights are a detector's
    with_head = ssd.backbone_name == "espnetv2" or any(k.startswith("head_conv.") for k in found)
    expected = {
        k: v
        for k, v in ssd.state_dict().items()
        if k.startswith("backbone.") or (with_head and k.startswith("head_conv."))
    }
    problems = mismatch_summary(expected, found)
    if problems:
        raise OfficialWeightsError(
            f"does not fit the {ssd.backbone_name} s={ssd.scale} backbone: {problems}"
        )
    ssd.load_state_dict(found, strict=False)


def _fill(network: nn.Module, state: Mapping[str, Tensor]) -> None:
    if isinstance(network, SSD):
        _fill_ssd(network, state)
        return
    key_map, ignored = official_key_map(network)
    fill(network, convert(state, key_map, ignored=ignored))


NETWORKS: tuple[type[nn.Module], ...] = (
    DiCENet,
    ESPNetv2,
    EdgeNetsSegmentation,
    SSD,
    DiCE,
    StridedDiCE,
    DiCEShuffleUnit,
    EESP,
    EESPDownsampler,
)


def load_official(network: nn.Module, weights: Weights) -> None:
    """Fill ``network`` in place with official EdgeNets weights (a ``.pth`` path or a state dict;
    ``module.`` prefixes are dropped).

    ``network``: one of :data:`NETWORKS`. An SSD takes an ImageNet classifier's weights for its
    backbone (:func:`_fill_ssd`); every other module takes the weights of its official counterpart,
    strictly.

    Raises:
        OfficialWeightsError: official tensors missing or unexpected, shapes that differ (another
            width or class count), or an ablation of a unit official weights do not exist for.
        TypeError: ``network`` is none of :data:`NETWORKS`.
    """
    if not isinstance(network, NETWORKS):
        raise unsupported(network, FAMILY, NETWORKS)
    load_with(network, weights, FAMILY, _fill)


def _dice_dilation(config: Mapping[str, Any]) -> tuple[int, int, int]:
    d_channel, d_width, d_height = config.get("dilation", (1, 1, 1))  # official order
    return (d_channel, d_height, d_width)


def _input_size(config: Mapping[str, Any]) -> tuple[int, int]:
    """The official ``args.model_height`` x ``args.model_width`` (224 x 224 by default)."""
    return (config.get("model_height", 224), config.get("model_width", 224))


# the official segmentation decoder's base width by its ``dataset`` argument
DECODER_BASE_WIDTHS = {"pascal": 16, "city": 16, "coco": 32}


def _dice(config: Mapping[str, Any]) -> nn.Module:
    return DiCE(
        config["channel_in"],
        config["channel_out"],
        config["height"],
        config["width"],
        kernel_size=config.get("kernel_size", 3),
        dilation=_dice_dilation(config),
        shuffle=config.get("shuffle", True),
    )


def _strided_dice(config: Mapping[str, Any]) -> nn.Module:
    return StridedDiCE(
        config["channel_in"],
        config["height"],
        config["width"],
        kernel_size=config.get("kernel_size", 3),
        dilation=_dice_dilation(config),
        shuffle=config.get("shuffle", True),
    )


def _dice_shuffle_unit(config: Mapping[str, Any]) -> nn.Module:
    return DiCEShuffleUnit(
        config["inplanes"],
        config["outplanes"],
        config["height"],
        config["width"],
        split_ratio=config.get("c_tag", 0.5),
        groups=config.get("groups", 2),
    )


def _eesp(config: Mapping[str, Any]) -> nn.Module:
    return EESP(
        config["nIn"],
        config["nOut"],
        stride=config.get("stride", 1),
        branches=config["k"],
        r_lim=config["r_lim"],
        down_method=config.get("down_method", "esp"),
    )


def _eesp_downsampler(config: Mapping[str, Any]) -> nn.Module:
    reinf = config.get("reinf", True)
    return EESPDownsampler(
        config["nin"],
        config["nout"],
        branches=config["k"],
        r_lim=config["r_lim"],
        image_channels=config.get("config_inp_reinf", 3) if reinf else None,
    )


def _dicenet(config: Mapping[str, Any]) -> nn.Module:
    return DiCENet(
        config["s"],
        config["num_classes"],
        config.get("channels", 3),
        input_size=_input_size(config),
    )


def _espnetv2(config: Mapping[str, Any]) -> nn.Module:
    return ESPNetv2(config["s"], config["num_classes"], config.get("channels", 3))


def _decoder_base_width(config: Mapping[str, Any]) -> int:
    dataset = config.get("dataset", "pascal")
    if dataset not in DECODER_BASE_WIDTHS:
        raise ValueError(f"unknown dataset {dataset!r}; known: {sorted(DECODER_BASE_WIDTHS)}")
    return DECODER_BASE_WIDTHS[dataset]


def _dicenet_segmentation(config: Mapping[str, Any]) -> nn.Module:
    return dicenet_segmentation(
        config["s"],
        config["classes"],
        config.get("channels", 3),
        input_size=_input_size(config),
        base_width=_decoder_base_width(config),
    )


def _espnetv2_segmentation(config: Mapping[str, Any]) -> nn.Module:
    return espnetv2_segmentation(
        config["s"],
        config["classes"],
        config.get("channels", 3),
        base_width=_decoder_base_width(config),
    )


# official class path -> our module built from its constructor arguments (the official names:
# ``args.s``, ``args.channels``, ``args.model_width`` ... for the networks)
BUILDERS: Mapping[str, Callable[[Mapping[str, Any]], nn.Module]] = {
    "nn_layers.dice.DICE": _dice,
    "nn_layers.dice.StridedDICE": _strided_dice,
    "model.classification.dicenet.ShuffleDICEBlock": _dice_shuffle_unit,
    "nn_layers.eesp.EESP": _eesp,
    "nn_layers.eesp.DownSampler": _eesp_downsampler,
    "model.classification.dicenet.CNNModel": _dicenet,
    "model.classification.espnetv2.EESPNet": _espnetv2,
    "model.segmentation.dicenet.DiCENetSegmentation": _dicenet_segmentation,
    "model.segmentation.espnetv2.ESPNetv2Segmentation": _espnetv2_segmentation,
}


def from_official(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    """Build our module for the official class ``config["layer"]`` and fill it with ``state_dict``.

    Args:
        state_dict: the official module's tensors (``module.`` prefixes are dropped).
        config: ``layer``, the official class path (a key of :data:`BUILDERS`), and its
            constructor arguments under the official names: ``DICE``: channel_in, channel_out,
            height, width, kernel_size, dilation, shuffle; ``StridedDICE``: channel_in, height,
            width, kernel_size, dilation, shuffle; ``ShuffleDICEBlock``: inplanes, outplanes,
            height, width, c_tag, groups; ``EESP``: nIn, nOut, stride, k, r_lim, down_method;
            ``DownSampler``: nin, nout, k, r_lim, reinf (the image has ``config_inp_reinf``
            channels); ``CNNModel``: s, num_classes, channels, model_width, model_height;
            ``EESPNet``: s, num_classes, channels; ``DiCENetSegmentation``: s, classes, channels,
            model_width, model_height, dataset; ``ESPNetv2Segmentation``: s, classes, channels,
            dataset.
    """
    layer = config.get("layer")
    if layer not in BUILDERS:
        raise ValueError(f"unknown official layer {layer!r}; known: {sorted(BUILDERS)}")
    module = BUILDERS[layer](config)
    load_official(module, state_dict)
    return module
