"""Official Group-Transformer (clovaai/group-transformer) and Transformer-XL (kimiyoung/
transformer-xl) state dicts -> this project's group ops, :class:`GroupTransformer` and
:class:`TransformerXL`.

:func:`from_official` builds what an official state dict and its constructor arguments describe
(the group embedding, group attention, group feed-forward, or a whole ``MemTransformerLM``) and
fills it; :func:`load_official` fills one of ours in place.

Official layouts: a grouped linear is a 1x1 ``Conv1d(groups=G)`` with weight ``[out, in/G, 1]``
(output channel o belongs to group ``o // (out/G)``); ``GroupLinear`` stores ``(G, in/G, out/G)``
used as ``x_g @ W_g``. An ``nn.Linear`` weight ``[out, in]`` stays as it is, and the separate
``k_net``/``v_net`` convs become the rows of one ``kv_net`` Linear. Every size comes from the
official ``config`` (its constructor arguments) or the module being filled, and the tensors.

Whole models: kimiyoung/transformer-xl ``MemTransformerLM`` (``attn_type=0``) and
clovaai/group-transformer ``MemTransformerLM`` (``model_type="group"``), both with ``div_val=1``,
``d_embed == d_model``, no adaptive softmax, ``ext_len=0``, ``same_length=False`` and no
``clamp_len``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from src.compat.common import (
    OfficialWeightsError,
    Weights,
    check_keys,
    fill,
    load_with,
    unsupported,
)
from src.models.group_transformer import GroupTransformer
from src.models.transformer_xl import TransformerXL
from src.ops.group_attention import GroupAttention
from src.ops.group_embedding import GroupEmbedding
from src.ops.group_feedforward import GroupFeedForward

FAMILY = "Group-Transformer"


def grouped_conv_to_group_linear(weight: Tensor, groups: int) -> Tensor:
    """A 1x1 grouped Conv1d weight as a ``GroupLinear`` weight.

    Shape:
        (out, in/G, 1) -> (G, in/G, out/G)
    """
    if weight.dim() != 3 or weight.shape[-1] != 1 or weight.shape[0] % groups:
        raise OfficialWeightsError(
            f"expected a 1x1 Conv1d weight [out, in/G, 1] with out divisible by G={groups}, "
            f"got {tuple(weight.shape)}"
        )
    out_features, in_per_group, _ = weight.shape
    # (out, in/G, 1) -> (G, out/G, in/G) -> (G, in/G, out/G)
    return weight[..., 0].reshape(groups, out_features // groups, in_per_group).transpose(1, 2)


def _group_bias(bias: Tensor, groups: int) -> Tensor:
    """A grouped conv's bias as a ``GroupLinear`` bias: (out,) -> (G, out/G)."""
    if bias.dim() != 1 or bias.numel() % groups:
        raise OfficialWeightsError(
            f"expected a bias [out] with out divisible by G={groups}, got {tuple(bias.shape)}"
        )
    return bias.reshape(groups, -1)


def _conv_as_linear(weight: Tensor) -> Tensor:
    """An ungrouped 1x1 Conv1d weight as an ``nn.Linear`` weight: (out, in, 1) -> (out, in)."""
    if weight.dim() != 3 or weight.shape[-1] != 1:
        raise OfficialWeightsError(
            f"expected a 1x1 Conv1d weight [out, in, 1], got {tuple(weight.shape)}"
        )
    return weight[..., 0]


# -- the group sublayers: official tensors -> ours, for a module of ours ------------------------


