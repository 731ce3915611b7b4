"""Whole-model DeLighT parity: our translation network against a float64 official reference.

There is no whole-model fixture from the official code (sacmehta/delight), so this is two steps:

1. The reference below is written from the README of the reference folder alone, as plain
   float64 functions over a dict of official-named tensors. It reproduces every official GLT,
   DExTra, encoder-block and decoder-block fixture (``output_float64``) and the official DExTra
   schedule table, which ties it to the official code rather than to ours.
2. A small :class:`DeLighTEncoderDecoder` with block-wise scaling and random non-trivial
   parameters and the reference, given the same weights under the official names, score the same
   padded batch. Their logits and log-probabilities must agree.

Model-level tensor names follow the official modules' attributes: ``encoder.embed_tokens``
(``map_layer`` the lookup table, ``dextra_layer`` its DExTra), ``encoder.layers.<b>``, the same on
the decoder side, and ``decoder.project_out_dim``. The README describes what they compute ("Model
level"). Two points it leaves open follow the official ``delight_transformer.py``: the table is
scaled by sqrt(its width), and the decoder's self-attention masks no padded target keys.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

from src.models.delight_mt import DeLighTEncoderDecoder
from tests.parity.reference import fixtures, load

EPS = 1e-5  # every official LayerNorm
PADDING_IDX = 1  # fairseq's dictionary: <s>=0, <pad>=1, </s>=2, <unk>=3
FIXTURE_TOLERANCE = 1e-10  # measured <= 5e-15
MODEL_TOLERANCE = 1e-9  # measured <= 5e-15


class Recorded(dict):
    """An official state dict that remembers which tensors the reference read."""

    def __init__(self, tensors: Mapping[str, Tensor]) -> None:
        super().__init__(
            {k: v.double() if v.is_floating_point() else v for k, v in tensors.items()}
        )
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> Tensor:
        self.read.add(name)
        return super().__getitem__(name)


# --- the reference: README "GLT semantics" -------------------------------------------------------


def swish(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """LayerNorm over the last dim (biased variance, eps 1e-5)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + EPS) * weight + bias


def linear(x: Tensor, sd: Recorded, prefix: str, *, bias: bool = True) -> Tensor:
    """The official dense ``Linear``: ``weights`` (out, in), x W^T + b."""
    y = x @ sd[f"{prefix}weights"].T
    return y + sd[f"{prefix}bias"] if bias else y


def linear_ln_swish(x: Tensor, sd: Recorded, prefix: str) -> Tensor:
    """A DExTra input/output layer: Linear, full-width LayerNorm, swish."""
    y = linear(x, sd, prefix)
    norm = f"{prefix}normalization_fn."
    return swish(layer_norm(y, sd[f"{norm}weight"], sd[f"{norm}bias"]))


