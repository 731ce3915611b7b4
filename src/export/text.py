"""The text networks as ONNX graphs a device drives step by step.

Each ``*_specs`` function returns the :class:`ExportSpec` list of one network: wrappers that take
and return the network's state as explicit tensors, so the caller carries it between calls:

- AWD word LM (PRU or LSTM): tokens and each layer's (h, c) -> logits and the new (h, c).
- Transformer-XL and Group-Transformer: a segment and its ``n_layer + 1`` memories -> logits and
  the new memories (the last ``mem_len`` positions).
- DeLighT LM: tokens -> next-token log-probabilities.
- DeLighT and Transformer classifiers: tokens and their padding mask -> class logits.
- DeLighT translation: two graphs, ``encoder`` (source tokens and padding mask ->
  encoder output and mask) and ``decoder_step`` (previous tokens, encoder output, mask and the
  self-attention key/value caches -> logits and the grown caches), which
  :mod:`src.export.translate_onnx` runs for greedy and beam search.

:func:`src.export.onnx.export_onnx` writes each spec; :mod:`src.export.runtime` runs them.
Networks must be in eval mode: dropout is not exported.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from src.export.spec import ExportSpec
from src.models.awd_lm import AWDLanguageModel
from src.models.delight_lm import DeLighTLanguageModel
from src.models.group_transformer import GroupTransformer
from src.models.text_classifier import _PooledClassifier, masked_mean_pool
from src.models.transformer_xl import TransformerXL
from src.ops.adaptive_io import AdaptiveInputSoftmax
from src.ops.sinusoidal_positions import sinusoidal_positions


def _check_eval(network: nn.Module) -> None:
    if network.training:
        raise ValueError(f"{type(network).__name__} must be in eval mode to export (dropout)")


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