def _embedding_state(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The official ``AdaptiveEmbedding`` (``div_val=1``) -> :class:`GroupEmbedding`."""
    check_keys(state_dict, {"emb_layers.0.weight"})
    return {"weight": state_dict["emb_layers.0.weight"]}


def _attention_state(attn: GroupAttention, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The official ``GroupMultiHeadAttn`` (``q_net``, ``inter_q_net``, ``k_net``, ``v_net``,
    ``r_net``, ``intra_linear``, ``inter_linear``, ``q_norm``, ``kv_norm``) -> ``attn``'s names."""
    official_keys = {
        "q_norm.gamma", "q_norm.beta", "kv_norm.gamma", "kv_norm.beta", "q_net.weight",
        "k_net.weight", "v_net.weight", "r_net.weight", "intra_linear.weight",
    }  # fmt: skip
    if attn.inter_group:
        official_keys |= {"inter_q_net.weight", "inter_linear.weight"}
    check_keys(state_dict, official_keys)
    sd, groups = state_dict, attn.groups
    state = {
        "q_norm.weight": sd["q_norm.gamma"],
        "q_norm.bias": sd["q_norm.beta"],
        "kv_norm.weight": sd["kv_norm.gamma"],
        "kv_norm.bias": sd["kv_norm.beta"],
        "q_net.weight": grouped_conv_to_group_linear(sd["q_net.weight"], groups),
        "kv_net.weight": torch.cat(
            [_conv_as_linear(sd["k_net.weight"]), _conv_as_linear(sd["v_net.weight"])]
        ),
        "r_net.weight": grouped_conv_to_group_linear(sd["r_net.weight"], groups),
        "o_net.weight": grouped_conv_to_group_linear(sd["intra_linear.weight"], groups),
    }
    if attn.inter_group:
        state["inter_q_net.weight"] = _conv_as_linear(sd["inter_q_net.weight"])
        state["inter_o_net.weight"] = sd["inter_linear.weight"]
    return state


def _feedforward_state(
    ffn: GroupFeedForward, state_dict: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """The official ``GroupFeedforward`` (``lnorm1``-``lnorm3``, ``inter_linear``,
    ``intra_linear_1.0``, ``intra_linear_2``) -> ``ffn``'s names."""
    if not ffn.inter_group:
        raise OfficialWeightsError(
            "the official GroupFeedforward has the inter-group map; this one is built without it"
        )
    check_keys(
        state_dict,
        {
            "lnorm1.gamma", "lnorm1.beta", "inter_linear.weight", "inter_linear.bias",
            "lnorm2.gamma", "lnorm2.beta", "intra_linear_1.0.weight", "intra_linear_1.0.bias",
            "lnorm3.gamma", "lnorm3.beta", "intra_linear_2.weight", "intra_linear_2.bias",
        },
    )  # fmt: skip
    sd, groups = state_dict, ffn.groups
    return {
        "inter_norm.weight": sd["lnorm1.gamma"],
        "inter_norm.bias": sd["lnorm1.beta"],
        "inter_linear.weight": grouped_conv_to_group_linear(sd["inter_linear.weight"], groups),
        "inter_linear.bias": _group_bias(sd["inter_linear.bias"], groups),
        "input_norm.weight": sd["lnorm2.gamma"],
        "input_norm.bias": sd["lnorm2.beta"],
        "intra_linear_1.weight": grouped_conv_to_group_linear(
            sd["intra_linear_1.0.weight"], groups
        ),
        "intra_linear_1.bias": _group_bias(sd["intra_linear_1.0.bias"], groups),
        "hidden_norm.weight": sd["lnorm3.gamma"],
        "hidden_norm.bias": sd["lnorm3.beta"],
        "intra_linear_2.weight": grouped_conv_to_group_linear(sd["intra_linear_2.weight"], groups),
        "intra_linear_2.bias": _group_bias(sd["intra_linear_2.bias"], groups),
    }


# -- whole models ------------------------------------------------------------------------------

# official Transformer-XL layer names -> ours (``layers.{i}.`` on both sides)
_TXL_LAYER_NAMES = {
    "dec_attn.qkv_net.weight": "attn.qkv_net.weight",
    "dec_attn.r_net.weight": "attn.r_net.weight",
    "dec_attn.o_net.weight": "attn.o_net.weight",
    "dec_attn.layer_norm.weight": "attn.norm.weight",
    "dec_attn.layer_norm.bias": "attn.norm.bias",
    "pos_ff.CoreNet.0.weight": "ff.linear_1.weight",
    "pos_ff.CoreNet.0.bias": "ff.linear_1.bias",
    "pos_ff.CoreNet.3.weight": "ff.linear_2.weight",
    "pos_ff.CoreNet.3.bias": "ff.linear_2.bias",
    "pos_ff.layer_norm.weight": "ff.norm.weight",
    "pos_ff.layer_norm.bias": "ff.norm.bias",
}
_OUTPUT_NAMES = {
    "word_emb.emb_layers.0.weight": "embedding.weight",
    "r_w_bias": "r_w_bias",
    "r_r_bias": "r_r_bias",
    "crit.out_layers.0.weight": "output.weight",
    "crit.out_layers.0.bias": "output.bias",
}


def _transformer_xl_state(
    model: TransformerXL, state_dict: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """kimiyoung/transformer-xl ``MemTransformerLM`` (``attn_type=0``) -> ``model``'s names.

    The fixed sinusoid's inverse frequencies (``pos_emb.inv_freq``) are a buffer recomputed here."""
    names = dict(_OUTPUT_NAMES)
    for i in range(len(model.layers)):
        names |= {
            f"layers.{i}.{theirs}": f"layers.{i}.{ours}"
            for theirs, ours in _TXL_LAYER_NAMES.items()
        }
    check_keys({k: v for k, v in state_dict.items() if k != "pos_emb.inv_freq"}, names)
    return {ours: state_dict[theirs] for theirs, ours in names.items()}


def _group_transformer_state(
    model: GroupTransformer, state_dict: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """clovaai/group-transformer ``MemTransformerLM`` (``model_type="group"``) -> ``model``'s
    names."""
    if not (model.group_attention and model.group_ffn and model.learnable_pos):
        raise OfficialWeightsError(
            "the official Group-Transformer has group attention, group feed-forward layers and a "
            "learnable position table; this one is an ablation (group_attention="
            f"{model.group_attention}, group_ffn={model.group_ffn}, "
            f"learnable_pos={model.learnable_pos})"
        )
    names = dict(_OUTPUT_NAMES) | {
        "pos_emb.pos_enc": "pos_table.table",
        "out_norm.weight": "out_norm.weight",
        "out_norm.bias": "out_norm.bias",
        "out_trans_layer.weight": "out_trans.weight",
        "out_trans_layer.bias": "out_trans.bias",
    }
    layer_prefixes = [
        f"layers.{i}.{part}." for i in range(len(model.layers)) for part in ("attn", "ff")
    ]
    rest = {k: v for k, v in state_dict.items() if not k.startswith(tuple(layer_prefixes))}
    check_keys(rest, names)
    state = {ours: state_dict[theirs] for theirs, ours in names.items()}
    for i, layer in enumerate(model.layers):
        for part, convert in (("attn", _attention_state), ("ff", _feedforward_state)):
            prefix = f"layers.{i}.{part}."
            sub = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
            try:
                converted = convert(getattr(layer, part), sub)
            except OfficialWeightsError as error:
                raise OfficialWeightsError(f"{prefix.rstrip('.')}: {error}") from None
            state |= {f"{prefix}{name}": tensor for name, tensor in converted.items()}
    return state


def _fill(network: nn.Module, state_dict: Mapping[str, Tensor]) -> None:
    if isinstance(network, GroupEmbedding):
        fill(network, _embedding_state(state_dict))
    elif isinstance(network, GroupAttention):
        fill(network, _attention_state(network, state_dict))
    elif isinstance(network, GroupFeedForward):
        fill(network, _feedforward_state(network, state_dict))
    elif isinstance(network, TransformerXL):
        fill(network, _transformer_xl_state(network, state_dict))
    else:
        fill(network, _group_transformer_state(network, state_dict))


NETWORKS: tuple[type[nn.Module], ...] = (
    TransformerXL,
    GroupTransformer,
    GroupEmbedding,
    GroupAttention,
    GroupFeedForward,
)


def load_official(network: nn.Module, weights: Weights) -> None:
    """Fill ``network`` in place with official weights (a path or a state dict).

    ``network``: a :class:`TransformerXL` (kimiyoung ``MemTransformerLM``, ``attn_type=0``), a
    :class:`GroupTransformer` (clovaai ``MemTransformerLM``, ``model_type="group"``; its
    ``pos_emb.pos_enc`` has ``tgt_len + mem_len`` rows), or one of the group ops
    (``AdaptiveEmbedding`` with ``div_val=1``, ``GroupMultiHeadAttn``, ``GroupFeedforward``).

    Raises:
        OfficialWeightsError: official tensors missing or not converted, or shapes that differ.
        TypeError: ``network`` is none of :data:`NETWORKS`.
    """
    if not isinstance(network, NETWORKS):
        raise unsupported(network, FAMILY, NETWORKS)
    load_with(network, weights, FAMILY, _fill)


# -- building from the official constructor arguments ------------------------------------------


def _check_supported(config: Mapping[str, Any]) -> None:
    """Refuse official model settings the models here do not implement."""
    d_model, n_head = config["d_model"], config["n_head"]
    unsupported_settings = {
        "div_val": (config.get("div_val", 1), 1),
        "d_embed": (config.get("d_embed", d_model), d_model),
        "d_head": (config.get("d_head", d_model // n_head), d_model // n_head),
        "cutoffs": (list(config.get("cutoffs", [])), []),
        "ext_len": (config.get("ext_len", 0), 0),
        "same_length": (config.get("same_length", False), False),
        "clamp_len": (config.get("clamp_len", -1) > 0, False),
        "sample_softmax": (config.get("sample_softmax", -1) > 0, False),
        "attn_type": (config.get("attn_type", 0), 0),
    }
    bad = {name: got for name, (got, want) in unsupported_settings.items() if got != want}
    if bad:
        raise ValueError(
            f"unsupported official settings {bad} (need div_val=1, d_embed=d_model=n_head*d_head, "
            "no cutoffs, ext_len=0, same_length=False, no clamp_len, no sampled softmax, "
            "attn_type=0)"
        )


def _group_embedding(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    d_model = config["d_model"]
    if config.get("div_val", 1) != 1 or config.get("d_embed", d_model) != d_model:
        raise ValueError(
            "only div_val=1 and d_embed == d_model are supported, got "
            f"div_val={config.get('div_val')}, d_embed={config.get('d_embed')}, "
            f"d_model={d_model}"
        )
    check_keys(state_dict, {"emb_layers.0.weight"})
    return GroupEmbedding(state_dict["emb_layers.0.weight"].shape[0], d_model)


def _group_attention(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    d_model, n_head = config["d_model"], config["n_head"]
    if config.get("d_head", d_model // n_head) * n_head != d_model:
        raise ValueError(
            f"group attention needs d_model == n_head * d_head, got d_model={d_model}, "
            f"n_head={n_head}, d_head={config.get('d_head')}"
        )
    return GroupAttention(
        d_model,
        n_head,
        config["n_group"],
        dropout=config.get("dropout", 0.0),
        dropatt=config.get("dropatt", 0.0),
        inter_group="inter_q_net.weight" in state_dict,
    )


def _group_feedforward(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    # the official module ignores its ``dropout`` argument, so ours has dropout=0.0
    return GroupFeedForward(config["d_model"], config["d_inner"], config["n_group"])


def _transformer_xl(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    _check_supported(config)
    return TransformerXL(
        config["n_token"],
        config["n_layer"],
        config["d_model"],
        config["n_head"],
        config["d_inner"],
        mem_len=config["mem_len"],
        dropout=config.get("dropout", 0.0),
        dropatt=config.get("dropatt", 0.0),
        pre_norm=config.get("pre_lnorm", False),
        tie_weight=config.get("tie_weight", True),
    )


def _group_transformer(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    _check_supported(config)
    if config["model_type"] != "group":
        raise ValueError(f"only model_type='group' is supported, got {config['model_type']!r}")
    return GroupTransformer(
        config["n_token"],
        config["n_layer"],
        config["d_model"],
        config["n_head"],
        config["d_inner"],
        config["n_group"],
        tgt_len=config["tgt_len"],
        mem_len=config["mem_len"],
        dropout=config.get("dropout", 0.0),
        dropatt=config.get("dropatt", 0.0),
        tie_weight=config.get("tie_weight", True),
        learnable_pos=True,
    )


def from_official(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    """Build and fill whatever ``state_dict`` holds: a whole ``MemTransformerLM``
    (``word_emb.*``; clovaai's Group-Transformer when ``config`` has its ``model_type``, else
    kimiyoung's Transformer-XL), a group embedding (``emb_layers.*``), a group attention
    (``q_net.*``) or a group feed-forward layer (``intra_linear_1.0.*``).

    Args:
        state_dict: the official tensors.
        config: the official constructor arguments (``n_token``, ``n_layer``, ``n_head``,
            ``d_model``, ``d_head``, ``d_inner``, ``n_group``, ``tgt_len``, ``mem_len``,
            ``dropout``, ``dropatt``, ``tie_weight``, ``pre_lnorm``, ``model_type`` ..., as the
            fixtures store them); settings the models here do not implement are refused.
    """
    if "word_emb.emb_layers.0.weight" in state_dict:
        build = _group_transformer if "model_type" in config else _transformer_xl
    elif "emb_layers.0.weight" in state_dict:
        build = _group_embedding
    elif "q_net.weight" in state_dict:
        build = _group_attention
    elif "intra_linear_1.0.weight" in state_dict:
        build = _group_feedforward
    else:
        raise ValueError(
            "not a Transformer-XL or Group-Transformer model, embedding, attention or FFN state "
            f"dict; keys: {sorted(state_dict)[:8]}"
        )
    module = build(state_dict, config)
    load_official(module, state_dict)
    return module
