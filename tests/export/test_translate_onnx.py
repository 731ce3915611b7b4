"""DeLighT translation exported as an encoder and a decoder step: onnxruntime's logits match eager
over chained steps, and beam and greedy search on the exported pair translate exactly as on the
eager model (the searches translate.py runs)."""

from __future__ import annotations

import pytest
import torch

from src.decoding.beam_search import beam_search, greedy_search
from src.models.delight_mt import DeLighTEncoderDecoder

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from src.export.onnx import export_onnx
from src.export.translate_onnx import OnnxTranslator, cache_widths, translation_specs

VOCAB = 50
SEARCH = {"eos": 2, "max_len_a": 1.2, "max_len_b": 5, "length_penalty": 1.0}


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[DeLighTEncoderDecoder, OnnxTranslator]:
    torch.manual_seed(0)
    model = DeLighTEncoderDecoder(
        VOCAB, VOCAB, d_model=64, n_min=2, n_max=3, width_multiplier=2.0, num_blocks=2
    )
    folder = tmp_path_factory.mktemp("mt")
    paths = {}
    for spec in translation_specs(model):
        paths[spec.name] = folder / f"{spec.name}.onnx"
        export_onnx(spec, paths[spec.name])
    return model.eval(), OnnxTranslator(
        paths["encoder"], paths["decoder_step"], cache_widths(model)
    )


def sources(model: DeLighTEncoderDecoder) -> torch.Tensor:
    torch.manual_seed(1)
    src = torch.randint(4, VOCAB, (4, 9))
    src[1, 6:] = src[3, 4:] = model.padding_idx  # right-padded rows of other lengths
    return src


def test_chained_steps_match_eager(exported) -> None:
    model, translator = exported
    src = sources(model)
    mask = src.eq(model.padding_idx)
    with torch.no_grad():
        encoder_out = model.encode(src, mask)
        assert (translator.encode(src, mask) - encoder_out).abs().max() <= 1e-4
        state = onnx_state = None
        tokens = torch.full((4, 1), 2)
        for step in range(4):
            logits, state = model.decode_step(tokens, encoder_out, mask, state)
            onnx_logits, onnx_state = translator.decode_step(tokens, encoder_out, mask, onnx_state)
            assert (onnx_logits - logits).abs().max() <= 1e-4, step
            assert onnx_state.keys[0].shape[0] == step + 1
            tokens = logits[:, -1].argmax(-1, keepdim=True)


def test_searches_on_the_exported_pair_translate_as_eager(exported) -> None:
    model, translator = exported
    src = sources(model)
    with torch.no_grad():
        eager = beam_search(model, src, beam_size=4, pad=model.padding_idx, **SEARCH)
        onnx = beam_search(translator, src, beam_size=4, pad=model.padding_idx, **SEARCH)
        assert [h[0].tokens.tolist() for h in onnx] == [h[0].tokens.tolist() for h in eager]
        assert [h[0].score for h in onnx] == pytest.approx([h[0].score for h in eager], abs=1e-5)
        greedy = greedy_search(model, src, pad=model.padding_idx, **SEARCH)
        onnx_greedy = greedy_search(translator, src, pad=model.padding_idx, **SEARCH)
        assert [h.tokens.tolist() for h in onnx_greedy] == [h.tokens.tolist() for h in greedy]
