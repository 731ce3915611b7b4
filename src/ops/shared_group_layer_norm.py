"""DeLighT's per-group LayerNorm: g contiguous chunks, each normalised alone, one shared affine.

Inside a DeLighT GLT (Mehta et al., 2021, Sec. 3.1; official code, README "GLT semantics" step 3)
the normalisation after the (shuffled) group linear map cuts the d-vector into g contiguous chunks
of d/g features and normalises each chunk over its own mean and variance. A single weight/bias pair
of length d/g is shared by all chunks, so this is neither a full-width LayerNorm (one set of
statistics) nor a per-group GroupNorm (one affine per group). With g = 1 it is ``nn.LayerNorm(d)``.
DExTra follows each such norm with a swish and dropout, fused with it on CUDA
(:func:`src.kernels.shared_group_layer_norm.shared_group_layer_norm_swish`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from src.kernels.shared_group_layer_norm import shared_group_layer_norm


class SharedGroupLayerNorm(nn.Module):
    """LayerNorm over each of ``groups`` contiguous feature chunks, affine shared by all chunks.

    Args:
        num_features: d, divisible by ``groups``.
        groups: g, the number of chunks normalised separately.
        eps: added to the variance.
        elementwise_affine: learn ``weight`` and ``bias`` of length d/g (shared by the chunks).

    Shape:
        (..., d) -> (..., d)
    """

    def __init__(
        self, num_features: int, groups: int, *, eps: float = 1e-5, elementwise_affine: bool = True
    ) -> None:
        super().__init__()
        if groups < 1 or num_features % groups:
            raise ValueError(
                f"num_features ({num_features}) must be divisible by groups ({groups})"
            )
        self.num_features = num_features
        self.groups = groups
        self.eps = eps
        chunk = num_features // groups
        self.weight = nn.Parameter(torch.empty(chunk)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.empty(chunk)) if elementwise_affine else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None and self.bias is not None:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return shared_group_layer_norm(x, self.groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"num_features={self.num_features}, groups={self.groups}, eps={self.eps}, "
            f"elementwise_affine={self.weight is not None}"
        )
