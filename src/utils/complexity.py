"""The one parameter and multiply-add counter of the project.

MACs follow the papers' convention: a multiply-add counts once, so MACs = FLOPs / 2 as counted
by ``torch.utils.flop_counter.FlopCounterMode``. That counter sees the matrix products of the
network: convolutions (including transposed, grouped and depth-wise), linear layers (``mm``,
``addmm``), batched matrix products (``bmm``, ``baddbmm``) and fused attention. Normalisation,
activations, pooling, element-wise additions and resampling are not counted, as in the papers.
``macs_conv`` is the convolution-only part (the convention of the EdgeNets counter).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class Complexity:
    """Parameters and multiply-adds of one forward pass on ``input_shape``."""

    params: int
    trainable_params: int
    macs: int
    macs_conv: int
    macs_by_op: dict[str, int]
    input_shape: tuple[int, ...] | tuple[tuple[int, ...], ...]

    def as_dict(self) -> dict:
        return {
            "params": self.params,
            "trainable_params": self.trainable_params,
            "macs": self.macs,
            "macs_conv": self.macs_conv,
            "macs_by_op": self.macs_by_op,
            "input_shape": [list(s) if isinstance(s, tuple) else s for s in self.input_shape],
        }


def count_params(module: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of distinct parameters (shared tensors count once)."""
    # module.parameters() yields a tied Parameter once; by identity, so meta-device modules count
    # too
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def measure(module: nn.Module, example_input: Tensor | tuple) -> Complexity:
    """Count parameters and MACs of ``module(example_input)`` in eval mode; a tuple is passed as
    the positional arguments (an encoder-decoder's sources and targets), its tensors' shapes
    becoming ``input_shape``.

    Autograd stays on: without it, eval-mode blocks take their folded inference path
    (:mod:`src.kernels.inference_folding`), which computes the same map with fewer, differently
    shaped products; the papers count the network as defined.
    """
    was_training = module.training
    module.eval()
    counter = FlopCounterMode(display=False)
    try:
        with torch.enable_grad(), counter:
            if isinstance(example_input, tuple):
                module(*example_input)
            else:
                module(example_input)
    finally:
        module.train(was_training)
    by_op = {
        str(op).split(".")[-1]: int(flops) // 2
        for op, flops in counter.get_flop_counts()["Global"].items()
    }
    conv = sum(macs for op, macs in by_op.items() if "convolution" in op)
    return Complexity(
        params=count_params(module),
        trainable_params=count_params(module, trainable_only=True),
        macs=int(counter.get_total_flops()) // 2,
        macs_conv=conv,
        macs_by_op=by_op,
        input_shape=(
            tuple(tuple(x.shape) for x in example_input if isinstance(x, Tensor))
            if isinstance(example_input, tuple)
            else tuple(example_input.shape)
        ),
    )
