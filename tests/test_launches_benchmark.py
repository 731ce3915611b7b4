"""``benchmarks/launches.py``: the kernel launches of a DExTra unit's forward and backward on each
path, counted on the CPU."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("triton")

from benchmarks.launches import main, pair_rows


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter")
def test_dextra_launches_per_path(capsys: pytest.CaptureFixture[str]) -> None:
    reference, triton = main(["--only", "dextra", "--tokens", "40"])
    assert [reference["path"], triton["path"]] == ["reference", "triton"]
    assert reference["triton"] == 0 and reference["ratio"] == 1.0
    # N = 8 GLTs: x0's norm, each GLT's norm and the output norm, each with its swish and dropout
    # (counted as CUDA runs it: one kernel forward, one backward); the kernel path fuses all three
    # of each into one launch each way
    assert reference["ops"]["native_layer_norm"] == 10
    assert reference["ops"]["silu"] == 10
    assert reference["ops"]["native_dropout"] == 10
    assert not {"native_layer_norm", "silu", "native_dropout"} & set(triton["ops"])
    # the input and output layers run on the GLT kernel as one group, the output layer reading
    # x0 and y in place: no product or concatenation of PyTorch's left
    assert reference["ops"]["cat"] == 1 and reference["ops"]["addmm"] == 2
    assert not {"cat", "addmm", "mm", "bmm"} & set(triton["ops"])
    assert triton["launches"] < reference["launches"]
    assert triton["ratio"] == round(triton["launches"] / reference["launches"], 3)
    table = capsys.readouterr().out
    assert f"dextra           triton     {triton['aten']:7d} {triton['triton']:7d}" in table


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter")
def test_bfloat16_launches_cast_as_cuda_autocast(capsys: pytest.CaptureFixture[str]) -> None:
    reference, triton = main(["--only", "dextra", "--tokens", "40", "--dtype", "bfloat16"])
    assert reference["dtype"] == triton["dtype"] == "bfloat16"
    # CUDA's autocast runs layer_norm in float32: the PyTorch path casts each of its ten norms'
    # bf16 inputs up (and the next products cast them back), each cast with its backward
    assert reference["ops"]["_to_copy"] >= 4 * 10
    # the GLT kernel rounds the float32 weights as it loads them: none of the 8 GLTs' weights is
    # cast, forward or backward
    assert reference["ops"]["_to_copy"] - triton["ops"].get("_to_copy", 0) >= 2 * 8
    assert triton["launches"] < reference["launches"]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter")
def test_fused_attention_counts_as_one_launch_each_way(capsys: pytest.CaptureFixture[str]) -> None:
    reference, _ = main(["--only", "transformer_mt", "--tokens", "32"])
    # 6 encoder self-attentions, 6 decoder self- and 6 encoder-decoder attentions
    assert reference["ops"]["fused_attention"] == 18
    assert reference["ops"]["fused_attention_backward"] == 18
    assert "_safe_softmax" not in reference["ops"] and "bmm" not in reference["ops"]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter")
def test_cudnn_lstm_counts_as_its_kernels_and_pairs_meet_targets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = main(["--only", "awd_pru", "awd_lstm", "--bptt", "4"])
    lstm = next(r for r in rows if r["entry"] == "awd_lstm" and r["path"] == "triton")
    # 3 layers, T = 4: forward 1 + 2T a layer, backward 2T + 3; none of the CPU's per-step
    # decomposition is counted
    assert lstm["ops"]["cudnn_lstm"] == 3 * (1 + 2 * 4)
    assert lstm["ops"]["cudnn_lstm_backward"] == 3 * (2 * 4 + 3)
    assert not {"sigmoid", "tanh", "sigmoid_backward"} & set(lstm["ops"])
    out = capsys.readouterr().out
    pair = next(json.loads(line) for line in out.splitlines()
                if line.startswith("{") and '"baseline": "awd_lstm"' in line)  # fmt: skip
    pru = next(r for r in rows if r["entry"] == "awd_pru" and r["path"] == "triton")
    assert pair["launches"] == pru["launches"] and pair["baseline_launches"] == lstm["launches"]
    assert pair["ratio"] == round(pru["launches"] / lstm["launches"], 3) and pair["target"] == 1.0
    assert pair["met"] == (pair["ratio"] <= 1.0)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter")
def test_text_systems_meet_their_launch_targets(capsys: pytest.CaptureFixture[str]) -> None:
    # a bfloat16 training step of each system on its kernels against its baseline's (TARGETS):
    # DeLighT MT <= 1.2x the Transformer, Group-Transformer <= 1.0x Transformer-XL
    rows = main(["--only", "delight_mt", "transformer_mt", "gt4", "txl", "--dtype", "bfloat16"])
    pairs = pair_rows(rows)
    assert {(p["entry"], p["baseline"]) for p in pairs} == {
        ("delight_mt", "transformer_mt"),
        ("gt4", "txl"),
    }
    for pair in pairs:
        assert pair["met"], pair
