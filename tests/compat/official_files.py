"""Official-format files made from networks of ours, for tests without the releases: EdgeNets
state dicts, a PRU ``RNNModel`` state dict and fairseq DeLighT translation and language-model
state dicts (the inverses of the converters' maps)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from src.compat.edgenets import official_key_map
from src.models.awd_lm import AWDLanguageModel
from src.models.delight_block import DeLighTDecoderBlock
from src.models.delight_lm import DeLighTLanguageModel
from src.models.delight_mt import DeLighTEncoderDecoder
from src.ops.dextra import DExTra


def official_state(net: nn.Module) -> dict[str, Tensor]:
    """``net``'s tensors under the official EdgeNets names and layouts (``module.``-prefixed, as
    the released files are)."""
    ours = net.state_dict()
    key_map, _ = official_key_map(net)
    official = {}
    for name, (target, transform) in key_map.items():
        value = ours[target].detach().clone()
        if transform is not None:  # a permutation of a (3C,) vector: invert it
            order = transform(torch.arange(value.numel()))
            value = torch.empty_like(value).index_copy_(0, order, value)
        official[f"module.{name}"] = value
    return official


def official_file(net: nn.Module, path: Path) -> dict[str, Tensor]:
    """Save :func:`official_state` of ``net`` at ``path``; returns ``net``'s own state."""
    torch.save(official_state(net), path)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


# -- PRU: an AWD language model as the official RNNModel's state dict ----------------------------


def awd_official_state(net: AWDLanguageModel) -> dict[str, Tensor]:
    """``net``'s tensors under the official ``RNNModel`` names (sacmehta/PRU): the inverse of
    :data:`src.compat.pru._OFFICIAL_RENAMES`."""
    renames = (
        (re.compile(r"embedding\.weight"), "encoder.weight"),
        (re.compile(r"decoder\.(weight|bias)"), r"decoder.\1"),
        (
            re.compile(r"rnns\.(\d+)\.cells\.0\.pyramid\.transforms\.(\d+)\.(weight|bias)"),
            r"rnns.\1.pt.pyramid.\2.\3",
        ),
        (re.compile(r"rnns\.(\d+)\.cells\.0\.context\.glt\.weight"), r"rnns.\1.glt.W"),
        (re.compile(r"rnns\.(\d+)\.cells\.0\.context\.glt\.bias"), r"rnns.\1.glt.bias"),
        (re.compile(r"rnns\.(\d+)\.((weight|bias)_(ih|hh)_l0)"), r"rnns.\1.\2"),
    )
    official = {}
    for key, value in net.state_dict().items():
        pattern, replacement = next((p, r) for p, r in renames if p.fullmatch(key))
        official[pattern.sub(replacement, key)] = value.detach().clone()
    return official


