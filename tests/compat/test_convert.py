"""``python -m src.compat.convert``: official weights become a checkpoint of this project that the
commands rebuild from alone (``build_from_checkpoint``, as eval.py, predict.py and generate.py do).

Official files: the EdgeNets segmentation releases and the whole ``MemTransformerLM`` fixtures under
``$REFERENCE_DIR`` (tests skip without them); a PRU ``RNNModel`` and a fairseq DeLighT translation
checkpoint made from networks of ours (:mod:`tests.compat.official_files`) with one layer's tensors
replaced by an official fixture's. The command runs in this process (:func:`convert_here`), once as
a subprocess.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from src.build import build_from_checkpoint
from src.commands.generate import generate
from src.compat import load_official
from src.compat.convert import main
from src.models.awd_lm import AWDLanguageModel
from src.models.delight_lm import DeLighTLanguageModel
from src.models.delight_mt import DeLighTEncoderDecoder
from src.models.segmentation import dicenet_segmentation, espnetv2_segmentation
from tests.compat.official_files import (
    awd_official_state,
    delight_block_official,
    delight_lm_official_state,
    delight_mt_args,
    delight_mt_official_state,
    pru_layer_state,
)
from tests.conftest import ROOT, compose_config
from tests.parity.reference import fixtures, load, reference_dir
from tests.parity.test_edgenets_segmentation import WEIGHTS_NAME, weights_for

BUILDERS = {"dicenet": dicenet_segmentation, "espnetv2": espnetv2_segmentation}
DATA = {"pascal": "voc_seg", "city": "cityscapes"}
# the fast subset of the official files (the smallest width of each network); the rest is heavy
FAST = {"dicenet_s_0.2_pascal_256x256", "espnetv2_s_0.5_city_512x256"}
# tests/parity's tolerances: segmentation logits stored in fp16, MemTransformerLM and layers in fp32
SEG_LOGITS_ATOL, SEG_MASK_AGREEMENT, SEG_MEANS_ATOL = 2e-2, 0.999, 1e-4
FLOAT32_ATOL = 1e-5


@pytest.fixture(autouse=True)
def _native_cpu_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN builds a primitive per new convolution shape (tests/parity: seconds vs.
    tens of ms)."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def convert_here(capsys: pytest.CaptureFixture, weights: Path, *arguments: str) -> str:
    """stdout of ``python -m src.compat.convert weights *arguments``, run in this process."""
    capsys.readouterr()
    assert main([str(weights), *arguments]) == 0
    return capsys.readouterr().out


def rebuilt(checkpoint: Path, *overrides: str, config: str = "eval") -> nn.Module:
    """The network ``<config>.py ckpt_path=<checkpoint>`` rebuilds, in eval mode."""
    cfg = compose_config(config, [f"ckpt_path={checkpoint}", *overrides])
    _, task = build_from_checkpoint(cfg)
    return task.net.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def marked(params: list, fast: set[str]) -> list:
    """``params`` with those outside ``fast`` marked heavy."""
    out = []
    for param in params:
        path = param.values[0]
        if path is not None and WEIGHTS_NAME.search(path.stem).group(0) not in fast:
            param = pytest.param(path, id=param.id, marks=pytest.mark.heavy)
        out.append(param)
    return out


# -- EdgeNets --------------------------------------------------------------------------------------


def convert_edgenets(capsys: pytest.CaptureFixture, weights: Path, out: Path) -> str:
    match = WEIGHTS_NAME.fullmatch(weights.stem)
    family, scale, dataset = match.group(1), match.group(2), match.group(3)
    return convert_here(
        capsys, weights, "family=edgenets", f"model={family}_seg", f"data={DATA[dataset]}",
        f"model.scale={scale}", f"out={out}",
    )  # fmt: skip


@pytest.mark.parametrize(
    "fixture",
    marked([p for p in fixtures("edgenets", "seg_*/*.npz") if "demo_style" not in p.id], FAST),
)
def test_segmentation_checkpoint_reproduces_official_outputs(
    fixture: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The converted PASCAL release, rebuilt from the checkpoint alone, holds the tensors of a
    direct ``load_official`` and gives the official outputs (tests/parity's tolerances) on the
    images with stored logits (all six images' masks and means under ``-m heavy``)."""
    family, scale, weights = weights_for(fixture)
    out = tmp_path / "converted.ckpt"
    printed = convert_edgenets(capsys, weights, out)
    assert f"wrote {out}" in printed and f"python predict.py ckpt_path={out}" in printed
    net = rebuilt(out)
    data = np.load(fixture)
    direct = BUILDERS[family](scale, data["logits"].shape[1])
    load_official(direct, weights)
    assert_same_state(net, direct)
    heavy = WEIGHTS_NAME.search(fixture.stem).group(0) not in FAST
    k = len(data["input"]) if heavy else len(data["logits_image_index"])
    with torch.no_grad():
        logits = net(torch.from_numpy(data["input"][:k]))
    assert (logits.argmax(1).numpy() == data["mask"][:k]).mean() >= SEG_MASK_AGREEMENT
    stored = len(data["logits_image_index"])
    reference = torch.from_numpy(data["logits"].astype(np.float32))
    assert max_diff(logits[:stored], reference) <= SEG_LOGITS_ATOL
    means = logits.double().mean(dim=(2, 3)).numpy()
    np.testing.assert_allclose(
        means, data["logits_mean_per_class_fp64"][:k], rtol=0, atol=SEG_MEANS_ATOL
    )