def glt(
    x: Tensor, sd: Recorded, prefix: str, groups: int, *, shuffle: bool, norm: bool, act: bool
) -> Tensor:
    """The official ``GroupLinear``: ``weights`` (g, in/g, out/g), ``bias`` (g, 1, out/g).

    Shape:
        (..., in) -> (..., out)
    """
    lead, d_in = x.shape[:-1], x.shape[-1]
    weight = sd[f"{prefix}weights"]
    assert weight.shape[:2] == (groups, d_in // groups)
    x = x.reshape(-1, groups, d_in // groups)  # (N, g, in/g): contiguous chunks
    y = torch.einsum("ngi,gio->ngo", x, weight) + sd[f"{prefix}bias"].transpose(0, 1)
    if shuffle:
        y = y.transpose(1, 2)  # (N, out/g, g): output j*g + i is group i's unit j
    y = y.reshape(len(y), -1)  # (N, out)
    if norm:
        # cut again into g contiguous chunks, each normalised alone with one shared affine
        chunks = y.reshape(len(y), groups, -1)  # (N, g, out/g)
        norm_prefix = f"{prefix}normalization_fn."
        chunks = layer_norm(chunks, sd[f"{norm_prefix}weight"], sd[f"{norm_prefix}bias"])
        y = chunks.reshape(len(y), -1)
    if act:
        y = swish(y)
    return y.reshape(*lead, -1)


# --- README "DExTra (DeLighT transformation) semantics" -----------------------------------------


def schedule(
    in_features: int, p: int, o: int, w: float, depth: int, max_groups: int
) -> tuple[list[int], list[int], list[int]]:
    """Groups, input widths and output widths of the N GLTs (README "Schedule (observed)")."""
    m = math.ceil(depth / 2)
    groups = [min(2**k, max_groups) for k in range(1, m + 1)]
    widths = [int(v) for v in np.linspace(p, w * in_features, m)]
    # mirror; for even N the middle entry appears twice
    mirrored = m if depth % 2 == 0 else m - 1
    groups += groups[:mirrored][::-1]
    widths += widths[:mirrored][::-1]
    outs = [
        -(-widths[i] // max(groups[i], groups[i + 1], 8)) * max(groups[i], groups[i + 1], 8)
        for i in range(depth - 1)
    ] + [o]
    ins = [p] + [out + p for out in outs[:-1]]
    return groups, ins, outs


def dextra_schedule(config: Mapping) -> tuple[list[int], list[int], list[int]]:
    """:func:`schedule` from the official ``DExTraUnit`` arguments."""
    return schedule(
        config["in_features"],
        config["in_proj_features"],
        config["out_features"],
        config["width_multiplier"],
        config["dextra_depth"],
        config["max_glt_groups"],
    )


def mix(x0: Tensor, out: Tensor, groups: int) -> Tensor:
    """The input mixer: concat(x0, out), or with g' > 1 their g' chunks interleaved.

    Shape:
        x0 (..., p), out (..., d) -> (..., p + d)
    """
    if groups == 1:
        return torch.cat([x0, out], dim=-1)
    lead = x0.shape[:-1]
    chunks = torch.cat(  # (..., g', p/g' + d/g'): [x0_i, out_i] per chunk i
        [x0.reshape(*lead, groups, -1), out.reshape(*lead, groups, -1)], dim=-1
    )
    return chunks.reshape(*lead, -1)


def dextra(x: Tensor, sd: Recorded, prefix: str, config: Mapping) -> Tensor:
    """The official ``DExTraUnit`` (``input_layer``, ``dextra_layers.<l>``, ``output_layer``).

    Shape:
        (..., in_features) -> (..., out_features)
    """
    groups, ins, outs = dextra_schedule(config)
    x0 = linear_ln_swish(x, sd, f"{prefix}input_layer.")  # (..., p)
    h = x0
    for i, g in enumerate(groups):
        layer = f"{prefix}dextra_layers.{i}."
        # the tensors must have the README schedule's shape, not merely one that runs
        assert sd[f"{layer}weights"].shape == (g, ins[i] // g, outs[i] // g)
        out = glt(h, sd, layer, g, shuffle=True, norm=True, act=True)
        h = mix(x0, out, groups[i + 1] if i + 1 < len(groups) else 1)  # (..., p + out_i)
    return linear_ln_swish(h, sd, f"{prefix}output_layer.")


# --- README "DeLighT block" ----------------------------------------------------------------------


def attention(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, attn_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Single-head attention, q already scaled.

    Shape:
        q (T, B, d_o), k and v (S, B, d_o), key_padding_mask (B, S) True = pad, attn_mask (T, S)
        additive -> (T, B, d_o) and the probabilities (B, T, S)
    """
    scores = torch.einsum("tbd,sbd->bts", q, k)
    if attn_mask is not None:
        scores = scores + attn_mask
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bts,sbd->tbd", probs, v), probs


def sublayer(
    x: Tensor, sd: Recorded, norm: str, pre_norm: bool, branch: Callable[[Tensor], Tensor]
) -> Tensor:
    """Residual around ``branch`` with LayerNorm ``norm`` after the sum or, pre-norm, before it."""
    weight, bias = sd[f"{norm}.weight"], sd[f"{norm}.bias"]
    y = x + branch(layer_norm(x, weight, bias) if pre_norm else x)
    return y if pre_norm else layer_norm(y, weight, bias)


def block_dextra_config(config: Mapping) -> dict:
    """The DExTra arguments of a block: in = d_m, p = o = d_o."""
    d_o = config["proj_dim(d_o)"]
    return {
        "in_features": config["embed_dim"],
        "in_proj_features": d_o,
        "out_features": d_o,
        "width_multiplier": config["width_multiplier"],
        "dextra_depth": config["dextra_depth"],
        "max_glt_groups": config["max_glt_groups"],
    }


def self_attention(
    x: Tensor,
    sd: Recorded,
    dextra_prefix: str,
    config: Mapping,
    padding_mask: Tensor | None,
    attn_mask: Tensor | None,
) -> Tensor:
    """DExTra (d_m -> d_o), q/k/v split in that order from ``linear_kqv``, out_proj to d_m."""
    d_o = config["proj_dim(d_o)"]
    h = dextra(x, sd, dextra_prefix, block_dextra_config(config))  # (T, B, d_o)
    q, k, v = linear(h, sd, "self_attn.linear_kqv.").split(d_o, dim=-1)
    h, _ = attention(q * d_o**-0.5, k, v, padding_mask, attn_mask)
    return linear(h, sd, "self_attn.out_proj.")


def light_ffn(x: Tensor, sd: Recorded) -> Tensor:
    return linear(swish(linear(x, sd, "fc1.")), sd, "fc2.")


def encoder_layer(x: Tensor, sd: Recorded, config: Mapping, padding_mask: Tensor | None) -> Tensor:
    """The official ``DeLighTTransformerEncoderLayer``.

    Shape:
        x (S, B, d_m), padding_mask (B, S) True = pad -> (S, B, d_m)
    """
    pre = config["normalize_before"]
    x = sublayer(
        x,
        sd,
        "self_attn_layer_norm",
        pre,
        lambda h: self_attention(h, sd, "dextra_layer.", config, padding_mask, None),
    )
    return sublayer(x, sd, "final_layer_norm", pre, lambda h: light_ffn(h, sd))


def decoder_layer(
    x: Tensor,
    sd: Recorded,
    config: Mapping,
    encoder_out: Tensor | None,
    encoder_padding_mask: Tensor | None,
    self_attn_mask: Tensor,
) -> tuple[Tensor, Tensor | None]:
    """The official ``DeLighTTransformerDecoderLayer``; no padding mask on its self-attention.

    Shape:
        x (T, B, d_m), encoder_out (S, B, d_m), encoder_padding_mask (B, S), self_attn_mask (T, T)
        additive -> (T, B, d_m) and the encoder-attention probabilities (T, B, S)
    """
    pre, d_o = config["normalize_before"], config["proj_dim(d_o)"]
    x = sublayer(
        x,
        sd,
        "self_attn_layer_norm",
        pre,
        lambda h: self_attention(h, sd, "dextra_layer_sa.", config, None, self_attn_mask),
    )
    probs = None
    if not config["no_encoder_attn"]:

        def encoder_attention(h: Tensor) -> Tensor:
            nonlocal probs
            # the query is the d_m residual stream itself, no DExTra
            q = linear(h, sd, "encoder_attn.linear_q.") * d_o**-0.5
            k, v = linear(encoder_out, sd, "encoder_attn.linear_kv.").split(d_o, dim=-1)
            h, probs = attention(q, k, v, encoder_padding_mask, None)
            return linear(h, sd, "encoder_attn.out_proj.")

        x = sublayer(x, sd, "encoder_attn_layer_norm", pre, encoder_attention)
        probs = probs.permute(1, 0, 2)  # (T, B, S)
    return sublayer(x, sd, "final_layer_norm", pre, lambda h: light_ffn(h, sd)), probs


class Prefixed:
    """The tensors under ``prefix`` of a :class:`Recorded` dict, read through it."""

    def __init__(self, sd: Recorded, prefix: str) -> None:
        self.sd, self.prefix = sd, prefix

    def __getitem__(self, name: str) -> Tensor:
        return self.sd[f"{self.prefix}{name}"]


# --- README "Model level" ------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """An official MT model: d_m, the lookup width, N_min -> N_max (B = N_max blocks), w_m."""

    d_m: int
    lut_dim: int
    n_min: int
    n_max: int
    w_m: float

    @property
    def max_groups(self) -> int:
        return 2 ** math.ceil(math.log2(self.d_m // 32))

    def blocks(self) -> list[dict]:
        """Each block's official layer config, block-wise scaled (B = N_max)."""
        depths = np.linspace(self.n_min, self.n_max, self.n_max).astype(int)  # floor
        widths = np.round(
            np.linspace(self.w_m, self.w_m + self.n_max / self.n_min - 1, self.n_max), 3
        )
        return [
            {
                "embed_dim": self.d_m,
                "proj_dim(d_o)": self.d_m // 2,
                "width_multiplier": float(w),
                "dextra_depth": int(n),
                "max_glt_groups": self.max_groups,
                "normalize_before": False,  # MT is post-norm
                "no_encoder_attn": False,
            }
            for n, w in zip(depths, widths, strict=True)
        ]


def fairseq_positions(tokens: Tensor, dim: int) -> Tensor:
    """fairseq's ``make_positions`` + ``SinusoidalPositionalEmbedding``: non-pads numbered
    ``PADDING_IDX + 1, ...``, pads at ``PADDING_IDX`` whose row is zero.

    Shape:
        (B, T) -> (B, T, dim) float64
    """
    keep = tokens.ne(PADDING_IDX)
    positions = torch.cumsum(keep, dim=1) * keep + PADDING_IDX  # (B, T)
    half = dim // 2
    # fairseq's get_embedding builds the table in float32; a float64 model adds these values
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(int(positions.max()) + 1, dtype=torch.float32)[:, None] * freq[None]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # (num, dim)
    table[PADDING_IDX] = 0
    return table[positions].double()


def embed(tokens: Tensor, sd: Recorded, prefix: str, model: ModelConfig) -> Tensor:
    """``DExTraEmb`` + positions: lookup * sqrt(lut_dim) -> DExTra(lut_dim, d_m/2, d_m, w_m, N_min).

    Shape:
        (B, T) -> (T, B, d_m)
    """
    x = sd[f"{prefix}map_layer.weight"][tokens] * math.sqrt(model.lut_dim)  # (B, T, lut_dim)
    config = {
        "in_features": model.lut_dim,
        "in_proj_features": model.d_m // 2,
        "out_features": model.d_m,
        "width_multiplier": model.w_m,
        "dextra_depth": model.n_min,
        "max_glt_groups": model.max_groups,
    }
    x = dextra(x, sd, f"{prefix}dextra_layer.", config) + fairseq_positions(tokens, model.d_m)
    return x.transpose(0, 1)


def translation_logits(
    sd: Recorded, model: ModelConfig, src_tokens: Tensor, prev_output_tokens: Tensor
) -> Tensor:
    """The official ``delight_transformer`` (post-norm, tied output) on a teacher-forced batch.

    Shape:
        src_tokens (B, S), prev_output_tokens (B, T) -> logits (B, T, V_tgt)
    """
    src_padding_mask = src_tokens.eq(PADDING_IDX)  # (B, S)
    x = embed(src_tokens, sd, "encoder.embed_tokens.", model)  # (S, B, d_m)
    for b, config in enumerate(model.blocks()):
        x = encoder_layer(x, Prefixed(sd, f"encoder.layers.{b}."), config, src_padding_mask)
    encoder_out = x
    x = embed(prev_output_tokens, sd, "decoder.embed_tokens.", model)  # (T, B, d_m)
    t = len(x)
    causal = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)
    for b, config in enumerate(model.blocks()):
        block = Prefixed(sd, f"decoder.layers.{b}.")
        x, _ = decoder_layer(x, block, config, encoder_out, src_padding_mask, causal)
    x = x.transpose(0, 1)  # (B, T, d_m)
    if model.d_m != model.lut_dim:
        x = linear(x, sd, "decoder.project_out_dim.", bias=False)  # (B, T, lut_dim)
    return x @ sd["decoder.embed_tokens.map_layer.weight"].T  # tied: (B, T, V_tgt)


# --- step 1: the reference reproduces the official fixtures --------------------------------------


def _as_float64(value: Tensor | None) -> Tensor | None:
    return value.double() if value is not None and value.is_floating_point() else value


def _check_schedule(config: Mapping, layers: Mapping) -> None:
    groups, ins, outs = dextra_schedule(config)
    assert groups == layers["groups_per_layer"]
    assert [(layer["in"], layer["out"]) for layer in layers["glt_layers"]] == list(
        zip(ins, outs, strict=True)
    )


@pytest.mark.parametrize("path", fixtures("delight", "glt_*.pt"))
def test_reference_glt_matches_official(path: Path) -> None:
    data = load(path)
    config, sd = data["config"], Recorded(data["state_dict"])
    assert config["norm_type"] in (None, "ln") and config["act_type"] in (None, "swish")
    y = glt(
        data["input"].double(),
        sd,
        "",
        config["n_groups"],
        shuffle=config["use_shuffle"],
        norm=config["norm_type"] == "ln",
        act=config["act_type"] == "swish",
    )
    assert sd.read == set(sd)
    assert (y - data["output_float64"]).abs().max().item() <= FIXTURE_TOLERANCE


@pytest.mark.parametrize("path", fixtures("delight", "dextra_*.pt"))
def test_reference_dextra_matches_official(path: Path) -> None:
    data = load(path)
    config, sd = data["config"], Recorded(data["state_dict"])
    _check_schedule(config, config)
    y = dextra(data["input"].double(), sd, "", config)
    assert sd.read == set(sd)
    assert (y - data["output_float64"]).abs().max().item() <= FIXTURE_TOLERANCE


@pytest.mark.parametrize("path", fixtures("delight", "dextra_config_table.json"))
def test_reference_schedule_matches_official_table(path: Path) -> None:
    rows = json.loads(path.read_text())["rows"]
    assert rows
    for row in rows:
        args = ("in_features", "in_proj_features", "out_features", "width_multiplier")
        plan = schedule(*(row[a] for a in args), row["N"], row["max_groups"])
        assert plan == (row["groups"], row["glt_in"], row["glt_out"]), row


@pytest.mark.parametrize("path", fixtures("delight", "encoder_layer_*.pt"))
def test_reference_encoder_layer_matches_official(path: Path) -> None:
    data = load(path)
    config, sd, inputs = data["config"], Recorded(data["state_dict"]), data["input"]
    _check_schedule(block_dextra_config(config), config["dextra"])
    y = encoder_layer(
        inputs["x"].double(), sd, config, inputs.get("encoder_padding_mask")
    )  # (S, B, d_m)
    assert sd.read == set(sd)
    assert (y - data["output_float64"]).abs().max().item() <= FIXTURE_TOLERANCE


@pytest.mark.parametrize("path", fixtures("delight", "decoder_layer_*.pt"))
def test_reference_decoder_layer_matches_official(path: Path) -> None:
    data = load(path)
    config, sd, inputs = data["config"], Recorded(data["state_dict"]), data["input"]
    _check_schedule(block_dextra_config(config), config["dextra"])
    y, probs = decoder_layer(
        inputs["x"].double(),
        sd,
        config,
        _as_float64(inputs.get("encoder_out")),
        inputs.get("encoder_padding_mask"),
        inputs["self_attn_mask"].double(),
    )
    assert sd.read == set(sd)
    expected = data["output_float64"]
    if isinstance(expected, dict):  # with encoder attention: x and its probabilities (T, B, S)
        assert (probs - expected["encoder_attn_weights"]).abs().max().item() <= FIXTURE_TOLERANCE
        expected = expected["x"]
    else:
        assert probs is None
    assert (y - expected).abs().max().item() <= FIXTURE_TOLERANCE


# --- step 2: our whole model against the reference -----------------------------------------------

# N_min -> N_max: odd and even DExTra depths, six blocks a side, widths w_m .. w_m + 1
N_MIN, N_MAX = 3, 6
# 128: the official MT lookup (no projection, d_m = 128); 64: the embedding fixture's layout,
# which adds the bias-free projection d_m -> 64 and scales the lookup by sqrt(64)
LUT_DIMS = (128, 64)
SRC_VOCAB, TGT_VOCAB = 23, 29
B, S, T = 3, 7, 6
SRC_LENGTHS = {"unpadded": [S, S, S], "right-padded": [S, 5, 3], "left-padded": [S, 5, 3]}
TGT_LENGTHS = [T, 4, 5]  # prev_output_tokens, right-padded as fairseq batches them

# our parameter names -> the official ones, applied in order
RENAMES = (
    (r"^(en|de)coder_embedding\.lookup\.", r"\1coder.embed_tokens.map_layer."),
    (r"^(en|de)coder_embedding\.dextra\.", r"\1coder.embed_tokens.dextra_layer."),
    (r"^encoder_blocks\.(\d+)\.dextra\.", r"encoder.layers.\1.dextra_layer."),
    (r"^decoder_blocks\.(\d+)\.dextra\.", r"decoder.layers.\1.dextra_layer_sa."),
    (r"^(en|de)coder_blocks\.", r"\1coder.layers."),
    (r"^project_out\.", "decoder.project_out_dim."),
    (r"\.(input|output)_norm\.", r".\1_layer.normalization_fn."),
    (r"\.glt_norms\.(\d+)\.", r".dextra_layers.\1.normalization_fn."),
    (r"\.glts\.(\d+)\.", r".dextra_layers.\1."),
    (r"\.qkv_proj\.", ".linear_kqv."),
    (r"\.q_proj\.", ".linear_q."),
    (r"\.kv_proj\.", ".linear_kv."),
    (r"\.(self_attn|encoder_attn)_norm\.", r".\1_layer_norm."),
    (r"\.final_norm\.", ".final_layer_norm."),
    # the official Linear and GroupLinear call their weight "weights"; LayerNorms and lookups don't
    (r"^(?!.*(normalization_fn|layer_norm|map_layer)\.)(.*)\.weight$", r"\2.weights"),
)


def official_state_dict(model: DeLighTEncoderDecoder) -> dict[str, Tensor]:
    """Our state dict under the official names and layouts."""
    official = {}
    for name, tensor in model.state_dict().items():
        for pattern, replacement in RENAMES:
            name = re.sub(pattern, replacement, name)
        if re.search(r"\.dextra_layers\.\d+\.bias$", name):
            tensor = tensor.unsqueeze(1)  # GroupLinear bias (g, out/g) -> (g, 1, out/g)
        assert name not in official, name
        official[name] = tensor
    return official


def randomise(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Non-trivial parameters, as the fixtures have: biases N(0, 0.1), LayerNorm weights
    1 + N(0, 0.1), other weights N(0, 1 / fan_in) (a lookup's fan-in is its width)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
            if name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif "norm" in name:
                p.copy_(1 + 0.1 * noise)
            else:  # GroupLinear (g, in/g, out/g), Linear (out, in), lookup (V, dim)
                p.copy_(noise * p.shape[-2 if p.dim() == 3 else -1] ** -0.5)


def _tokens(
    lengths: list[int], width: int, vocab: int, generator: torch.Generator, *, left: bool
) -> Tensor:
    """Random non-pad ids, then pads (before them when ``left``).

    Shape:
        -> (len(lengths), width) int64
    """
    tokens = torch.randint(PADDING_IDX + 1, vocab, (len(lengths), width), generator=generator)
    pad = torch.arange(width) >= torch.tensor(lengths)[:, None]  # (B, width), right padding
    return tokens.masked_fill(pad.flip(1) if left else pad, PADDING_IDX)


def _model_params() -> list:
    """pytest params: d_m and w_m of each official encoder-block fixture, for each LUT width."""
    params = []
    for path in fixtures("delight", "encoder_layer_*.pt"):
        (fixture,) = path.values
        for lut in LUT_DIMS:
            params.append(pytest.param(fixture, lut, id=f"{path.id}-lut{lut}", marks=path.marks))
    return params


def _run(fixture: Path, lut_dim: int, src_padding: str) -> tuple[Tensor, Tensor, Tensor]:
    """Our logits, the reference's, and which target positions are not padding (B, T)."""
    block = load(fixture)["config"]
    config = ModelConfig(block["embed_dim"], lut_dim, N_MIN, N_MAX, block["width_multiplier"])
    # the README's g_max rule, anchored to the fixture's
    assert config.max_groups == block["max_glt_groups"]
    generator = torch.Generator().manual_seed(0)
    model = DeLighTEncoderDecoder(
        SRC_VOCAB,
        TGT_VOCAB,
        d_model=config.d_m,
        n_min=N_MIN,
        n_max=N_MAX,
        width_multiplier=config.w_m,
        embedding_dim=lut_dim,
        padding_idx=PADDING_IDX,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        ffn_dropout=0.0,
        dextra_dropout=0.0,
        embedding_dropout=0.0,
        position_dropout=0.0,
    )
    model = model.double().eval()
    randomise(model, generator)
    left = src_padding == "left-padded"
    src = _tokens(SRC_LENGTHS[src_padding], S, SRC_VOCAB, generator, left=left)
    tgt = _tokens(TGT_LENGTHS, T, TGT_VOCAB, generator, left=False)
    sd = Recorded(official_state_dict(model))
    with torch.no_grad():
        ours = model(src, None, tgt)  # (B, T, V_tgt)
        reference = translation_logits(sd, config, src, tgt)
    assert sd.read == set(sd)  # every parameter of ours has an official counterpart that is used
    assert ours.shape == reference.shape == (B, T, TGT_VOCAB)
    return ours, reference, tgt.ne(PADDING_IDX)


@pytest.mark.parametrize("src_padding", list(SRC_LENGTHS))
@pytest.mark.parametrize(("fixture", "lut_dim"), _model_params())
def test_model_matches_reference(fixture: Path, lut_dim: int, src_padding: str) -> None:
    """Logits and log-probabilities at every target position that is not padding."""
    ours, reference, keep = _run(fixture, lut_dim, src_padding)
    assert (ours[keep] - reference[keep]).abs().max().item() <= MODEL_TOLERANCE
    log_probs = torch.log_softmax(ours, dim=-1)[keep]
    expected = torch.log_softmax(reference, dim=-1)[keep]
    assert (log_probs - expected).abs().max().item() <= MODEL_TOLERANCE


@pytest.mark.parametrize(("fixture", "lut_dim"), _model_params())
def test_padded_target_positions_match_reference(fixture: Path, lut_dim: int) -> None:
    """At padded target positions too: the official decoder's self-attention has only the
    causal mask, no target padding mask."""
    ours, reference, keep = _run(fixture, lut_dim, "right-padded")
    assert (ours[~keep] - reference[~keep]).abs().max().item() <= MODEL_TOLERANCE
