"""Group linear transformation (GLT): g independent linear maps over contiguous feature groups.

DeLighT (Mehta et al., 2021, Sec. 3.1) and the PRU context transform (Mehta et al., 2018, Sec. 3.2)
use the same layer: split the d_in features into g contiguous chunks, map chunk i with its own
(d_in/g x d_out/g) matrix, and concatenate; DeLighT then shuffles the output features across groups
so the next GLT mixes information between groups. g = 1 is an ordinary linear layer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from src.kernels import check_impl
from src.kernels.group_linear import group_linear


class GroupLinear(nn.Module):
    """``y = concat_i(x_i @ W_i + b_i)``, optionally feature-shuffled.

    Args:
        in_features: d_in, divisible by ``groups``.
        out_features: d_out, divisible by ``groups``.
        groups: g, the number of independent linear maps.
        bias: learn a bias per output feature.
        shuffle: interleave the groups' outputs (output feature ``j * g + i`` is unit j of group i).
        impl: ``"auto"`` (on CUDA the faster of the Triton kernel and the reference for each
            shape, :func:`src.kernels.group_linear.auto_path`), ``"reference"`` or ``"triton"``.

    Parameters (the official DeLighT/PRU layout): ``weight`` (g, d_in/g, d_out/g) used as
    ``x_i @ W_i`` (no transpose); ``bias`` (g, d_out/g).

    Shape:
        (..., d_in) -> (..., d_out)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        groups: int,
        *,
        bias: bool = True,
        shuffle: bool = False,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if groups < 1 or in_features % groups or out_features % groups:
            raise ValueError(
                f"in_features ({in_features}) and out_features ({out_features}) must be divisible "
                f"by groups ({groups})"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.groups = groups
        self.shuffle = shuffle
        self.impl = check_impl(impl)
        self.weight = nn.Parameter(
            torch.empty(groups, in_features // groups, out_features // groups)
        )
        self.bias = nn.Parameter(torch.empty(groups, out_features // groups)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's initialisation, per group (fan-in d_in / g)
        bound = 1.0 / math.sqrt(self.in_features // self.groups)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        return group_linear(x, self.weight, self.bias, shuffle=self.shuffle, impl=self.impl)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"groups={self.groups}, bias={self.bias is not None}, shuffle={self.shuffle}, "
            f"impl={self.impl!r}"
        )