def assert_same_state(net: nn.Module, direct: nn.Module) -> None:
    state = net.state_dict()
    assert state.keys() == direct.state_dict().keys()
    for key, value in direct.state_dict().items():
        assert torch.equal(state[key], value), key


@pytest.mark.parametrize("weights", marked(fixtures("edgenets", "weights/*_city_*.pth"), FAST))
def test_cityscapes_checkpoint_holds_the_release(
    weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """No outputs are stored for the Cityscapes releases: the rebuilt network's state equals a
    direct ``load_official`` of the same file (20 classes, data=cityscapes)."""
    out = tmp_path / "converted.ckpt"
    convert_edgenets(capsys, weights, out)
    net = rebuilt(out)
    match = WEIGHTS_NAME.fullmatch(weights.stem)
    direct = BUILDERS[match.group(1)](float(match.group(2)), 20)
    load_official(direct, weights)
    assert_same_state(net, direct)


def test_a_mismatch_names_the_key_and_the_override(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (param,) = fixtures("edgenets", "weights/dicenet_s_0.2_pascal_256x256.pth")
    if param.values[0] is None:
        pytest.skip("no EdgeNets release")
    weights, out = param.values[0], tmp_path / "x.ckpt"
    arguments = [
        str(weights),
        "family=edgenets",
        "model=dicenet_seg",
        f"out={out}",
        "model.scale=0.2",
    ]
    with pytest.raises(SystemExit):
        main([*arguments, "data=cityscapes"])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "num_classes=21 in the file, 20 composed; pass data.num_classes=21" in message
    with pytest.raises(SystemExit):
        main([*arguments, "data=voc_seg", "family=pru"])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "family=pru does not convert to EdgeNetsSegmentation" in message
    assert "family=edgenets converts to it" in message
    with pytest.raises(SystemExit):
        main([*arguments, "data=voc_seg", "model.scale=0.5"])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(weights) in message and "do not fit EdgeNetsSegmentation" in message
    assert not out.exists()


def test_unknown_family_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path / "none.pth"), "family=fairseq", f"out={tmp_path / 'x.ckpt'}"])
    message = capsys.readouterr().err.strip()
    assert message == (
        "error: family=fairseq is not one of ['delight', 'edgenets', 'group_transformer', 'pru']"
    )
    with pytest.raises(SystemExit):
        main([str(tmp_path / "none.pth"), "family=pru", f"out={tmp_path / 'x.ckpt'}"])
    assert f"official weights {tmp_path / 'none.pth'}: no such file" in capsys.readouterr().err


# -- Transformer-XL and Group-Transformer ----------------------------------------------------------


def mem_transformer_overrides(config: dict) -> list[str]:
    """The command line that composes the network of an official ``MemTransformerLM`` config."""
    group = config.get("model_type") == "group"
    overrides = [f"model={'group_transformer' if group else 'transformer_xl'}", "data=text8"]
    overrides += [
        f"model.{key}={config[key]}"
        for key in ("n_layer", "d_model", "n_head", "d_inner", "mem_len")
    ]
    overrides += [f"data.vocab_size={config['n_token']}", f"data.tgt_len={config['tgt_len']}"]
    overrides.append(f"model.tie_weight={str(config['tie_weight']).lower()}")
    if group:
        return [*overrides, f"model.n_group={config['n_group']}"]
    return [*overrides, f"model.pre_norm={str(config['pre_lnorm']).lower()}"]


