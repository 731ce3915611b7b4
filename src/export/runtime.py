"""Exported ONNX graphs run by onnxruntime behind the interfaces of the eager networks, so the
commands that run a network (``predict.py``, ``generate.py``, ``translate.py``) and the searches
and samplers of :mod:`src.decoding` run the deployed file unchanged.

- :class:`OnnxVisionNetwork`: images -> logits, or SSD's (locations, scores).
- :class:`OnnxSegmentLM`: Transformer-XL / Group-Transformer, ``(tokens, memories) -> (logits,
  memories)`` with ``mem_len``; the first call starts from empty memories.
- :class:`OnnxAWDLM`: AWD-LSTM / AWD-PRU, ``(tokens, hidden) -> AWDOutput``; a graph exported for
  segments of ``L`` tokens is fed ``L`` tokens a call (a longer input is cut into segments).
- :class:`OnnxWordLM`: the DeLighT / Transformer LM's ``log_prob(tokens)``.
- :class:`OnnxClassifier`: a sentence classifier, tokens (padded with ``padding_idx``) -> logits.

Each graph carries what a runtime needs to drive it in its metadata (:mod:`src.export.metadata`):
the network kind and its settings, and the run record its network was built from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from src.export.metadata import read_metadata
from src.models.awd_lm import AWDOutput
from src.utils.errors import UsageError
from src.utils.extras import require


class OnnxGraph:
    """One ONNX file in an onnxruntime CPU session: its inputs' names and static shapes, and a
    call that takes tensors in the graph's input order and returns its outputs as tensors.

    Args:
        path: the ``.onnx`` file.
        threads: onnxruntime intra-op threads (None: onnxruntime's default, all cores).
    """

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        require("onnxruntime", "export", "running exported ONNX files")
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise UsageError(f"onnx={self.path}: no such file (export.py writes <out>.onnx)")
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(self.path), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        # a dimension is an int when fixed, a name when dynamic
        self.shapes = {i.name: list(i.shape) for i in self.session.get_inputs()}
        self.metadata = read_metadata(self.path)

    def __call__(self, *inputs: Tensor) -> list[Tensor]:
        if len(inputs) != len(self.inputs):
            raise ValueError(f"{self.path.name} takes {self.inputs}, got {len(inputs)} tensors")
        feeds = {name: t.detach().cpu().numpy() for name, t in zip(self.inputs, inputs)}
        return [torch.from_numpy(out) for out in self.session.run(self.outputs, feeds)]

    def width(self, name: str, axis: int) -> int:
        """The static size of dimension ``axis`` of input ``name``."""
        size = self.shapes[name][axis]
        if not isinstance(size, int):
            raise TypeError(f"{self.path.name}: input {name} axis {axis} is dynamic ({size})")
        return size


class OnnxVisionNetwork(nn.Module):
    """An exported vision network: images -> logits (B, K) or (B, K, H, W), SSD's encoded
    offsets and class logits ((B, P, 4), (B, P, K)), or with NMS in the graph one image's
    boxes (N, 4), scores (N,) and labels (N,).

    ``image_size`` is the (H, W) a graph of fixed image size takes (None when dynamic)."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        super().__init__()
        self.graph = OnnxGraph(path, threads)
        height, width = self.graph.shapes[self.graph.inputs[0]][2:]
        fixed = isinstance(height, int) and isinstance(width, int)
        self.image_size: tuple[int, int] | None = (height, width) if fixed else None

    def forward(self, images: Tensor) -> Tensor | tuple[Tensor, ...]:
        if self.image_size is not None and tuple(images.shape[2:]) != self.image_size:
            raise UsageError(
                f"{self.graph.path.name} takes images of {self.image_size[0]}x{self.image_size[1]} "
                f"(H x W, fixed when it was exported), got {images.shape[2]}x{images.shape[3]}"
            )
        outputs = self.graph(images.float())
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class OnnxSegmentLM(nn.Module):
    """An exported Transformer-XL or Group-Transformer segment step with the interface of the
    eager network: ``forward(tokens, memories)`` -> ``(logits, memories)``.

    Shape:
        tokens (B, T) int64, memories None or ``n_layer + 1`` x (B, M, D)
        -> logits (B, T, V), ``n_layer + 1`` x (B, min(mem_len, M + T), D)
    """

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        super().__init__()
        self.graph = OnnxGraph(path, threads)
        self.mem_len = int(self.graph.metadata["mem_len"])
        self.slots = len(self.graph.inputs) - 1
        self.d_model = self.graph.width(self.graph.inputs[1], 2)

    def forward(
        self, tokens: Tensor, memories: Sequence[Tensor] | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        if memories is None:  # a stream's start: empty memories
            memories = [torch.zeros(tokens.shape[0], 0, self.d_model)] * self.slots
        logits, *new = self.graph(tokens, *memories)
        return logits, new


class OnnxAWDLM(nn.Module):
    """An exported AWD-LSTM / AWD-PRU step with the interface of the eager network:
    ``forward(tokens, hidden)`` -> :class:`~src.models.awd_lm.AWDOutput` (logits and hidden; the
    layer outputs are not exported and are None).

    Shape:
        tokens (B, T) int64 with T a multiple of the exported segment length, hidden None or per
        layer (h, c), each (1, B, M_l) -> logits (B, T, V), hidden as given
    """

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        super().__init__()
        self.graph = OnnxGraph(path, threads)
        self.segment_length = self.graph.width("tokens", 1)
        self.num_layers = (len(self.graph.inputs) - 1) // 2
        self.sizes = [self.graph.width(f"h{i}", 2) for i in range(self.num_layers)]

    def init_hidden(self, batch_size: int) -> list[tuple[Tensor, Tensor]]:
        return [(torch.zeros(1, batch_size, m), torch.zeros(1, batch_size, m)) for m in self.sizes]

    def forward(
        self, tokens: Tensor, hidden: Sequence[tuple[Tensor, Tensor]] | None = None
    ) -> AWDOutput:
        length = self.segment_length
        if tokens.shape[1] % length:
            raise ValueError(
                f"{self.graph.path.name} reads {length} tokens a call; got {tokens.shape[1]}"
            )
        state = [t for layer in hidden or self.init_hidden(tokens.shape[0]) for t in layer]
        logits = []
        for begin in range(0, tokens.shape[1], length):  # the state each segment ends with
            out, *state = self.graph(tokens[:, begin : begin + length], *state)
            logits.append(out)
        pairs = [(state[2 * i], state[2 * i + 1]) for i in range(self.num_layers)]
        return AWDOutput(torch.cat(logits, dim=1), pairs, None, None)  # type: ignore[arg-type]


class OnnxWordLM(nn.Module):
    """An exported DeLighT / Transformer word LM: ``log_prob(tokens)``, as the eager network's.

    Shape:
        tokens (B, T) int64 -> (B, T, V) float32
    """

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        super().__init__()
        self.graph = OnnxGraph(path, threads)

    def log_prob(self, tokens: Tensor) -> Tensor:
        return self.graph(tokens)[0]

    def forward(self, tokens: Tensor) -> Tensor:
        return self.log_prob(tokens)


class OnnxClassifier(nn.Module):
    """An exported sentence classifier: tokens padded with ``padding_idx`` -> logits.

    Shape:
        tokens (B, T) int64 -> (B, num_classes)
    """

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        super().__init__()
        self.graph = OnnxGraph(path, threads)
        self.padding_idx = int(self.graph.metadata["padding_idx"])

    def forward(self, tokens: Tensor) -> Tensor:
        return self.graph(tokens, tokens.eq(self.padding_idx))[0]


def kind_of(path: str | Path) -> str:
    """The network kind an exported file's metadata names (``vision``, ``segment_lm``, ...)."""
    metadata = read_metadata(path)
    if "kind" not in metadata:
        raise UsageError(
            f"onnx={path} carries no metadata of this project's export.py; export the checkpoint "
            "with python export.py ckpt_path=<run .ckpt>"
        )
    return str(metadata["kind"])


RUNTIMES: dict[str, Any] = {
    "vision": OnnxVisionNetwork,
    "segment_lm": OnnxSegmentLM,
    "awd_lm": OnnxAWDLM,
    "word_lm": OnnxWordLM,
    "classifier": OnnxClassifier,
}
