"""The text networks as ONNX graphs a device drives step by step.

Each ``*_specs`` function returns the :class:`ExportSpec` list of one network: wrappers that take
and return the network's state as explicit tensors, so the caller carries it between calls:

- AWD word LM (PRU or LSTM): tokens and each layer's (h, c) -> logits and the new (h, c).
- Transformer-XL and Group-Transformer: a segment and its ``n_layer + 1`` memories -> logits and
  the new memories (the last ``mem_len`` positions).
- DeLighT LM: tokens -> next-token log-probabilities.
- DeLighT and Transformer classifiers: tokens and their padding mask -> class logits.
- DeLighT and Transformer translation: two graphs, ``encoder`` (source tokens and padding mask ->
  encoder output and mask) and ``decoder_step`` (previous tokens, encoder output, mask and the
  self-attention key/value caches -> logits and the grown caches), which
  :mod:`src.export.translate_onnx` runs for greedy and beam search.

:func:`export_onnx` writes a spec with ``torch.onnx.export`` (the dynamo exporter, else the
TorchScript one, the reason recorded in ``spec.notes``); :func:`run_onnx` runs it with
onnxruntime. Networks must be in eval mode: dropout is not exported.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from src.export.onnx import custom_translations
from src.export.spec import ExportSpec
from src.models.awd_lm import AWDLanguageModel
from src.models.delight_lm import DeLighTLanguageModel
from src.models.group_transformer import GroupTransformer
from src.models.text_classifier import _PooledClassifier, masked_mean_pool
from src.models.transformer_xl import TransformerXL
from src.ops.adaptive_io import AdaptiveInputSoftmax
from src.ops.cpu import use_cpu_paths
from src.ops.sinusoidal_positions import sinusoidal_positions
from src.utils.extras import require

OPSET = 18


def _check_eval(network: nn.Module) -> None:
    if network.training:
        raise ValueError(f"{type(network).__name__} must be in eval mode to export (dropout)")


def _dynamic_shapes(spec: ExportSpec) -> tuple[object, ...]:
    """``spec.dynamic`` as the dynamo exporter's ``dynamic_shapes``: one ``Dim`` per name (so
    dimensions that share a name must be equal), grouped as the module's ``forward`` takes its
    inputs (a ``*state`` parameter takes the rest as one tuple)."""
    dims: dict[str, torch.export.Dim] = {}
    shapes: list[dict[int, torch.export.Dim] | None] = []
    for name in spec.input_names:
        axes = spec.dynamic.get(name)
        shapes.append(
            {i: dims.setdefault(d, torch.export.Dim(d)) for i, d in axes.items()} if axes else None
        )
    parameters = list(inspect.signature(spec.module.forward).parameters.values())
    grouped: list[object] = []
    for i, parameter in enumerate(parameters):
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            grouped.append(tuple(shapes[i:]))
            break
        if i < len(shapes):
            grouped.append(shapes[i])
    return tuple(grouped)


def _attention_any_rank(
    query: object,
    key: object,
    value: object,
    attn_mask: object = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> object:
    """ONNX of ``aten.scaled_dot_product_attention`` for 3-D operands as well (DeLighT's single
    head attention, (B, T, d)), which onnxscript's translation refuses: ``softmax(q k^T scale +
    mask) v``, written out. Dropout is not exported (eval mode)."""
    import numpy as np
    from onnxscript import ir
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops.nn import aten_scaled_dot_product_attention

    if len(query.shape) != 3:  # type: ignore[attr-defined]
        return aten_scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
    if scale is None:
        scale = 1.0 / float(query.shape[-1]) ** 0.5  # type: ignore[attr-defined]
    scores = op.MatMul(query, op.Transpose(key, perm=[0, 2, 1]))  # (B, T, S)
    scores = op.Mul(scores, op.CastLike(scale, query))
    if is_causal:
        ones = op.ConstantOfShape(
            op.Concat(op.Shape(query, start=1, end=2), op.Shape(key, start=1, end=2), axis=0),
            value=ir.tensor(np.ones(1, dtype=bool)),
        )
        attn_mask = op.Trilu(ones, upper=0)  # (T, S), True where a query may read a key
    if attn_mask is not None:
        if attn_mask.dtype == ir.DataType.BOOL:  # type: ignore[attr-defined]
            minus_inf = op.CastLike(float("-inf"), query)
            attn_mask = op.Where(attn_mask, op.CastLike(0.0, query), minus_inf)
        scores = op.Add(scores, attn_mask)
    return op.MatMul(op.Softmax(scores, axis=-1), value)  # (B, T, d)


def _reason(error: BaseException) -> str:
    """The root cause of an exporter failure in one line."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def export_onnx(spec: ExportSpec, path: str | Path) -> ExportSpec:
    """Write ``spec`` to ``path`` as ONNX (opset 18): the dynamo exporter, falling back to the
    TorchScript exporter when it fails (the reason appended to ``spec.notes``). Returns ``spec``.

    The graph is traced on ATen's paths (``LIGHTNETS_CPU_KERNELS=0``): the ops' C++ kernels are
    opaque to ONNX, and their PyTorch references compute the same."""
    require("onnxscript", "export", "The dynamo ONNX exporter")
    path = Path(path)
    spec.module.eval()
    try:
        with warnings.catch_warnings(), use_cpu_paths("0"):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                spec.module,
                spec.inputs,
                dynamo=True,
                input_names=spec.input_names,
                output_names=spec.output_names,
                dynamic_shapes=_dynamic_shapes(spec),
                opset_version=OPSET,
                custom_translation_table={
                    **custom_translations(),
                    torch.ops.aten.scaled_dot_product_attention.default: _attention_any_rank,
                },
                optimize=True,
                verbose=False,
            )
        program.save(str(path))
        spec.notes.append("exporter: dynamo (torch.export)")
    except Exception as error:  # noqa: BLE001 - any failure of the dynamo exporter falls back
        reason = _reason(error)
        try:
            with warnings.catch_warnings(), use_cpu_paths("0"):
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    spec.module,
                    spec.inputs,
                    str(path),
                    dynamo=False,
                    input_names=spec.input_names,
                    output_names=spec.output_names,
                    dynamic_axes={k: dict(v) for k, v in spec.dynamic.items()},
                    opset_version=OPSET,
                )
        except Exception as fallback:
            raise RuntimeError(
                f"{type(spec.module).__name__} did not export to ONNX: the dynamo exporter failed "
                f"with {reason}; the TorchScript exporter with {_reason(fallback)}"
            ) from fallback
        spec.notes.append(f"exporter: TorchScript; the dynamo exporter failed with {reason}")
    return spec


