"""Official DeLighT (sacmehta/delight) state dicts -> this project's GLT, DExTra and block modules.

:func:`from_official` builds the layer an official config describes and fills it;
:func:`load_official` fills a :class:`GroupLinear`, :class:`DExTra` or DeLighT encoder or decoder
block of ours in place, and a whole :class:`DeLighTEncoderDecoder` or
:class:`DeLighTLanguageModel` from a fairseq DeLighT checkpoint (``{"args": ..., "model":
state_dict}``; the state dict alone works too).

Official names and layouts (README of the reference fixtures, "Parameter names and layouts"):

- ``GroupLinear``: ``weights`` (g, in/g, out/g) used as ``x_i @ W_i``, ``bias`` (g, 1, out/g);
  optional ``normalization_fn.weight/bias`` (out/g,) shared by the g chunks.
- ``Linear`` (the dense layer; also every 1-group GLT inside DExTra): ``weights`` (out, in),
  ``bias`` (out,); optional ``normalization_fn.weight/bias`` (out,).
- ``DExTraUnit``: ``input_layer.*``, ``dextra_layers.<l>.*``, ``output_layer.*``.
- ``DeLighTTransformerEncoderLayer`` / ``DecoderLayer``: the DExTra unit (``dextra_layer.*``,
  decoder ``dextra_layer_sa.*``), ``self_attn.linear_kqv`` (split q, k, v despite the name),
  ``self_attn.out_proj``, ``encoder_attn.linear_q`` / ``linear_kv`` / ``out_proj``, ``fc1``,
  ``fc2`` (all Linear) and the LayerNorms ``self_attn_layer_norm``, ``encoder_attn_layer_norm``,
  ``final_layer_norm``.

- The translation model (``delight_transformer``): per side ``encoder.`` / ``decoder.``,
  ``embed_tokens.map_layer.weight`` (the 128-wide table), ``embed_tokens.dextra_layer.*`` (the
  embedding ``DExTraUnit``), ``layers.<b>.*`` (the layers above) and the buffers ``version`` and
  ``embed_positions._float_tensor`` (dropped: the sinusoids are recomputed); the decoder adds
  ``project_out_dim.weights`` (Linear d_model -> 128, no bias; absent when d_model = 128) and,
  without ``share_decoder_input_output_embed``, ``embed_out.weights`` (Linear 128 -> V). Pre-norm
  models (``encoder.layer_norm``, ``decoder.layer_norm``) and adaptive input/softmax are not built
  by :class:`DeLighTEncoderDecoder` and are refused.
- The language model (``delight_transformer_lm``): the decoder's names alone, its layers without
  encoder attention; the table is ``decoder.embed_tokens.map_layer.weight`` or, with adaptive
  input, ``map_layer.embeddings.<i>.weight`` and ``map_layer.projections.<i>.weight``. The adaptive
  softmax (``decoder.adaptive_softmax.*``) holds only ``head.class_proj.weight`` of its own: its
  ``head.word_proj`` and ``tail.<i>.{0,2}`` weights are the adaptive input's (tied; checked equal,
  then dropped), its ``version`` and ``_float_tensor`` buffers are dropped.

Sizes come from the official config dict (or the module being filled) and the tensors; nothing
here knows a particular model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from src.compat.common import OfficialWeightsError, Weights, fill, load_with, unsupported
from src.models.delight_block import DeLighTDecoderBlock, DeLighTEncoderBlock
from src.models.delight_lm import DeLighTLanguageModel
from src.models.delight_mt import DeLighTEncoderDecoder
from src.ops.dextra import DExTra
from src.ops.group_linear import GroupLinear
from src.ops.shared_group_layer_norm import SharedGroupLayerNorm

FAMILY = "DeLighT"

ACTIVATIONS = {"swish": nn.SiLU, "relu": nn.ReLU, "gelu": nn.GELU}


def _glt_params(state_dict: Mapping[str, Tensor], prefix: str, groups: int) -> dict[str, Tensor]:
    """An official GroupLinear or Linear's weight and bias in :class:`GroupLinear`'s layout."""
    if f"{prefix}weights" not in state_dict:
        raise OfficialWeightsError(f"official tensor {prefix}weights missing from the state dict")
    weight = state_dict[f"{prefix}weights"]
    params = {}
    if weight.dim() == 2:
        if groups != 1:
            raise OfficialWeightsError(
                f"{prefix}weights is a dense (out, in) matrix {tuple(weight.shape)} "
                f"but groups={groups}"
            )
        # Linear: (out, in) -> (1, in, out)
        params["weight"] = weight.t().unsqueeze(0)
    else:
        params["weight"] = weight  # (g, in/g, out/g)
    if f"{prefix}bias" in state_dict:
        g, _, n = params["weight"].shape
        bias = state_dict[f"{prefix}bias"]
        if bias.numel() != g * n:
            raise OfficialWeightsError(
                f"{prefix}bias {tuple(bias.shape)} does not fit {prefix}weights "
                f"{tuple(weight.shape)}"
            )
        # (g, 1, out/g) or (out,) -> (g, out/g)
        params["bias"] = bias.reshape(g, n)
    return params


def _norm_params(state_dict: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    names = [f"{prefix}normalization_fn.{name}" for name in ("weight", "bias")]
    missing = [name for name in names if name not in state_dict]
    if missing:
        raise OfficialWeightsError(f"official tensors {missing} missing from the state dict")
    return {name.rsplit(".", 1)[-1]: state_dict[name] for name in names}


def _unmapped(state_dict: Mapping[str, Tensor], used: set[str], what: str) -> None:
    extra = sorted(set(state_dict) - used)
    if extra:
        raise OfficialWeightsError(f"official {what} tensors not mapped: {extra}")


def _fill_glt(glt: GroupLinear, state_dict: Mapping[str, Tensor]) -> None:
    _unmapped(state_dict, {"weights", "bias"}, "GroupLinear")
    fill(glt, _glt_params(state_dict, "", glt.groups))


def glt_from_official(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    """An official ``GroupLinear`` layer as this project's modules.

    Without a norm and activation in ``config`` the result is a :class:`GroupLinear`; otherwise an
    ``nn.Sequential`` of the GroupLinear, a :class:`SharedGroupLayerNorm` (``norm_type="ln"``) and
    the activation, in the official order. Dropout is not built (evaluation only).

    Args:
        state_dict: the layer's official tensors (``weights``, ``bias``, ``normalization_fn.*``).
        config: the official arguments: ``in_features``, ``out_features``, ``n_groups``,
            ``use_bias``, ``use_shuffle``, ``norm_type`` (None or "ln"), ``act_type`` (None or
            a name).
    """
    groups = int(config["n_groups"])
    glt = GroupLinear(
        int(config["in_features"]),
        int(config["out_features"]),
        groups,
        bias=bool(config["use_bias"]),
        shuffle=bool(config["use_shuffle"]),
    )
    norm_names = {"normalization_fn.weight", "normalization_fn.bias"}
    load_official(glt, {k: v for k, v in state_dict.items() if k not in norm_names})
    layers: list[nn.Module] = [glt]
    norm_type, act_type = config.get("norm_type"), config.get("act_type")
    if norm_type is not None:
        if norm_type != "ln":
            raise ValueError(
                f"unsupported norm_type {norm_type!r}; only 'ln' (per-group LayerNorm)"
            )
        norm = SharedGroupLayerNorm(glt.out_features, groups)
        fill(norm, _norm_params(state_dict, ""))
        layers.append(norm)
    if act_type is not None:
        if act_type not in ACTIVATIONS:
            raise ValueError(f"unsupported act_type {act_type!r}; known: {sorted(ACTIVATIONS)}")
        layers.append(ACTIVATIONS[act_type]())
    return glt if len(layers) == 1 else nn.Sequential(*layers)


def _official_names(unit: DExTra) -> set[str]:
    names = set()
    for prefix in ["input_layer.", "output_layer."] + [
        f"dextra_layers.{layer}." for layer in range(len(unit.glts))
    ]:
        names |= {
            f"{prefix}weights",
            f"{prefix}bias",
            f"{prefix}normalization_fn.weight",
            f"{prefix}normalization_fn.bias",
        }
    return names


def _dextra_params(unit: DExTra, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An official ``DExTraUnit``'s tensors in :class:`DExTra`'s names."""
    _unmapped(state_dict, _official_names(unit), "DExTra")
    params: dict[str, Tensor] = {}
    for ours, theirs in (("input", "input_layer."), ("output", "output_layer.")):
        for name in (f"{theirs}weights", f"{theirs}bias"):
            if name not in state_dict:
                raise OfficialWeightsError(f"official tensor {name} missing from the state dict")
        params[f"{ours}_layer.weight"] = state_dict[f"{theirs}weights"]  # (out, in), as nn.Linear
        params[f"{ours}_layer.bias"] = state_dict[f"{theirs}bias"]
        for name, tensor in _norm_params(state_dict, theirs).items():
            params[f"{ours}_norm.{name}"] = tensor
    for layer, groups in enumerate(unit.plan.groups):
        prefix = f"dextra_layers.{layer}."
        for name, tensor in _glt_params(state_dict, prefix, groups).items():
            params[f"glts.{layer}.{name}"] = tensor
        for name, tensor in _norm_params(state_dict, prefix).items():
            params[f"glt_norms.{layer}.{name}"] = tensor
    return params


