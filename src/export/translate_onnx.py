"""DeLighT translation as two ONNX graphs a device drives: the encoder, and one decoder step with
the self-attention caches as explicit inputs and outputs; and :class:`OnnxTranslator`, which runs
them through onnxruntime behind the interface :mod:`src.decoding.beam_search` searches with, so
beam and greedy search on the exported pair are the very searches ``translate.py`` runs.

The decoder step re-projects the encoder output for the encoder-decoder attention at every step
(eager decoding caches those keys and values after the first step): one graph for every step,
the caches of growing length the only state. Positions continue from the cache length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from src.export.spec import ExportSpec
from src.models.delight_block import DecoderBlockCache
from src.models.delight_mt import DeLighTEncoderDecoder
from src.ops.single_head_attention import KeyValueCache
from src.utils.errors import UsageError
from src.utils.extras import require


class DeLighTEncoderGraph(nn.Module):
    """``model.encode`` with the padding mask as an input.

    Shape:
        src_tokens (B, S) int64, src_padding_mask (B, S) bool -> encoder_out (S, B, d_m)
    """

    def __init__(self, model: DeLighTEncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_tokens: Tensor, src_padding_mask: Tensor) -> Tensor:
        return self.model.encode(src_tokens, src_padding_mask)


class DeLighTDecoderStepGraph(nn.Module):
    """One incremental decoder step: new target tokens (no pads) after ``P`` cached positions.

    Inputs after the first three are each decoder block's self-attention keys, then values
    (``P`` = 0 before the first step); outputs are the logits and the caches grown by ``T``.

    Shape:
        prev_tokens (B, T) int64; encoder_out (S, B, d_m); src_padding_mask (B, S) bool;
        keys_i, values_i (P, B, d_o) -> logits (B, T, V_tgt), keys_i, values_i (P + T, B, d_o)
    """

    def __init__(self, model: DeLighTEncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, prev_tokens: Tensor, encoder_out: Tensor, src_padding_mask: Tensor, *caches: Tensor
    ) -> tuple[Tensor, ...]:
        blocks = self.model.decoder_blocks
        keys, values = caches[: len(blocks)], caches[len(blocks) :]
        past = keys[0].shape[0]
        no_pad = torch.zeros_like(prev_tokens, dtype=torch.bool)
        x = self.model.decoder_embedding(prev_tokens, no_pad, offset=past).transpose(
            0, 1
        )  # (T, B, d_m)
        new_keys, new_values = [], []
        for block, key, value in zip(blocks, keys, values, strict=True):
            cache = DecoderBlockCache(KeyValueCache(key, value), None)  # encoder keys: recomputed
            x, cache = block.forward_step(x, encoder_out, src_padding_mask, cache)
            new_keys.append(cache.self_attn.key)
            new_values.append(cache.self_attn.value)
        return (self.model._output(x), *new_keys, *new_values)


def cache_widths(model: DeLighTEncoderDecoder) -> list[int]:
    """d_o of every decoder block's self-attention keys (the cache width)."""
    widths = []
    for block in model.decoder_blocks:
        probe = torch.zeros(1, 1, block.self_attn_norm.normalized_shape[0])
        widths.append(block.dextra(probe).shape[-1])
    return widths


def translation_specs(
    model: DeLighTEncoderDecoder, *, batch: int = 2, src_len: int = 5, past: int = 3
) -> list[ExportSpec]:
    """The encoder graph and the decoder-step graph of ``model`` (eval mode), with dynamic batch,
    source length and cache length; the step reads one new token."""
    model = model.eval()
    pad = model.padding_idx
    src = torch.full((batch, src_len), pad + 2, dtype=torch.long)
    mask = torch.zeros(batch, src_len, dtype=torch.bool)
    mask[0, -1] = True
    widths = cache_widths(model)
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        encoder_out = model.encode(src, mask)
    caches = tuple(torch.randn(past, batch, d, dtype=dtype) for d in widths * 2)
    n = len(widths)
    cache_names = [f"key_{i}" for i in range(n)] + [f"value_{i}" for i in range(n)]
    encoder = ExportSpec(
        "encoder",
        DeLighTEncoderGraph(model),
        (src, mask),
        ["src_tokens", "src_padding_mask"],
        ["encoder_out"],
        dynamic={
            "src_tokens": {0: "batch", 1: "src_len"},
            "src_padding_mask": {0: "batch", 1: "src_len"},
        },
    )
    step = ExportSpec(
        "decoder_step",
        DeLighTDecoderStepGraph(model),
        (torch.full((batch, 1), pad + 3, dtype=torch.long), encoder_out, mask, *caches),
        ["prev_tokens", "encoder_out", "src_padding_mask", *cache_names],
        ["logits", *(f"new_{name}" for name in cache_names)],
        dynamic={
            "prev_tokens": {0: "batch"},
            "encoder_out": {0: "src_len", 1: "batch"},
            "src_padding_mask": {0: "batch", 1: "src_len"},
            **{name: {0: "past", 1: "batch"} for name in cache_names},
        },
        notes=[
            "encoder-decoder attention keys and values are recomputed from encoder_out at each step"
        ],
    )
    return [encoder, step]