def pru_layer_state(layer: int, official_layer: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An official PRU layer's tensors (``pt.pyramid.*``, ``glt.*``) as layer ``layer`` of an
    official ``RNNModel``."""
    return {f"rnns.{layer}.{key}": value for key, value in official_layer.items()}


# -- DeLighT: a translation model as a fairseq checkpoint ----------------------------------------


def _dextra_official(
    dextra: DExTra, ours: str, official: str, state: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """A :class:`DExTra`'s tensors under the official ``DExTraUnit`` names and layouts."""
    out = {}
    for side in ("input", "output"):
        out[f"{official}{side}_layer.weights"] = state[f"{ours}{side}_layer.weight"]
        out[f"{official}{side}_layer.bias"] = state[f"{ours}{side}_layer.bias"]
        for name in ("weight", "bias"):
            out[f"{official}{side}_layer.normalization_fn.{name}"] = state[
                f"{ours}{side}_norm.{name}"
            ]
    for index, groups in enumerate(dextra.plan.groups):
        weight, bias = (
            state[f"{ours}glts.{index}.weight"],
            state[f"{ours}glts.{index}.bias"],
        )  # (g, i, o), (g, o)
        if groups == 1:  # the official dense Linear: (out, in), (out,)
            weight, bias = weight[0].t(), bias.reshape(-1)
        else:  # the official GroupLinear: (g, in/g, out/g), (g, 1, out/g)
            bias = bias.unsqueeze(1)
        out[f"{official}dextra_layers.{index}.weights"] = weight
        out[f"{official}dextra_layers.{index}.bias"] = bias
        for name in ("weight", "bias"):
            out[f"{official}dextra_layers.{index}.normalization_fn.{name}"] = state[
                f"{ours}glt_norms.{index}.{name}"
            ]
    return out


# our block names -> the official layer's, outside the DExTra unit: (ours, official, is Linear)
_BLOCK_NAMES = (
    ("self_attn.qkv_proj.", "self_attn.linear_kqv.", True),
    ("self_attn.out_proj.", "self_attn.out_proj.", True),
    ("self_attn_norm.", "self_attn_layer_norm.", False),
    ("encoder_attn.q_proj.", "encoder_attn.linear_q.", True),
    ("encoder_attn.kv_proj.", "encoder_attn.linear_kv.", True),
    ("encoder_attn.out_proj.", "encoder_attn.out_proj.", True),
    ("encoder_attn_norm.", "encoder_attn_layer_norm.", False),
    ("fc1.", "fc1.", True),
    ("fc2.", "fc2.", True),
    ("final_norm.", "final_layer_norm.", False),
)


def delight_block_official(
    block: nn.Module, ours: str, official: str, state: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """A DeLighT encoder or decoder block's tensors under the official layer's names."""
    dextra = "dextra_layer_sa." if isinstance(block, DeLighTDecoderBlock) else "dextra_layer."
    out = _dextra_official(block.dextra, f"{ours}dextra.", f"{official}{dextra}", state)
    for our_name, their_name, is_linear in _BLOCK_NAMES:
        if f"{ours}{our_name}weight" in state:
            out[f"{official}{their_name}{'weights' if is_linear else 'weight'}"] = state[
                f"{ours}{our_name}weight"
            ]
            out[f"{official}{their_name}bias"] = state[f"{ours}{our_name}bias"]
    return out


def delight_mt_official_state(net: DeLighTEncoderDecoder) -> dict[str, Tensor]:
    """``net``'s tensors as a fairseq ``delight_transformer`` state dict (with its buffers)."""
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    official: dict[str, Tensor] = {}
    sides = (
        ("encoder", net.encoder_embedding, net.encoder_blocks),
        ("decoder", net.decoder_embedding, net.decoder_blocks),
    )
    for side, embedding, blocks in sides:
        official[f"{side}.version"] = torch.tensor([3.0])
        official[f"{side}.embed_tokens.map_layer.weight"] = state[f"{side}_embedding.lookup.weight"]
        official |= _dextra_official(
            embedding.dextra,
            f"{side}_embedding.dextra.",
            f"{side}.embed_tokens.dextra_layer.",
            state,
        )
        official[f"{side}.embed_positions._float_tensor"] = torch.zeros(1)
        for b, block in enumerate(blocks):
            official |= delight_block_official(
                block, f"{side}_blocks.{b}.", f"{side}.layers.{b}.", state
            )
    if net.project_out is not None:
        official["decoder.project_out_dim.weights"] = state["project_out.weight"]
    if net.output is not None:
        official["decoder.embed_out.weights"] = state["output.weight"]
    return official


def delight_lm_official_state(net: DeLighTLanguageModel) -> dict[str, Tensor]:
    """``net``'s tensors as a fairseq ``delight_transformer_lm`` state dict: the tied adaptive
    softmax repeats the adaptive input's tables and projections under its own names."""
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    table = "decoder.embed_tokens.map_layer."
    official: dict[str, Tensor] = {"decoder.version": torch.tensor([3.0])}
    lookup = {
        k.removeprefix("embedding.lookup."): v
        for k, v in state.items()
        if k.startswith("embedding.lookup.")
    }
    softmax = "decoder.adaptive_softmax."
    for name, value in lookup.items():
        official[f"{softmax}head.{name}" if name == "class_proj.weight" else f"{table}{name}"] = (
            value
        )
    if "class_proj.weight" in lookup:  # adaptive input and softmax
        official[f"{table}_float_tensor"] = torch.zeros(1)
        official[f"{softmax}head.word_proj.weight"] = lookup["embeddings.0.weight"]
        official[f"{softmax}head._float_tensor"] = torch.zeros(1)
        official[f"{softmax}version"] = torch.tensor([1])
        bands = sum(1 for name in lookup if name.startswith("embeddings."))
        for i in range(1, bands):
            official[f"{softmax}tail.{i - 1}.0.weight"] = lookup[f"projections.{i}.weight"]
            official[f"{softmax}tail.{i - 1}.2.weight"] = lookup[f"embeddings.{i}.weight"]
    official |= _dextra_official(
        net.embedding.dextra, "embedding.dextra.", "decoder.embed_tokens.dextra_layer.", state
    )
    official["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    for b, block in enumerate(net.blocks):
        official |= delight_block_official(block, f"blocks.{b}.", f"decoder.layers.{b}.", state)
    if net.project_out is not None:
        official["decoder.project_out_dim.weights"] = state["project_out.weight"]
    return official


def delight_mt_args(net: DeLighTEncoderDecoder) -> argparse.Namespace:
    """The fairseq ``args`` of a checkpoint of ``net`` (the size arguments)."""
    depth = {"min_depth": net.n_min, "max_depth": net.n_max, "width_mult": net.width_multiplier}
    depth["layers"] = len(net.encoder_blocks)
    args = {
        f"delight_{side}_{key}": value for side in ("enc", "dec") for key, value in depth.items()
    }
    return argparse.Namespace(
        arch="delight_transformer",
        delight_emb_map_dim=net.encoder_embedding.lookup.embedding_dim,
        delight_emb_out_dim=net.d_model,
        delight_emb_depth=net.n_min,
        delight_enc_max_groups=net.max_groups,
        delight_dec_max_groups=net.max_groups,
        share_all_embeddings=net.share_all_embeddings,
        share_decoder_input_output_embed=net.share_decoder_input_output_embed,
        encoder_normalize_before=False,
        decoder_normalize_before=False,
        **args,
    )
