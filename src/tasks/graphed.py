"""Training steps that may replay as CUDA graphs: the text tasks' side of the graphed path.

The text systems' networks trace a training step as one graph with fixed shapes (no host
synchronisation, no data-dependent shape), so ``src.build.compile_network`` can compile them with
``fullgraph=True`` and replay them as CUDA graphs (torch's CUDA-graph trees). A replay writes its
outputs into buffers the next replay of that graph reuses. A task that hands one step's output to
the next (Transformer-XL and Group-Transformer memories, the AWD models' recurrent state) would then
read buffers already overwritten; so would a logged value read after later steps (Lightning keeps
the last one). While graphs replay, the task copies what it keeps of a step's outputs out of them,
and marks where each step begins (``torch.compiler.cudagraph_mark_step_begin``), after which the
outputs of the previous step may be overwritten.
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

import torch
from torch import Tensor

State = TypeVar("State")


def kept(state: State, *, copy: bool) -> State:
    """``state`` as kept past the step: every tensor detached (back-propagation stops at the
    step), and copied into fresh memory when ``copy``; lists and tuples keep their structure.

    Shape:
        any nesting of lists and tuples of tensors (or None) -> the same
    """
    if state is None:
        return state
    if isinstance(state, Tensor):
        return state.detach().clone() if copy else state.detach()  # type: ignore[return-value]
    if isinstance(state, (list, tuple)):
        return type(state)(kept(s, copy=copy) for s in state)  # type: ignore[return-value]
    raise TypeError(f"kept state holds tensors, lists and tuples, got {type(state).__name__}")


class GraphedStep:
    """A task whose network's step traces as one graph with fixed shapes (module docstring).
    Mixed in before ``L.LightningModule``.

    ``traced_step`` declares it (:func:`src.build.compile_plan` turns the graphed path on for such
    tasks on a GPU); ``graphs_per_shape`` is how many graphs one batch shape may take (training and
    evaluation, times two where the first segment of a pass carries no state);
    ``replays_cuda_graphs`` is set by :func:`src.build.compile_network` when the compiled network
    replays CUDA graphs.
    """

    traced_step: ClassVar[bool] = True
    graphs_per_shape: ClassVar[int] = 2
    replays_cuda_graphs: bool = False

    def begin_step(self) -> None:
        """Mark a new step of the CUDA-graph trees, before the network runs (a no-op otherwise)."""
        if self.replays_cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()

    def keep(self, state: State) -> State:
        """What the task keeps of a step's outputs past the step: the state it hands to the next
        step, a value it logs (:func:`kept`; copied while graphs replay)."""
        return kept(state, copy=self.replays_cuda_graphs)


def own_gradients(net: torch.nn.Module) -> int:
    """Have every parameter keep a copy of its gradient, not the replayed backward's buffer.

    Autograd keeps a parameter's first gradient of a step by taking the tensor the backward
    produced as ``.grad``. Replayed as a CUDA graph, that tensor is a buffer of the graph, which the
    next replay overwrites: with gradient accumulation (``trainer.accumulate_grad_batches`` > 1)
    the next micro-batch would overwrite the gradient summed so far (CUDA-graph trees then fail,
    or the sum is silently wrong). A hook copies each gradient into fresh memory first: one copy
    per parameter and micro-batch, paid only when accumulating under replayed graphs.

    Returns:
        the number of parameters hooked
    """
    hooked = [p for p in net.parameters() if p.requires_grad]
    for p in hooked:
        p.register_hook(torch.clone)
    return len(hooked)
