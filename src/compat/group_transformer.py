"""Official Group-Transformer (clovaai/group-transformer) state dicts -> this project's group ops.

Official layouts: a grouped linear is a 1x1 ``Conv1d(groups=G)`` with weight ``[out, in/G, 1]``
(output channel o belongs to group ``o // (out/G)``); ``GroupLinear`` stores ``(G, in/G, out/G)``
used as ``x_g @ W_g``. An ``nn.Linear`` weight ``[out, in]`` stays as it is, and the separate
``k_net``/``v_net`` convs become the rows of one ``kv_net`` Linear. Every size comes from the
official ``config`` (its constructor arguments) and the tensors themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from src.ops.group_attention import GroupAttention
from src.ops.group_embedding import GroupEmbedding
from src.ops.group_feedforward import GroupFeedForward


def grouped_conv_to_group_linear(weight: Tensor, groups: int) -> Tensor:
    """A 1x1 grouped Conv1d weight as a ``GroupLinear`` weight.

    Shape:
        (out, in/G, 1) -> (G, in/G, out/G)
    """
    if weight.dim() != 3 or weight.shape[-1] != 1 or weight.shape[0] % groups:
        raise ValueError(
            f"expected a 1x1 Conv1d weight [out, in/G, 1] with out divisible by G={groups}, "
            f"got {tuple(weight.shape)}"
        )
    out_features, in_per_group, _ = weight.shape
    # (out, in/G, 1) -> (G, out/G, in/G) -> (G, in/G, out/G)
    return weight[..., 0].reshape(groups, out_features // groups, in_per_group).transpose(1, 2)


def _conv_as_linear(weight: Tensor) -> Tensor:
    """An ungrouped 1x1 Conv1d weight as an ``nn.Linear`` weight: (out, in, 1) -> (out, in)."""
    if weight.dim() != 3 or weight.shape[-1] != 1:
        raise ValueError(f"expected a 1x1 Conv1d weight [out, in, 1], got {tuple(weight.shape)}")
    return weight[..., 0]


def group_embedding_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> GroupEmbedding:
    """The official ``AdaptiveEmbedding`` (``div_val=1``, ``d_embed == d_model``) ->
    :class:`GroupEmbedding`.
    """
    d_model = config["d_model"]
    if config.get("div_val", 1) != 1 or config.get("d_embed", d_model) != d_model:
        raise ValueError(
            "only div_val=1 and d_embed == d_model are supported, got "
            f"div_val={config.get('div_val')}, d_embed={config.get('d_embed')}, "
            f"d_model={d_model}"
        )
    _check_keys(state_dict, {"emb_layers.0.weight"})
    weight = state_dict["emb_layers.0.weight"]
    module = GroupEmbedding(weight.shape[0], d_model)
    module.load_state_dict({"weight": weight})
    return module


def group_attention_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> GroupAttention:
    """The official ``GroupMultiHeadAttn`` layer (``q_net``, ``inter_q_net``, ``k_net``, ``v_net``,
    ``r_net``, ``intra_linear``, ``inter_linear``, ``q_norm``, ``kv_norm``) ->
    :class:`GroupAttention`.
    """
    d_model, n_head, groups = config["d_model"], config["n_head"], config["n_group"]
    if config.get("d_head", d_model // n_head) * n_head != d_model:
        raise ValueError(
            f"group attention needs d_model == n_head * d_head, got d_model={d_model}, "
            f"n_head={n_head}, d_head={config.get('d_head')}"
        )
    inter_group = "inter_q_net.weight" in state_dict
    official_keys = {
        "q_norm.gamma", "q_norm.beta", "kv_norm.gamma", "kv_norm.beta", "q_net.weight",
        "k_net.weight", "v_net.weight", "r_net.weight", "intra_linear.weight",
    }
    if inter_group:
        official_keys |= {"inter_q_net.weight", "inter_linear.weight"}
    _check_keys(state_dict, official_keys)
    module = GroupAttention(
        d_model,
        n_head,
        groups,
        dropout=config.get("dropout", 0.0),
        dropatt=config.get("dropatt", 0.0),
        inter_group=inter_group,
    )
    sd = state_dict
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
    if inter_group:
        state["inter_q_net.weight"] = _conv_as_linear(sd["inter_q_net.weight"])
        state["inter_o_net.weight"] = sd["inter_linear.weight"]
    module.load_state_dict({name: tensor.contiguous() for name, tensor in state.items()})
    return module


def group_feedforward_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> GroupFeedForward:
    """The official ``GroupFeedforward`` (``lnorm1``-``lnorm3``, ``inter_linear``,
    ``intra_linear_1.0``, ``intra_linear_2``) -> :class:`GroupFeedForward`.

    The official module ignores its ``dropout`` argument, so the result has ``dropout=0.0``.
    """
    d_model, d_inner, groups = config["d_model"], config["d_inner"], config["n_group"]
    _check_keys(
        state_dict,
        {
            "lnorm1.gamma", "lnorm1.beta", "inter_linear.weight", "inter_linear.bias",
            "lnorm2.gamma", "lnorm2.beta", "intra_linear_1.0.weight", "intra_linear_1.0.bias",
            "lnorm3.gamma", "lnorm3.beta", "intra_linear_2.weight", "intra_linear_2.bias",
        },
    )
    module = GroupFeedForward(d_model, d_inner, groups)
    sd = state_dict
    state = {
        "inter_norm.weight": sd["lnorm1.gamma"],
        "inter_norm.bias": sd["lnorm1.beta"],
        "inter_linear.weight": grouped_conv_to_group_linear(sd["inter_linear.weight"], groups),
        "inter_linear.bias": sd["inter_linear.bias"].reshape(groups, -1),
        "input_norm.weight": sd["lnorm2.gamma"],
        "input_norm.bias": sd["lnorm2.beta"],
        "intra_linear_1.weight": grouped_conv_to_group_linear(
            sd["intra_linear_1.0.weight"], groups
        ),
        "intra_linear_1.bias": sd["intra_linear_1.0.bias"].reshape(groups, -1),
        "hidden_norm.weight": sd["lnorm3.gamma"],
        "hidden_norm.bias": sd["lnorm3.beta"],
        "intra_linear_2.weight": grouped_conv_to_group_linear(sd["intra_linear_2.weight"], groups),
        "intra_linear_2.bias": sd["intra_linear_2.bias"].reshape(groups, -1),
    }
    module.load_state_dict({name: tensor.contiguous() for name, tensor in state.items()})
    return module


def _check_keys(state_dict: Mapping[str, Tensor], expected: set[str]) -> None:
    """Refuse official state dicts with missing or unconverted parameters."""
    missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise ValueError(
            f"official state dict does not match: missing {missing}, unexpected {unexpected}"
        )


def from_official(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> nn.Module:
    """Convert whichever Group-Transformer part ``state_dict`` holds (embedding, attention, FFN)."""
    if "emb_layers.0.weight" in state_dict:
        return group_embedding_from_official(state_dict, config)
    if "q_net.weight" in state_dict:
        return group_attention_from_official(state_dict, config)
    if "intra_linear_1.0.weight" in state_dict:
        return group_feedforward_from_official(state_dict, config)
    raise ValueError(
        "not a Group-Transformer embedding, attention or FFN state dict; keys: "
        f"{sorted(state_dict)}"
    )
