"""ONNX graphs of the sentence classifiers against eager PyTorch at two batch sizes and lengths."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest
import torch

from src.export.onnx import export_onnx, run_session
from src.export.text import classifier_specs
from src.models.text_classifier import DeLighTClassifier, TransformerClassifier

SMALL = {"num_embeddings": 100, "num_classes": 3, "d_model": 32}
MODELS = {
    "delight": lambda: DeLighTClassifier(**SMALL, block_scaling=True, glt_shuffle=True),
    "transformer": lambda: TransformerClassifier(**SMALL, dim_feedforward=48),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_classifier_logits_match_eager(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    network = MODELS[name]().eval()
    (spec,) = classifier_specs(network)
    export_onnx(spec, tmp_path / "network.onnx")
    sess = ort.InferenceSession(str(tmp_path / "network.onnx"), providers=["CPUExecutionProvider"])
    for batch, length in ((2, 8), (4, 11)):
        tokens = torch.randint(2, 100, (batch, length))
        tokens[1, length - 3 :] = network.padding_idx  # right padding
        with torch.no_grad():
            eager = network(tokens)
        (onnx,) = run_session(sess, spec.input_names, (tokens, tokens.eq(network.padding_idx)))
        assert onnx.shape == (batch, 3)
        assert float((eager - onnx).abs().max()) <= 1e-4