def run_onnx(session: object, spec: ExportSpec, inputs: tuple[Tensor, ...]) -> list[Tensor]:
    """Run an onnxruntime ``InferenceSession`` of ``spec`` on ``inputs`` (in the spec's order);
    returns its outputs as tensors, in ``spec.output_names``' order."""
    feed = {name: t.detach().cpu().numpy() for name, t in zip(spec.input_names, inputs)}
    outputs = session.run(spec.output_names, feed)  # type: ignore[attr-defined]
    return [torch.from_numpy(o) for o in outputs]


# --- AWD word language model -------------------------------------------------------------------


class AWDStep(nn.Module):
    """One segment of an AWD language model with its recurrent state as tensors.

    Shape:
        tokens (B, T) int64, then per layer l ``h_l``, ``c_l`` (1, B, M_l)
        -> logits (B, T, V), then per layer the new ``h_l``, ``c_l`` (1, B, M_l)
    """

    def __init__(self, network: AWDLanguageModel) -> None:
        super().__init__()
        self.network = network

    def forward(self, tokens: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        hidden = [(state[2 * i], state[2 * i + 1]) for i in range(self.network.num_layers)]
        out = self.network(tokens, hidden)
        return (out.logits, *(t for layer in out.hidden for t in layer))


def awd_lm_specs(
    network: AWDLanguageModel, *, batch_size: int = 2, segment_length: int = 1
) -> list[ExportSpec]:
    """The AWD LM as one ``step`` graph: a segment of ``segment_length`` tokens and the state it
    starts from -> logits and the state it ends with (``segment_length=1``: one token a call).
    Batch is dynamic; the segment length is fixed: PRU layers unroll their recurrence over time in
    the graph, and the exporter's ONNX ``LSTM`` translation (onnxscript 0.7) writes the example's
    length into the Reshape after each layer."""
    _check_eval(network)
    tokens = torch.randint(0, network.num_embeddings, (batch_size, segment_length))
    state = [t for layer in network.init_hidden(batch_size) for t in layer]
    names = [f"{k}{i}" for i in range(network.num_layers) for k in ("h", "c")]
    dynamic: dict[str, dict[int, str]] = {"tokens": {0: "batch"}}
    notes = [f"segment length fixed to {segment_length} tokens a call"]
    dynamic.update({name: {1: "batch"} for name in names})
    return [
        ExportSpec(
            name="step",
            module=AWDStep(network),
            inputs=(tokens, *state),
            input_names=["tokens", *names],
            output_names=["logits", *(f"new_{name}" for name in names)],
            dynamic=dynamic,
            notes=notes,
        )
    ]


# --- sentence classifiers ----------------------------------------------------------------------


class ClassifierStep(nn.Module):
    """A DeLighT or Transformer classifier with the padding mask as an input (the eager network
    derives it from ``padding_idx``; a device may pad with any token).

    Shape:
        tokens (B, T) int64, padding_mask (B, T) bool (True = pad) -> logits (B, num_classes)
    """

    def __init__(self, network: _PooledClassifier) -> None:
        super().__init__()
        self.network = network

    def forward(self, tokens: Tensor, padding_mask: Tensor) -> Tensor:
        net = self.network
        x = net.lookup(tokens) * net.embed_scale  # (B, T, d_m)
        x = x + sinusoidal_positions(padding_mask, net.d_model, net.padding_idx).to(x.dtype)
        x = net.encode(x, padding_mask)  # (B, T, d_m)
        return net.head(masked_mean_pool(x, padding_mask))


def classifier_specs(
    network: _PooledClassifier, *, batch_size: int = 2, length: int = 8
) -> list[ExportSpec]:
    """A classifier as one ``network`` graph; batch and length are dynamic."""
    _check_eval(network)
    tokens = torch.randint(0, network.lookup.num_embeddings, (batch_size, length))
    padding_mask = torch.zeros(batch_size, length, dtype=torch.bool)
    padding_mask[0, length // 2 :] = True
    tokens[padding_mask] = network.padding_idx
    axes = {0: "batch", 1: "time"}
    return [
        ExportSpec(
            name="network",
            module=ClassifierStep(network),
            inputs=(tokens, padding_mask),
            input_names=["tokens", "padding_mask"],
            output_names=["logits"],
            dynamic={"tokens": dict(axes), "padding_mask": dict(axes)},
        )
    ]


# --- DeLighT language model --------------------------------------------------------------------


class DeLighTLMStep(nn.Module):
    """The DeLighT LM's next-token log-probabilities. The padded keys are always masked: the
    eager network masks them only when the batch has a pad, which with no pad changes nothing.

    Shape:
        tokens (B, T) int64 -> log_probs (B, T, V) float32
    """

    def __init__(self, network: DeLighTLanguageModel) -> None:
        super().__init__()
        self.network = network

    def forward(self, tokens: Tensor) -> Tensor:
        net = self.network
        padding_mask = tokens.eq(net.padding_idx)  # (B, T)
        x = net.embedding(tokens, padding_mask).transpose(0, 1)  # (T, B, d_m)
        for block in net.blocks:
            x, _ = block(x, self_attn_padding_mask=padding_mask)  # (T, B, d_m), causal
        x = x.transpose(0, 1)  # (B, T, d_m)
        hidden = x if net.project_out is None else net.project_out(x)  # (B, T, embedding_dim)
        if isinstance(net.lookup, AdaptiveInputSoftmax):
            return net.lookup.log_prob(hidden)
        return torch.nn.functional.linear(hidden, net.lookup.weight).float().log_softmax(-1)


def delight_lm_specs(
    network: DeLighTLanguageModel, *, batch_size: int = 2, length: int = 8
) -> list[ExportSpec]:
    """The DeLighT LM as one ``network`` graph (tokens -> log-probabilities); batch and length
    are dynamic. A device decodes by feeding the tokens so far (the network keeps no cache)."""
    _check_eval(network)
    low = network.padding_idx + 1
    tokens = torch.randint(low, network.vocab_size, (batch_size, length))
    return [
        ExportSpec(
            name="network",
            module=DeLighTLMStep(network),
            inputs=(tokens,),
            input_names=["tokens"],
            output_names=["log_probs"],
            dynamic={"tokens": {0: "batch", 1: "time"}},
        )
    ]


# --- Transformer-XL and Group-Transformer ------------------------------------------------------


class SegmentStep(nn.Module):
    """One segment of a Transformer-XL or Group-Transformer with its memories as tensors.

    Shape:
        tokens (B, T) int64, memories ``n_layer + 1`` x (B, M, D)
        -> logits (B, T, n_token), new memories ``n_layer + 1`` x (B, min(mem_len, M + T), D)
    """

    def __init__(self, network: TransformerXL | GroupTransformer) -> None:
        super().__init__()
        if network.mem_len < 1:
            raise ValueError(f"a segment step needs mem_len >= 1, got {network.mem_len}")
        self.network = network

    def forward(self, tokens: Tensor, *memories: Tensor) -> tuple[Tensor, ...]:
        logits, new_memories = self.network(tokens, list(memories))
        return (logits, *new_memories)


def segment_lm_specs(
    network: TransformerXL | GroupTransformer,
    *,
    batch_size: int = 2,
    length: int = 4,
    memory_length: int | None = None,
) -> list[ExportSpec]:
    """A Transformer-XL or Group-Transformer as one ``step`` graph: a segment and the memories
    of the segments before it (the example has ``memory_length`` positions, ``mem_len`` by
    default; a stream starts with (B, 0, D) memories). Batch, segment length and memory length
    are dynamic; with a learnable position table (Group-Transformer) memory
    plus segment may not exceed ``tgt_len + mem_len``."""
    _check_eval(network)
    memory_length = network.mem_len if memory_length is None else memory_length
    tokens = torch.randint(0, network.n_token, (batch_size, length))
    n_slots = network.n_layer + 1
    memories = [torch.randn(batch_size, memory_length, network.d_model) for _ in range(n_slots)]
    names = [f"memory{i}" for i in range(n_slots)]
    dynamic: dict[str, dict[int, str]] = {"tokens": {0: "batch", 1: "time"}}
    dynamic.update({name: {0: "batch", 1: "memory"} for name in names})
    return [
        ExportSpec(
            name="step",
            module=SegmentStep(network),
            inputs=(tokens, *memories),
            input_names=["tokens", *names],
            output_names=["logits", *(f"new_{name}" for name in names)],
            dynamic=dynamic,
        )
    ]


# --- which graphs a network exports as ---------------------------------------------------------


def text_specs(network: nn.Module) -> tuple[str, list[ExportSpec], dict[str, object]]:
    """``(kind, specs, settings)`` of a text network: the :mod:`src.export.runtime` kind that
    drives its graphs, the graphs, and the settings that runtime reads from the file's metadata.

    Translation models are exported by :func:`src.export.translate_onnx.translation_specs`."""
    _check_eval(network)
    if isinstance(network, AWDLanguageModel):
        return "awd_lm", awd_lm_specs(network), {}
    if isinstance(network, (TransformerXL, GroupTransformer)):
        return "segment_lm", segment_lm_specs(network), {"mem_len": network.mem_len}
    if isinstance(network, DeLighTLanguageModel):
        return "word_lm", delight_lm_specs(network), {}
    if isinstance(network, _PooledClassifier):
        return "classifier", classifier_specs(network), {"padding_idx": network.padding_idx}
    raise TypeError(
        f"{type(network).__name__} has no ONNX export; exported text networks: AWDLanguageModel, "
        "TransformerXL, GroupTransformer, DeLighTLanguageModel, DeLighTClassifier, "
        "TransformerClassifier, DeLighTEncoderDecoder"
    )


def is_text_network(network: nn.Module) -> bool:
    """Whether :func:`text_specs` exports ``network``."""
    return isinstance(
        network,
        (
            AWDLanguageModel,
            TransformerXL,
            GroupTransformer,
            DeLighTLanguageModel,
            _PooledClassifier,
        ),
    )