def dextra_from_official(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> DExTra:
    """An official ``DExTraUnit`` as a :class:`DExTra` with the same weights.

    Args:
        state_dict: the unit's official tensors (``input_layer.*``, ``dextra_layers.<l>.*``,
            ``output_layer.*``).
        config: the official arguments: ``in_features``, ``in_proj_features``, ``out_features``,
            ``width_multiplier``, ``dextra_depth``, ``max_glt_groups``; ``act_type``,
            ``norm_type`` and ``glt_shuffle``, when given, must be the official defaults
            (swish, ln, True).
    """
    for key, official in (("act_type", "swish"), ("norm_type", "ln"), ("glt_shuffle", True)):
        if config.get(key, official) != official:
            raise ValueError(
                f"DExTra is built with {key}={official!r}, the config has {config[key]!r}"
            )
    unit = DExTra(
        int(config["in_features"]),
        int(config["in_proj_features"]),
        int(config["out_features"]),
        width_multiplier=float(config["width_multiplier"]),
        depth=int(config["dextra_depth"]),
        max_groups=int(config["max_glt_groups"]),
        dropout=float(config.get("dextra_dropout", 0.0)),
    )
    load_official(unit, state_dict)
    return unit


# official DeLighT layer names -> ours, outside the DExTra unit: (official, ours, is Linear)
_SELF_ATTENTION = (
    ("self_attn.linear_kqv.", "self_attn.qkv_proj.", True),
    ("self_attn.out_proj.", "self_attn.out_proj.", True),
    ("self_attn_layer_norm.", "self_attn_norm.", False),
)
_ENCODER_ATTENTION = (
    ("encoder_attn.linear_q.", "encoder_attn.q_proj.", True),
    ("encoder_attn.linear_kv.", "encoder_attn.kv_proj.", True),
    ("encoder_attn.out_proj.", "encoder_attn.out_proj.", True),
    ("encoder_attn_layer_norm.", "encoder_attn_norm.", False),
)
_FEED_FORWARD = (
    ("fc1.", "fc1.", True),
    ("fc2.", "fc2.", True),
    ("final_layer_norm.", "final_norm.", False),
)


def _block_arguments(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a DeLighT block from an official layer's config."""
    for key, official in (("act_type", "swish"), ("norm_type", "ln"), ("glt_shuffle", True)):
        if config.get(key, official) != official:
            raise ValueError(
                f"DeLighT blocks are built with {key}={official!r}, the config has {config[key]!r}"
            )
    d_model, reduction = int(config["embed_dim"]), int(config["ffn_red_factor"])
    if "light_ffn_dim" in config and int(config["light_ffn_dim"]) != d_model // reduction:
        raise ValueError(
            f"light_ffn_dim {config['light_ffn_dim']} is not embed_dim / ffn_red_factor "
            f"= {d_model} / {reduction}"
        )
    return {
        "d_model": d_model,
        "width_multiplier": float(config["width_multiplier"]),
        "depth": int(config["dextra_depth"]),
        "max_groups": int(config["max_glt_groups"]),
        "d_o": int(config["proj_dim(d_o)"]),
        "ffn_reduction": reduction,
        "normalize_before": bool(config["normalize_before"]),
    }


def _block_params(
    block: DeLighTEncoderBlock | DeLighTDecoderBlock, state_dict: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """An official layer's tensors in ``block``'s names; every official tensor must be consumed."""
    if isinstance(block, DeLighTDecoderBlock):
        dextra_prefix = "dextra_layer_sa."
        cross = _ENCODER_ATTENTION if block.cross_attention else ()
        names = _SELF_ATTENTION + cross + _FEED_FORWARD
    else:
        dextra_prefix, names = "dextra_layer.", _SELF_ATTENTION + _FEED_FORWARD
    dextra_state = {
        name[len(dextra_prefix) :]: tensor
        for name, tensor in state_dict.items()
        if name.startswith(dextra_prefix)
    }
    params = {
        f"dextra.{name}": tensor
        for name, tensor in _dextra_params(block.dextra, dextra_state).items()
    }
    used = {f"{dextra_prefix}{name}" for name in dextra_state}
    for theirs, ours, is_linear in names:
        # the official Linear's ``weights`` is (out, in), as nn.Linear's ``weight``
        for their_suffix, our_suffix in (
            ("weights" if is_linear else "weight", "weight"),
            ("bias", "bias"),
        ):
            name = f"{theirs}{their_suffix}"
            if name not in state_dict:
                raise OfficialWeightsError(f"official tensor {name} missing from the state dict")
            params[f"{ours}{our_suffix}"] = state_dict[name]
            used.add(name)
    _unmapped(state_dict, used, "DeLighT layer")
    return params


def encoder_layer_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> DeLighTEncoderBlock:
    """An official ``DeLighTTransformerEncoderLayer`` as a :class:`DeLighTEncoderBlock`.

    Args:
        state_dict: the layer's official tensors (``dextra_layer.*``, ``self_attn.*``,
            ``self_attn_layer_norm.*``, ``fc1.*``, ``fc2.*``, ``final_layer_norm.*``).
        config: the official arguments: ``embed_dim``, ``proj_dim(d_o)``, ``width_multiplier``,
            ``dextra_depth``, ``max_glt_groups``, ``ffn_red_factor``, ``normalize_before``;
            ``light_ffn_dim``, ``act_type``, ``norm_type`` and ``glt_shuffle`` are checked when
            given.
    """
    block = DeLighTEncoderBlock(**_block_arguments(config))
    load_official(block, state_dict)
    return block


def decoder_layer_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> DeLighTDecoderBlock:
    """An official ``DeLighTTransformerDecoderLayer`` as a :class:`DeLighTDecoderBlock`.

    Args:
        state_dict: the layer's official tensors (``dextra_layer_sa.*``, ``self_attn.*``,
            ``self_attn_layer_norm.*``, with encoder attention ``encoder_attn.*`` and
            ``encoder_attn_layer_norm.*``, then ``fc1.*``, ``fc2.*``, ``final_layer_norm.*``).
        config: as for :func:`encoder_layer_from_official`, plus ``no_encoder_attn``.
    """
    cross_attention = not bool(config.get("no_encoder_attn", False))
    block = DeLighTDecoderBlock(**_block_arguments(config), cross_attention=cross_attention)
    load_official(block, state_dict)
    return block


# fairseq buffers of a DeLighT translation model that hold no weights: the state-dict version and
# the sinusoidal embedding's device marker (the sinusoids are recomputed)
_MT_BUFFERS = ("version", "embed_positions._float_tensor", "embed_positions.weights")


def _under(state_dict: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The tensors named ``prefix...``, without the prefix."""
    return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}


def _mt_params(model: DeLighTEncoderDecoder, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A fairseq ``DeLighTTransformerModel`` state dict in ``model``'s names (module docstring)."""
    refused = [k for k in state_dict if k.split(".")[1:2] in (["layer_norm"], ["adaptive_softmax"])]
    if refused:
        raise OfficialWeightsError(
            f"official tensors {refused[:4]} belong to a pre-norm or adaptive-softmax model, which "
            "DeLighTEncoderDecoder does not build (post-norm, tied or plain output)"
        )
    params: dict[str, Tensor] = {}
    used = {f"{side}.{name}" for side in ("encoder", "decoder") for name in _MT_BUFFERS}
    sides = (
        ("encoder", model.encoder_embedding, model.encoder_blocks),
        ("decoder", model.decoder_embedding, model.decoder_blocks),
    )
    for side, embedding, blocks in sides:
        table = f"{side}.embed_tokens.map_layer.weight"
        if table not in state_dict:
            raise OfficialWeightsError(
                f"official tensor {table} missing: not a fairseq DeLighT translation state dict "
                f"(expected encoder.embed_tokens.*, encoder.layers.<b>.*, decoder.embed_tokens.*, "
                f"decoder.layers.<b>.*); keys start {sorted(state_dict)[:4]}"
            )
        params[f"{side}_embedding.lookup.weight"] = state_dict[table]
        used.add(table)
        dextra_prefix = f"{side}.embed_tokens.dextra_layer."
        dextra = _dextra_params(embedding.dextra, _under(state_dict, dextra_prefix))
        params |= {f"{side}_embedding.dextra.{k}": v for k, v in dextra.items()}
        used |= {k for k in state_dict if k.startswith(dextra_prefix)}
        for b, block in enumerate(blocks):
            prefix = f"{side}.layers.{b}."
            layer = _under(state_dict, prefix)
            if not layer:
                raise OfficialWeightsError(
                    f"official layer {prefix}* missing: the file has fewer {side} layers than the "
                    f"{len(blocks)} of this model"
                )
            try:
                converted = _block_params(block, layer)
            except OfficialWeightsError as error:
                raise OfficialWeightsError(f"{prefix.rstrip('.')}: {error}") from None
            params |= {f"{side}_blocks.{b}.{k}": v for k, v in converted.items()}
            used |= {f"{prefix}{k}" for k in layer}
    outputs = (
        ("decoder.project_out_dim.weights", "project_out.weight", model.project_out),
        ("decoder.embed_out.weights", "output.weight", model.output),
    )
    for theirs, ours, module in outputs:
        if module is not None:
            if theirs not in state_dict:
                raise OfficialWeightsError(f"official tensor {theirs} missing from the state dict")
            params[ours] = state_dict[theirs]
            used.add(theirs)
    _unmapped(state_dict, used, "DeLighT translation model")
    return params


def _tied(state_dict: Mapping[str, Tensor], name: str, ties: str) -> None:
    """Refuse a tensor that should be the one it is tied to but is not (an untied file)."""
    if name in state_dict and not (
        state_dict[name].shape == state_dict[ties].shape
        and bool((state_dict[name] == state_dict[ties]).all())
    ):
        raise OfficialWeightsError(
            f"official {name} is not {ties}: an untied adaptive softmax, which "
            "DeLighTLanguageModel does not build"
        )


def _lm_params(model: DeLighTLanguageModel, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A fairseq ``DeLighTTransformerLanguageModel`` state dict in ``model``'s names."""
    if "decoder.layer_norm.weight" in state_dict:
        raise OfficialWeightsError(
            "official decoder.layer_norm.* present: DeLighTLanguageModel has no final LayerNorm "
            "(the official no_decoder_final_norm)"
        )
    used = {
        "decoder.version",
        "decoder.embed_positions._float_tensor",
        "decoder.embed_positions.weights",
        "decoder.embed_tokens.map_layer._float_tensor",
        "decoder.adaptive_softmax.version",
        "decoder.adaptive_softmax.head._float_tensor",
    }
    params: dict[str, Tensor] = {}
    table = "decoder.embed_tokens.map_layer."
    for ours in model.embedding.lookup.state_dict():
        theirs = f"{table}{ours}"
        if ours == "class_proj.weight":
            theirs = "decoder.adaptive_softmax.head.class_proj.weight"
        if theirs not in state_dict:
            raise OfficialWeightsError(
                f"official tensor {theirs} missing: not a fairseq DeLighT language model state "
                f"dict of this table (expected {table}*, decoder.layers.<b>.*); keys start "
                f"{sorted(state_dict)[:4]}"
            )
        params[f"embedding.lookup.{ours}"] = state_dict[theirs]
        used.add(theirs)
    bands = sum(1 for k in params if k.startswith("embedding.lookup.embeddings."))
    head = "decoder.adaptive_softmax.head.word_proj.weight"
    _tied(state_dict, head, f"{table}embeddings.0.weight")
    used.add(head)
    for i in range(1, bands):
        for part, ties in ((0, "projections"), (2, "embeddings")):
            name = f"decoder.adaptive_softmax.tail.{i - 1}.{part}.weight"
            _tied(state_dict, name, f"{table}{ties}.{i}.weight")
            used.add(name)
    dextra_prefix = "decoder.embed_tokens.dextra_layer."
    dextra = _dextra_params(model.embedding.dextra, _under(state_dict, dextra_prefix))
    params |= {f"embedding.dextra.{k}": v for k, v in dextra.items()}
    used |= {k for k in state_dict if k.startswith(dextra_prefix)}
    for b, block in enumerate(model.blocks):
        prefix = f"decoder.layers.{b}."
        layer = _under(state_dict, prefix)
        if not layer:
            raise OfficialWeightsError(
                f"official layer {prefix}* missing: the file has fewer layers than the "
                f"{len(model.blocks)} of this model"
            )
        try:
            converted = _block_params(block, layer)
        except OfficialWeightsError as error:
            raise OfficialWeightsError(f"{prefix.rstrip('.')}: {error}") from None
        params |= {f"blocks.{b}.{k}": v for k, v in converted.items()}
        used |= {f"{prefix}{k}" for k in layer}
    if model.project_out is not None:
        name = "decoder.project_out_dim.weights"
        if name not in state_dict:
            raise OfficialWeightsError(f"official tensor {name} missing from the state dict")
        params["project_out.weight"] = state_dict[name]
        used.add(name)
    _unmapped(state_dict, used, "DeLighT language model")
    return params


def _fill(network: nn.Module, state_dict: Mapping[str, Tensor]) -> None:
    if isinstance(network, GroupLinear):
        _fill_glt(network, state_dict)
    elif isinstance(network, DExTra):
        fill(network, _dextra_params(network, state_dict))
    elif isinstance(network, DeLighTEncoderDecoder):
        fill(network, _mt_params(network, unwrap_checkpoint(state_dict)[0]))
    elif isinstance(network, DeLighTLanguageModel):
        fill(network, _lm_params(network, unwrap_checkpoint(state_dict)[0]))
    else:
        fill(network, _block_params(network, state_dict))


NETWORKS: tuple[type[nn.Module], ...] = (
    DeLighTEncoderDecoder,
    DeLighTLanguageModel,
    GroupLinear,
    DExTra,
    DeLighTEncoderBlock,
    DeLighTDecoderBlock,
)


def unwrap_checkpoint(loaded: Mapping[str, Any]) -> tuple[Mapping[str, Tensor], dict[str, Any]]:
    """A fairseq checkpoint's model state dict and its ``args`` as a dict (empty without them);
    any other mapping is returned as the state dict itself."""
    model = loaded.get("model")
    if not isinstance(model, Mapping):
        return loaded, {}
    args = loaded.get("args")
    return model, ({} if args is None else dict(vars(args) if hasattr(args, "__dict__") else args))


# fairseq DeLighT arguments -> DeLighTEncoderDecoder's (sizes only: what the tensors depend on)
MT_ARGUMENTS = {
    "delight_emb_out_dim": "d_model",
    "delight_enc_min_depth": "n_min",
    "delight_enc_max_depth": "n_max",
    "delight_enc_width_mult": "width_multiplier",
    "delight_enc_layers": "num_blocks",
    "delight_enc_max_groups": "max_groups",
    "delight_emb_map_dim": "embedding_dim",
    "share_all_embeddings": "share_all_embeddings",
    "share_decoder_input_output_embed": "share_decoder_input_output_embed",
}


# fairseq DeLighT language-model arguments -> DeLighTLanguageModel's (sizes only)
LM_ARGUMENTS = {
    "delight_emb_out_dim": "d_model",
    "delight_dec_min_depth": "n_min",
    "delight_dec_max_depth": "n_max",
    "delight_dec_width_mult": "width_multiplier",
    "delight_dec_layers": "num_blocks",
    "delight_dec_max_groups": "max_groups",
    "delight_emb_map_dim": "embedding_dim",
    "adaptive_input": "adaptive_input",
    "adaptive_input_factor": "adaptive_factor",
}


def lm_arguments(args: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`DeLighTLanguageModel` arguments a fairseq language-model checkpoint's ``args``
    give (``adaptive_input_cutoff`` "20000,60000" as ``cutoffs``)."""
    found = {ours: args[theirs] for theirs, ours in LM_ARGUMENTS.items() if theirs in args}
    for key in ("width_multiplier", "adaptive_factor"):
        if key in found:
            found[key] = float(found[key])
    if found.get("adaptive_input") and args.get("adaptive_input_cutoff"):
        found["cutoffs"] = [int(c) for c in str(args["adaptive_input_cutoff"]).split(",")]
    return found


def mt_arguments(args: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`DeLighTEncoderDecoder` arguments a fairseq checkpoint's ``args`` give.

    The decoder's depths, width and block count must equal the encoder's (every official
    architecture; the model here has one set); pre-norm and adaptive input are refused."""
    for enc, dec in (
        ("delight_enc_min_depth", "delight_dec_min_depth"),
        ("delight_enc_max_depth", "delight_dec_max_depth"),
        ("delight_enc_width_mult", "delight_dec_width_mult"),
        ("delight_enc_layers", "delight_dec_layers"),
    ):
        if enc in args and dec in args and args[enc] != args[dec]:
            raise OfficialWeightsError(
                f"official args {enc}={args[enc]} and {dec}={args[dec]} differ; "
                "DeLighTEncoderDecoder has one depth and width schedule for both sides"
            )
    for flag in ("encoder_normalize_before", "decoder_normalize_before", "adaptive_input"):
        if args.get(flag):
            raise OfficialWeightsError(
                f"official args {flag}=True: DeLighTEncoderDecoder is post-norm with a plain table"
            )
    found = {ours: args[theirs] for theirs, ours in MT_ARGUMENTS.items() if theirs in args}
    if "width_multiplier" in found:
        found["width_multiplier"] = float(found["width_multiplier"])
    return found


def load_official(network: nn.Module, weights: Weights) -> None:
    """Fill ``network`` in place with an official DeLighT layer's weights (a path or a state dict).

    ``network``: a :class:`GroupLinear` (official ``GroupLinear`` or ``Linear``: ``weights``,
    ``bias``), a :class:`DExTra` (``DExTraUnit``), a :class:`DeLighTEncoderBlock` /
    :class:`DeLighTDecoderBlock` (``DeLighTTransformerEncoderLayer`` / ``DecoderLayer``), a
    :class:`DeLighTEncoderDecoder` or :class:`DeLighTLanguageModel` (a fairseq
    ``delight_transformer`` or ``delight_transformer_lm`` state dict, or the checkpoint holding it
    under ``model``).

    Raises:
        OfficialWeightsError: official tensors missing or not mapped, or shapes that differ.
        TypeError: ``network`` is none of :data:`NETWORKS`.
    """
    if not isinstance(network, NETWORKS):
        raise unsupported(network, FAMILY, NETWORKS)
    if isinstance(weights, Mapping):
        weights = unwrap_checkpoint(weights)[0]
    load_with(network, weights, FAMILY, _fill)


def from_official(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    """The official layer that ``config`` describes, filled: a DeLighT encoder or decoder layer
    (``config["module"]``), a DExTra unit (``dextra_depth``) or a GLT (``n_groups``)."""
    if config.get("module") == "DeLighTTransformerEncoderLayer":
        return encoder_layer_from_official(state_dict, config)
    if config.get("module") == "DeLighTTransformerDecoderLayer":
        return decoder_layer_from_official(state_dict, config)
    if "dextra_depth" in config:
        return dextra_from_official(state_dict, config)
    if "n_groups" in config:
        return glt_from_official(state_dict, config)
    raise ValueError(
        "config describes neither a DExTra unit (dextra_depth) nor a GLT (n_groups): "
        f"keys {sorted(config)}"
    )
