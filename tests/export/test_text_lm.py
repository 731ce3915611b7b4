"""ONNX graphs of the language models against eager PyTorch: state fed back over chained steps."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest
import torch

from src.export.onnx import export_onnx, run_session
from src.export.spec import ExportSpec
from src.export.text import awd_lm_specs, delight_lm_specs, segment_lm_specs
from src.models.awd_lm import AWDLanguageModel
from src.models.delight_lm import DeLighTLanguageModel
from src.models.group_transformer import GroupTransformer
from src.models.transformer_xl import TransformerXL

TOL = 1e-4
AWD_NO_DROPOUT = {
    name: 0.0
    for name in ("dropout", "dropout_hidden", "dropout_input", "dropout_embedding", "weight_drop")
}

DELIGHT_NO_DROPOUT = {
    name: 0.0
    for name in ("dropout", "attention_dropout", "ffn_dropout", "dextra_dropout",
                 "embedding_dropout", "position_dropout", "adaptive_softmax_dropout")
}  # fmt: skip


def session(spec: ExportSpec, tmp_path: Path) -> ort.InferenceSession:
    path = tmp_path / f"{spec.name}.onnx"
    export_onnx(spec, path)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def max_error(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [tuple(x.shape) for x in a] == [tuple(y.shape) for y in b]
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("rnn", ["pru", "lstm"])
def test_awd_lm_steps_match_eager(rnn: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    network = AWDLanguageModel(
        50, rnn=rnn, embedding_dim=16, hidden_size=32, num_layers=2, groups=4, **AWD_NO_DROPOUT
    ).eval()
    (spec,) = awd_lm_specs(network, segment_length=3)
    sess = session(spec, tmp_path)
    for batch, length in ((2, 3), (5, 3)):  # dynamic batch, fixed segment length
        state = [t for layer in network.init_hidden(batch) for t in layer]
        onnx_state = list(state)
        errors = []
        for _ in range(3):  # the state each step ends with starts the next
            tokens = torch.randint(0, 50, (batch, length))
            with torch.no_grad():
                eager = list(spec.module(tokens, *state))
            onnx = run_session(sess, spec.input_names, (tokens, *onnx_state))
            errors.append(max_error(eager, onnx))
            state, onnx_state = eager[1:], onnx[1:]
        assert eager[0].shape == (batch, length, 50)
        assert max(errors) <= TOL, errors


def test_delight_lm_log_probs_match_eager(tmp_path: Path) -> None:
    torch.manual_seed(0)
    network = DeLighTLanguageModel(
        60, 32, 2, 3, 2.0, cutoffs=(10, 30), embedding_dim=32, **DELIGHT_NO_DROPOUT
    ).eval()
    (spec,) = delight_lm_specs(network)
    sess = session(spec, tmp_path)
    for batch, length in ((2, 8), (3, 5)):
        tokens = torch.randint(2, 60, (batch, length))
        with torch.no_grad():
            eager = network.log_prob(tokens)
        (onnx,) = run_session(sess, spec.input_names, (tokens,))
        assert onnx.shape == (batch, length, 60)
        assert max_error([eager], [onnx]) <= TOL


SEGMENT_MODELS = {
    "transformer_xl": lambda: TransformerXL(30, 2, 32, 4, 64, mem_len=6, dropout=0.0),
    "group_transformer": lambda: GroupTransformer(
        30, 2, 32, 4, 64, 2, tgt_len=4, mem_len=6, dropout=0.0
    ),
}


@pytest.mark.parametrize("name", sorted(SEGMENT_MODELS))
def test_segment_steps_match_eager(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    network = SEGMENT_MODELS[name]().eval()
    (spec,) = segment_lm_specs(network)
    sess = session(spec, tmp_path)
    for batch, length in ((2, 4), (3, 3)):
        memories = [torch.zeros(batch, 0, 32) for _ in range(3)]  # a stream's start: no memory
        onnx_memories = list(memories)
        errors = []
        for _ in range(3):  # memories grow 0 -> 4 -> 6 (mem_len) and are fed back
            tokens = torch.randint(0, 30, (batch, length))
            with torch.no_grad():
                eager = list(spec.module(tokens, *memories))
            onnx = run_session(sess, spec.input_names, (tokens, *onnx_memories))
            errors.append(max_error(eager, onnx))
            memories, onnx_memories = eager[1:], onnx[1:]
        assert onnx[0].shape == (batch, length, 30)
        assert onnx[1].shape == (batch, 6, 32)
        assert max(errors) <= TOL, errors
