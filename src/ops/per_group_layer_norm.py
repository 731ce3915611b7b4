"""Group-Transformer's per-group layer norm: normalise each contiguous feature group on its own.

Group-Transformer (Park et al., 2020) normalises every group of the residual stream separately so
that no statistic mixes groups. The official norm is not ``nn.LayerNorm``: it divides by the
*unbiased* standard deviation plus ``eps`` (eps added to the std, not the variance), and its gain
and shift span the full width. DeLighT's shared-parameter group norm is a different op
(:mod:`src.ops.shared_group_layer_norm`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from src.kernels import check_impl
from src.kernels.per_group_layer_norm import per_group_layer_norm


class PerGroupLayerNorm(nn.Module):
    """``y = (x_g - mean(x_g)) / (std(x_g) + eps) * weight + bias`` for each of ``groups`` chunks.

    Args:
        num_features: the normalised (last) dimension, divisible by ``groups``.
        groups: number of contiguous chunks normalised separately; 1 normalises the full width.
        eps: added to the unbiased standard deviation.
        impl: the path of :func:`src.kernels.per_group_layer_norm.per_group_layer_norm`:
            ``"auto"`` (the fused C++ kernels on the CPU where they are built; on CUDA, per shape,
            the faster of the fused Triton kernel and the PyTorch path), ``"reference"`` (the
            PyTorch path) or ``"triton"``.

    Parameters: ``weight`` and ``bias``, each (num_features,), one gain and shift per feature.

    Shape:
        (..., num_features) -> (..., num_features)
    """

    def __init__(
        self, num_features: int, groups: int, *, eps: float = 1e-6, impl: str = "auto"
    ) -> None:
        super().__init__()
        if groups < 1 or num_features % groups:
            raise ValueError(
                f"num_features ({num_features}) must be divisible by groups ({groups})"
            )
        if num_features // groups < 2:
            raise ValueError(
                f"each group needs at least 2 features for an unbiased std, got "
                f"num_features={num_features}, groups={groups}"
            )
        self.num_features = num_features
        self.groups = groups
        self.eps = eps
        self.impl = check_impl(impl)
        self.weight = nn.Parameter(torch.empty(num_features))
        self.bias = nn.Parameter(torch.empty(num_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.num_features:
            raise ValueError(f"expected (..., {self.num_features}), got {tuple(x.shape)}")
        return per_group_layer_norm(
            x, self.weight, self.bias, self.groups, self.eps, impl=self.impl
        )

    def extra_repr(self) -> str:
        return (
            f"num_features={self.num_features}, groups={self.groups}, eps={self.eps}, "
            f"impl={self.impl!r}"
        )
