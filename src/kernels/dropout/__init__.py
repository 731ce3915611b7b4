"""Dropout, with the mask drawn by a counter-based hash on the CPU.

``F.dropout`` on the CPU draws its mask with ``bernoulli_``, which on CPUs where PyTorch does not
use MKL's vectorised generator (AMD's) runs element by element from one locked Mersenne Twister:
about 4 ns an element, a quarter of a small DeLighT's training step (its DExTra units drop out
after every GLT). ``lightnets_cpu::dropout_forward`` (``src/kernels/dropout/dropout.cpp``) keeps
element i when a keyed 32-bit mix of i is at or above p 2^32, the key a 64-bit seed drawn from
PyTorch's default generator as a tensor (:func:`src.kernels.dropout.contract.draw_seed`), so
``torch.manual_seed`` fixes the masks as it fixes ``F.dropout``'s and a graph traced by
``torch.compile`` draws a new one on every call; the backward regenerates the mask from the saved
seed (nothing else is stored). The masks differ from ``bernoulli_``'s draws (another generator),
with the same distribution: each element kept with probability 1 - p independently to the quality
of the mix, the kept ones scaled by 1 / (1 - p). Traced, the kernel is the custom op
``lightnets::hashed_dropout``, one node forward and one backward.

Elsewhere (CUDA, 16-bit and float64 tensors, dispatch modes) it is ``F.dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from src.kernels.cpu import cpu_kernels_loaded, dispatch_mode_active
from src.kernels.custom_ops import autograd_op
from src.kernels.dispatch import opaque_op
from src.kernels.dropout import contract as contract


@opaque_op("lightnets::hashed_dropout_backward", contract.BACKWARD_SCHEMA, contract.backward_fake)
def hashed_dropout_backward(grad_y: Tensor, seed: Tensor, p: float) -> Tensor:
    """``lightnets_cpu::dropout_backward``: the output gradient through the forward's mask (drawn
    again from ``seed``), scaled by 1 / (1 - p).

    Shape:
        grad_y any, contiguous; seed (1,) int64 -> grad_y's shape
    """
    return torch.ops.lightnets_cpu.dropout_backward(grad_y, p, seed)


def _keep_seed(ctx, inputs: tuple, output: Tensor) -> None:
    _, seed, p = inputs
    ctx.save_for_backward(seed)
    ctx.p = p


def _through_mask(ctx, grad_y: Tensor) -> tuple[Tensor, None, None]:
    (seed,) = ctx.saved_tensors
    return hashed_dropout_backward(grad_y.contiguous(), seed, ctx.p), None, None


@autograd_op(
    "lightnets::hashed_dropout",
    contract.FORWARD_SCHEMA,
    contract.forward_fake,
    setup_context=_keep_seed,
    backward=_through_mask,
)
def hashed_dropout(x: Tensor, seed: Tensor, p: float) -> Tensor:
    """``lightnets_cpu::dropout_forward``: x with the elements the mask of ``seed`` drops zeroed,
    the kept ones scaled by 1 / (1 - p); differentiable, the backward applying the same mask.

    Shape:
        x any, contiguous float32; seed (1,) int64 -> x's shape
    """
    return torch.ops.lightnets_cpu.dropout_forward(x, p, seed)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)``, with the hashed mask on float32 CPU tensors (module
    docstring).

    Shape:
        any -> the same
    """
    if not training or p == 0.0:
        return x
    if (
        0.0 < p < 1.0
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and not dispatch_mode_active()
        and cpu_kernels_loaded()
    ):
        seed = contract.draw_seed(x.device)
        return hashed_dropout(x.contiguous(), seed, p)
    return F.dropout(x, p, True)
