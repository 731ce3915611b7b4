"""Official whole-model state dicts -> :class:`TransformerXL` and :class:`GroupTransformer`.

Sources: kimiyoung/transformer-xl ``MemTransformerLM`` (``attn_type=0``) and
clovaai/group-transformer ``MemTransformerLM`` (``model_type="group"``), both with ``div_val=1``,
``d_embed == d_model``, no adaptive softmax, ``ext_len=0``, ``same_length=False`` and no
``clamp_len``. Every size comes from the official ``config`` (its constructor arguments); the group
sublayers are converted by :mod:`src.compat.group_transformer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from src.compat.group_transformer import group_attention_from_official, group_feedforward_from_official
from src.models.group_transformer import GroupTransformer
from src.models.transformer_xl import TransformerXL


def _check_supported(config: Mapping[str, Any]) -> None:
    """Refuse official settings the models here do not implement."""
    d_model, n_head = config["d_model"], config["n_head"]
    unsupported = {
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
    bad = {name: got for name, (got, want) in unsupported.items() if got != want}
    if bad:
        raise ValueError(f"unsupported official settings {bad} (need div_val=1, d_embed=d_model=n_head*d_head, "
                         "no cutoffs, ext_len=0, same_length=False, no clamp_len, no sampled softmax, attn_type=0)")


def _sub(state_dict: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def _load_exactly(model: Any, state: dict[str, Tensor], official: Mapping[str, Tensor], used: set[str]) -> None:
    """Load ``state`` strictly and refuse official tensors that were not converted."""
    unused = sorted(set(official) - used)
    if unused:
        raise ValueError(f"official state dict has unconverted entries: {unused}")
    model.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True)


def transformer_xl_from_official(state_dict: Mapping[str, Tensor], config: Mapping[str, Any]) -> TransformerXL:
    """kimiyoung/transformer-xl ``MemTransformerLM`` (``attn_type=0``) -> :class:`TransformerXL`."""
    _check_supported(config)
    model = TransformerXL(
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
    sd = state_dict
    state = {
        "embedding.weight": sd["word_emb.emb_layers.0.weight"],
        "r_w_bias": sd["r_w_bias"],
        "r_r_bias": sd["r_r_bias"],
        "output.weight": sd["crit.out_layers.0.weight"],
        "output.bias": sd["crit.out_layers.0.bias"],
    }
    # the fixed sinusoid's inverse frequencies are a buffer, recomputed here
    used = set(state) - {"embedding.weight", "output.weight", "output.bias"}
    used |= {"word_emb.emb_layers.0.weight", "crit.out_layers.0.weight", "crit.out_layers.0.bias", "pos_emb.inv_freq"}
    names = {
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
    for i in range(config["n_layer"]):
        for official, ours in names.items():
            state[f"layers.{i}.{ours}"] = sd[f"layers.{i}.{official}"]
            used.add(f"layers.{i}.{official}")
    _load_exactly(model, state, sd, used)
    return model


def group_transformer_from_official(
    state_dict: Mapping[str, Tensor], config: Mapping[str, Any]
) -> GroupTransformer:
    """clovaai/group-transformer ``MemTransformerLM`` (``model_type="group"``) -> :class:`GroupTransformer`.

    The learnable position table ``pos_emb.pos_enc`` must have ``tgt_len + mem_len`` rows.
    """
    _check_supported(config)
    if config.get("model_type", "group") != "group":
        raise ValueError(f"only model_type='group' is supported, got {config.get('model_type')!r}")
    sd = state_dict
    table = sd["pos_emb.pos_enc"]
    if table.shape[0] != config["tgt_len"] + config["mem_len"]:
        raise ValueError(
            f"pos_emb.pos_enc has {table.shape[0]} rows, expected tgt_len + mem_len = "
            f"{config['tgt_len'] + config['mem_len']}"
        )
    model = GroupTransformer(
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
    state = {
        "embedding.weight": sd["word_emb.emb_layers.0.weight"],
        "pos_table.table": table,
        "r_w_bias": sd["r_w_bias"],
        "r_r_bias": sd["r_r_bias"],
        "out_norm.weight": sd["out_norm.weight"],
        "out_norm.bias": sd["out_norm.bias"],
        "out_trans.weight": sd["out_trans_layer.weight"],
        "out_trans.bias": sd["out_trans_layer.bias"],
        "output.weight": sd["crit.out_layers.0.weight"],
        "output.bias": sd["crit.out_layers.0.bias"],
    }
    used = {
        "word_emb.emb_layers.0.weight", "pos_emb.pos_enc", "r_w_bias", "r_r_bias", "out_norm.weight",
        "out_norm.bias", "out_trans_layer.weight", "out_trans_layer.bias", "crit.out_layers.0.weight",
        "crit.out_layers.0.bias",
    }
    for i in range(config["n_layer"]):
        for official, ours, convert in (
            ("attn", "attn", group_attention_from_official),
            ("ff", "ff", group_feedforward_from_official),
        ):
            prefix = f"layers.{i}.{official}."
            part = _sub(sd, prefix)
            used |= {prefix + k for k in part}
            for name, tensor in convert(part, config).state_dict().items():
                state[f"layers.{i}.{ours}.{name}"] = tensor
    _load_exactly(model, state, sd, used)
    return model
