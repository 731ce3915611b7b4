"""ONNX graphs of the sentence classifiers against eager PyTorch at two batch sizes and lengths,
run directly and through their runtime (:class:`src.export.runtime.OnnxClassifier`)."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest
import torch

from src.export.metadata import attach_metadata
from src.export.onnx import export_onnx, run_session
from src.export.runtime import OnnxClassifier
from src.export.text import classifier_specs, text_specs
from src.export.text_checks import classifier_checks
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
    kind, (spec,), settings = text_specs(network)
    assert kind == "classifier" and spec.name == classifier_specs(network)[0].name
    attach_metadata(export_onnx(spec, tmp_path / "network.onnx"), {"kind": kind, **settings})
    runtime = OnnxClassifier(tmp_path / "network.onnx")
    sess = ort.InferenceSession(str(tmp_path / "network.onnx"), providers=["CPUExecutionProvider"])
    for batch, length in ((2, 8), (4, 11)):
        tokens = torch.randint(2, 100, (batch, length))
        tokens[1, length - 3 :] = network.padding_idx  # right padding
        with torch.no_grad():
            eager = network(tokens)
        (onnx,) = run_session(sess, spec.input_names, (tokens, tokens.eq(network.padding_idx)))
        assert onnx.shape == (batch, 3)
        assert float((eager - onnx).abs().max()) <= 1e-4
        assert torch.equal(runtime(tokens), onnx)  # the padding mask from padding_idx
        # export.py's card check of a classifier: a batch (tokens, labels)
        (check,) = classifier_checks(network, runtime, (tokens, torch.zeros(batch)))
        assert check["max_abs"] <= 1e-4 and check["compared"] == f"logits of {(batch, length)}"
