"""Dropout, with the mask drawn by a counter-based hash on the CPU.

``F.dropout`` on the CPU draws its mask with ``bernoulli_``, which on CPUs where PyTorch does not
use MKL's vectorised generator (AMD's) runs element by element from one locked Mersenne Twister:
about 4 ns an element, a quarter of a small DeLighT's training step (its DExTra units drop out
after every GLT). ``lightnets_cpu::dropout_forward`` (``src/ops/cpu/dropout.cpp``) keeps element
i when a keyed 32-bit mix of i is at or above p 2^32, the key a 64-bit seed drawn from PyTorch's
default generator, so ``torch.manual_seed`` fixes the masks as it fixes ``F.dropout``'s; the
backward regenerates the mask from the seed (nothing is stored). The masks differ from
``bernoulli_``'s draws (another generator), with the same distribution: each element kept with
probability 1 - p independently to the quality of the mix, the kept ones scaled by 1 / (1 - p).

Elsewhere (CUDA, 16-bit and float64 tensors, ``torch.compile``, dispatch modes) it is
``F.dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from src.kernels.environment import cpu_path_mode
from src.ops.cpu import cpu_kernels_loaded, dispatch_mode_active


def _draw_seed() -> int:
    # one draw from the default CPU generator: torch.manual_seed fixes it
    return int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))


class HashDropoutFunction(torch.autograd.Function):
    """:func:`dropout` by the C++ kernels; the backward regenerates the forward's mask."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:  # type: ignore[override]
        seed = _draw_seed()
        ctx.p, ctx.seed = p, seed
        return torch.ops.lightnets_cpu.dropout_forward(x.contiguous(), p, seed).view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        grad_x = torch.ops.lightnets_cpu.dropout_backward(grad_y.contiguous(), ctx.p, ctx.seed)
        return grad_x.view(grad_y.shape), None


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
        and not torch.compiler.is_compiling()
        and not dispatch_mode_active()
        and cpu_path_mode() != "0"
        and cpu_kernels_loaded()
    ):
        return HashDropoutFunction.apply(x, p)
    return F.dropout(x, p, True)