@dataclass(frozen=True)
class OnnxDecoderState:
    """The self-attention caches between steps, as the step graph returns them.

    Shape:
        keys, values: one (P, B, d_o) per decoder block
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    def reorder(self, order: Tensor) -> OnnxDecoderState:
        """The caches of the sequences ``order`` (B',) picks, e.g. the surviving beams."""
        return OnnxDecoderState(
            tuple(k.index_select(1, order) for k in self.keys),
            tuple(v.index_select(1, order) for v in self.values),
        )


class OnnxTranslator(nn.Module):
    """The exported encoder and decoder step, run by onnxruntime, as the model
    :func:`src.decoding.beam_search.beam_search` and ``greedy_search`` take.

    Args:
        encoder / decoder_step: the ``.onnx`` files of :func:`translation_specs`' graphs.
        cache_widths: d_o of each decoder block (:func:`cache_widths`); None: read from the
            step graph's cache inputs.
        threads: onnxruntime intra-op threads.
    """

    def __init__(
        self,
        encoder: str | Path,
        decoder_step: str | Path,
        cache_widths: list[int] | None = None,
        *,
        threads: int = 1,
    ) -> None:
        super().__init__()
        require("onnxruntime", "export", "running exported translation graphs")
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.encoder = ort.InferenceSession(
            str(encoder), options, providers=["CPUExecutionProvider"]
        )
        self.step = ort.InferenceSession(
            str(decoder_step), options, providers=["CPUExecutionProvider"]
        )
        if cache_widths is None:  # keys_i are (P, B, d_o): d_o is static
            keys = [i for i in self.step.get_inputs() if i.name.startswith("key_")]
            cache_widths = [int(i.shape[2]) for i in sorted(keys, key=lambda i: int(i.name[4:]))]
        self.cache_widths = cache_widths
        self.dtype = torch.float32

    @classmethod
    def from_export(cls, path: str | Path, *, threads: int = 1) -> OnnxTranslator:
        """The pair ``export.py`` wrote, from either file (``<out>.encoder.onnx``,
        ``<out>.decoder_step.onnx``) or their common stem ``<out>``."""
        stem = str(path)
        for suffix in (".encoder.onnx", ".decoder_step.onnx", ".onnx"):
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
                break
        encoder, step = Path(f"{stem}.encoder.onnx"), Path(f"{stem}.decoder_step.onnx")
        missing = [str(p) for p in (encoder, step) if not p.is_file()]
        if missing:
            raise UsageError(
                f"onnx={path}: missing {', '.join(missing)}; a translation export is the pair "
                "<out>.encoder.onnx and <out>.decoder_step.onnx that export.py writes"
            )
        return cls(encoder, step, threads=threads)

    def encode(self, src_tokens: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        (out,) = self.encoder.run(
            None, {"src_tokens": src_tokens.numpy(), "src_padding_mask": src_padding_mask.numpy()}
        )
        encoder_out = torch.from_numpy(out)
        self.dtype = encoder_out.dtype
        return encoder_out

    def decode_step(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Tensor,
        src_padding_mask: Tensor | None,
        state: OnnxDecoderState | None,
    ) -> tuple[Tensor, OnnxDecoderState]:
        batch = prev_output_tokens.shape[0]
        if state is None:
            empty = tuple(torch.zeros(0, batch, d, dtype=self.dtype) for d in self.cache_widths)
            state = OnnxDecoderState(empty, empty)
        n = len(self.cache_widths)
        feeds = {
            "prev_tokens": prev_output_tokens.numpy(),
            "encoder_out": encoder_out.numpy(),
            "src_padding_mask": src_padding_mask.numpy(),
            **{f"key_{i}": k.numpy() for i, k in enumerate(state.keys)},
            **{f"value_{i}": v.numpy() for i, v in enumerate(state.values)},
        }
        logits, *caches = (torch.from_numpy(a) for a in self.step.run(None, feeds))
        return logits, OnnxDecoderState(tuple(caches[:n]), tuple(caches[n:]))