MEM_TRANSFORMERS = fixtures("group_transformer", "gt_tiny_model_*.pt") + fixtures(
    "group_transformer", "txl_tiny_model_*.pt"
)


@pytest.mark.parametrize("path", MEM_TRANSFORMERS)
def test_mem_transformer_checkpoint_reproduces_official_segments(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The fixture file as it is (config + state_dict), converted and rebuilt from the checkpoint
    alone, gives the official logits over the three segments, carrying the memories."""
    fx = load(path)
    out = tmp_path / "converted.ckpt"
    convert_here(
        capsys,
        path,
        "family=group_transformer",
        *mem_transformer_overrides(fx["config"]),
        f"out={out}",
    )
    net = rebuilt(out)
    memories = None
    with torch.no_grad():
        for segment in fx["segments"]:
            logits, memories = net(segment["input"].t(), memories)  # (len, bsz) -> (B, T)
            assert max_diff(logits, segment["logits"].transpose(0, 1)) <= FLOAT32_ATOL
            loss = F.cross_entropy(logits.transpose(1, 2), segment["target"].t(), reduction="none")
            assert max_diff(loss, segment["loss"].t()) <= FLOAT32_ATOL


def test_mem_transformer_sizes_are_checked_against_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (param,) = fixtures("group_transformer", "gt_tiny_model_G2.pt")
    if param.values[0] is None:
        pytest.skip("no Group-Transformer fixture")
    path = param.values[0]
    overrides = [
        o
        for o in mem_transformer_overrides(load(path)["config"])
        if not o.startswith(("model.d_model", "data.tgt_len"))
    ]
    with pytest.raises(SystemExit):
        main([str(path), "family=group_transformer", *overrides, f"out={tmp_path / 'x.ckpt'}"])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "d_model=64 in the file, 256 composed" in message
    assert "tgt_len=8 in the file, 512 composed" in message
    assert message.endswith("pass model.d_model=64 data.tgt_len=8")


def test_generate_runs_from_a_converted_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``generate.py ckpt_path=<converted>``: a character corpus of text8's 27 symbols (within the
    fixture's n_token of 30) under data.root gives the vocabulary; the network is the official
    one."""
    (param,) = fixtures("group_transformer", "gt_tiny_model_G2.pt")
    if param.values[0] is None:
        pytest.skip("no Group-Transformer fixture")
    path = param.values[0]
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    (tmp_path / "text8").write_text(
        "".join(rng.choice(letters, 3000)) + "abcdefghijklmnopqrstuvwxyz "
    )
    data = [f"data.root={tmp_path}", "data.valid_size=300", "data.test_size=300"]
    out = tmp_path / "converted.ckpt"
    printed = convert_here(
        capsys, path, "family=group_transformer",
        *mem_transformer_overrides(load(path)["config"]), *data, f"out={out}",
    )  # fmt: skip
    assert f"python generate.py ckpt_path={out} prompt=" in printed
    capsys.readouterr()
    arguments = [f"ckpt_path={out}", "prompt='the cat sat'", "max_new_chars=12", "seed=1"]
    generate(compose_config("generate", arguments, tmp_path / "generate"))
    text = capsys.readouterr().out
    assert text.startswith("the cat sat") and len(text.rstrip("\n")) == len("the cat sat") + 12


# -- PRU -----------------------------------------------------------------------------------------

# input 32, hidden 64, 4 groups, K 2: layer 0 of the model below
PRU_LAYER = "pru_in32_hid64_g4_K2.pt"
AWD_SIZES = {"embedding_dim": 32, "hidden_size": 64, "num_layers": 2, "groups": 4, "levels": 2}


def test_awd_pru_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An official RNNModel state dict (ours, its first PRU layer the fixture's official layer),
    converted and rebuilt: that layer gives the fixture's outputs, the model the source's."""
    (param,) = fixtures("pru", PRU_LAYER)
    if param.values[0] is None:
        pytest.skip("no PRU fixture")
    fx = load(param.values[0])
    torch.manual_seed(0)
    source = AWDLanguageModel(30, **AWD_SIZES).eval()
    official = awd_official_state(source) | pru_layer_state(0, fx["state_dict"])
    load_official(source, official)
    weights, out = tmp_path / "rnn_model.pt", tmp_path / "converted.ckpt"
    torch.save(official, weights)
    sizes = [f"model.{key}={value}" for key, value in AWD_SIZES.items()]
    convert_here(
        capsys,
        weights,
        "family=pru",
        "model=awd_lm",
        "data=ptb",
        "data.vocab_size=30",
        *sizes,
        f"out={out}",
    )
    net = rebuilt(out)
    assert isinstance(net, AWDLanguageModel)
    h0, c0 = fx["hidden_in"]
    tokens = torch.randint(0, 30, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y, (h, c) = net.rnns[0](fx["input"].transpose(0, 1), (h0, c0))  # (T, B, N) -> (B, T, N)
        assert max_diff(y, fx["output"].transpose(0, 1)) <= FLOAT32_ATOL
        assert max_diff(h, fx["hidden_out"][0]) <= FLOAT32_ATOL
        assert max_diff(c, fx["hidden_out"][1]) <= FLOAT32_ATOL
        assert max_diff(net(tokens).logits, source(tokens).logits) == 0.0
    with pytest.raises(SystemExit):  # another family's file
        main(
            [
                str(weights),
                "family=edgenets",
                "model=awd_lm",
                "data=ptb",
                "data.vocab_size=30",
                *sizes,
                f"out={out}",
            ]
        )
    assert "family=edgenets does not convert to AWDLanguageModel" in capsys.readouterr().err


def test_a_file_of_another_layout_names_the_expected_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    weights = tmp_path / "other.pt"
    torch.save({"state_dict": {"fc.weight": torch.zeros(2, 2)}}, weights)
    sizes = [f"model.{key}={value}" for key, value in AWD_SIZES.items()]
    with pytest.raises(SystemExit):
        main(
            [
                str(weights),
                "family=pru",
                "model=awd_lm",
                "data=ptb",
                "data.vocab_size=30",
                *sizes,
                f"out={tmp_path / 'x.ckpt'}",
            ]
        )
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(weights) in message and "'fc.weight'" in message
    assert "expected an RNNModel state dict: encoder.weight, rnns.<l>.pt.pyramid" in message


# -- DeLighT ---------------------------------------------------------------------------------------

VOCAB = 40
# (fixture, side, block-wise scaling that makes block 0 the fixture's (N, w_m)): encoder block 0 and
# decoder block 0 of one model share (N_min, w_m), and the fixtures differ in both ((4, 2.0) vs
# (5, 2.5)), so each is checked in its own model
DELIGHT_LAYERS = [
    (
        "encoder_layer_dm128_N4_wm2_postnorm.pt",
        "encoder",
        {"n_min": 4, "n_max": 5, "width_multiplier": 2.0},
    ),
    (
        "decoder_layer_dm128_N5_wm2p5_postnorm.pt",
        "decoder",
        {"n_min": 5, "n_max": 6, "width_multiplier": 2.5},
    ),
]


@pytest.mark.parametrize(
    ("name", "side", "scaling"), DELIGHT_LAYERS, ids=[s for _, s, _ in DELIGHT_LAYERS]
)
def test_delight_mt_checkpoint(
    name: str, side: str, scaling: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A fairseq DeLighT checkpoint (``args`` + ``model``; ours, its first encoder or decoder layer
    the fixture's official layer), converted and rebuilt: that block gives the fixture's output,
    the whole model the source's logits."""
    path = reference_dir() / "delight" / name
    if not path.is_file():
        pytest.skip(f"no DeLighT fixture {path}")
    fx = load(path)
    torch.manual_seed(0)
    source = DeLighTEncoderDecoder(VOCAB, VOCAB, 128, **scaling, num_blocks=2, padding_idx=1).eval()
    blocks = source.encoder_blocks if side == "encoder" else source.decoder_blocks
    layer = {f"{side}.layers.0.{k}": v for k, v in fx["state_dict"].items()}
    assert layer.keys() == delight_block_official(blocks[0], "", f"{side}.layers.0.", {
        k: v for k, v in blocks[0].state_dict().items()
    }).keys()  # fmt: skip
    official = delight_mt_official_state(source) | layer
    load_official(source, official)
    weights, out = tmp_path / "checkpoint_best.pt", tmp_path / "converted.ckpt"
    torch.save({"args": delight_mt_args(source), "model": official}, weights)
    sizes = [f"model.{key}={value}" for key, value in scaling.items()]
    vocab = [f"data.src_vocab_size={VOCAB}", f"data.tgt_vocab_size={VOCAB}"]
    arguments = [
        "family=delight",
        "model=delight_mt",
        "data=iwslt14_de_en",
        "model.d_model=128",
        *sizes,
        *vocab,
    ]
    with pytest.raises(SystemExit):  # two blocks a side in the file, n_max in the config
        main([str(weights), *arguments, f"out={out}"])
    assert "num_blocks=2 in the file" in capsys.readouterr().err
    printed = convert_here(capsys, weights, *arguments, "+model.num_blocks=2", f"out={out}")
    assert f"python translate.py ckpt_path={out}" in printed
    net = rebuilt(out)
    assert isinstance(net, DeLighTEncoderDecoder)
    inputs = fx["input"]
    with torch.no_grad():
        if side == "encoder":
            y = net.encoder_blocks[0](inputs["x"], inputs["encoder_padding_mask"])
            expected = fx["output"]
        else:
            y, _ = net.decoder_blocks[0](
                inputs["x"], inputs["encoder_out"], inputs["encoder_padding_mask"],
                self_attn_mask=inputs["self_attn_mask"],
            )  # fmt: skip
            expected = fx["output"]["x"]
        assert max_diff(y, expected) <= FLOAT32_ATOL
        generator = torch.Generator().manual_seed(2)
        src, prev = (
            torch.randint(2, VOCAB, (2, 7), generator=generator),
            torch.randint(2, VOCAB, (2, 5), generator=generator),
        )
        assert max_diff(net(src, None, prev), source(src, None, prev)) == 0.0


LM_LAYER = "decoder_layer_lm_dm128_N4_wm2_prenorm.pt"  # pre-norm, no encoder attention
LM_SIZES = {"d_model": 128, "n_min": 4, "n_max": 5, "width_multiplier": 2.0, "num_blocks": 2}


def test_delight_lm_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A fairseq DeLighT language model (adaptive input and tied softmax; ours, its first layer the
    fixture's official layer), converted with its vocabulary read from the file and rebuilt: that
    block gives the fixture's output, the model the source's log-probabilities."""
    path = reference_dir() / "delight" / LM_LAYER
    if not path.is_file():
        pytest.skip(f"no DeLighT fixture {path}")
    fx = load(path)
    torch.manual_seed(0)
    source = DeLighTLanguageModel(300, **LM_SIZES, cutoffs=[100, 200]).eval()
    official = delight_lm_official_state(source)
    official |= {f"decoder.layers.0.{k}": v for k, v in fx["state_dict"].items()}
    load_official(source, official)
    weights, out = tmp_path / "checkpoint_best.pt", tmp_path / "converted.ckpt"
    torch.save({"args": None, "model": official}, weights)
    sizes = [f"model.{key}={value}" for key, value in LM_SIZES.items() if key != "num_blocks"]
    arguments = ["family=delight", "model=delight_lm", "data=wikitext103", *sizes]
    arguments += ["+model.num_blocks=2", "model.cutoffs=[100,200]", f"out={out}"]
    with pytest.raises(SystemExit):
        main([str(weights), *arguments])
    assert (
        "vocab_size=300 in the file, 267744 composed; pass data.vocab_size=300"
        in capsys.readouterr().err
    )
    printed = convert_here(capsys, weights, *arguments, "data.vocab_size=null")
    assert f"python generate.py ckpt_path={out}" in printed
    net = rebuilt(out)
    assert isinstance(net, DeLighTLanguageModel)
    inputs = fx["input"]
    with torch.no_grad():
        y, _ = net.blocks[0](inputs["x"], None, None, self_attn_mask=inputs.get("self_attn_mask"))
        expected = fx["output"]["x"] if isinstance(fx["output"], dict) else fx["output"]
        assert max_diff(y, expected) <= FLOAT32_ATOL
        tokens = torch.randint(2, 300, (2, 9), generator=torch.Generator().manual_seed(3))
        assert max_diff(net.log_prob(tokens), source.log_prob(tokens)) == 0.0


def test_the_command_line(tmp_path: Path) -> None:
    """``python -m src.compat.convert --help`` documents the command."""
    result = subprocess.run(
        [sys.executable, "-m", "src.compat.convert", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "family={edgenets,delight,pru,group_transformer}" in result.stdout
    assert "out=<path.ckpt>" in result.stdout
