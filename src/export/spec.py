"""What one export traces: the module, example inputs and which of their dimensions are dynamic."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn


@dataclass
class ExportSpec:
    """One exportable graph of a network.

    Args:
        name: the graph's name in file names and cards (``"network"``, ``"encoder"``,
            ``"decoder_step"``).
        module: what is traced: the network itself, or a wrapper that exposes one step with its
            state as explicit inputs and outputs (recurrent state, memories, key/value caches).
        inputs: example inputs, in ``module``'s positional order.
        input_names / output_names: the graph's names for them (outputs flattened in order).
        dynamic: input name -> {dimension index: dimension name} of the dimensions left dynamic
            (batch, image height and width, sequence length, cache length).
        steps: dimension name -> the step its sizes take (an image side that must be a multiple
            of the network's output stride); a name not here takes any size.
        notes: what the card should say about this graph (e.g. the reference path replaced a
            fused kernel, BatchNorm was folded, NMS is left to the caller).
    """

    name: str
    module: nn.Module
    inputs: tuple[Tensor, ...]
    input_names: list[str]
    output_names: list[str]
    dynamic: dict[str, dict[int, str]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
