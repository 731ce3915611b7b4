"""``benchmarks/launches.py``: the kernel launches of a DExTra unit's forward and backward on each
path, counted on the CPU."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")

from benchmarks.launches import main  # noqa: E402


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter")
def test_dextra_launches_per_path(capsys: pytest.CaptureFixture[str]) -> None:
    reference, triton = main(["--only", "dextra", "--tokens", "40"])
    assert [reference["path"], triton["path"]] == ["reference", "triton"]
    assert reference["triton"] == 0 and reference["ratio"] == 1.0
    # N = 8 GLTs: x0's norm and each GLT's norm with its swish, forward and backward, plus the
    # output LayerNorm and swish, which stay PyTorch's
    assert reference["top_aten"]["native_layer_norm"] == 10
    assert reference["top_aten"]["silu"] == 10
    assert triton["top_aten"]["native_layer_norm"] == 1
    assert triton["top_aten"]["silu"] == 1
    # dropout after each swish, as CUDA runs it (one kernel forward, one backward), except where
    # the fused norm draws it
    assert reference["top_aten"]["native_dropout"] == 10
    assert triton["top_aten"]["native_dropout"] == 1
    assert triton["launches"] < reference["launches"]
    assert triton["ratio"] == round(triton["launches"] / reference["launches"], 3)
    table = capsys.readouterr().out
    assert f"dextra           triton     {triton['aten']:7d} {triton['triton']:7d}" in table
