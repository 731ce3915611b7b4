"""DeLighT's per-group LayerNorm: g contiguous chunks, each normalised alone, one shared affine.

Inside a DeLighT GLT (Mehta et al., 2021, Sec. 3.1; official code, README "GLT semantics" step 3)
the normalisation after the (shuffled) group linear map cuts the d-vector into g contiguous chunks
of d/g features and normalises each chunk over its own mean and variance. A single weight/bias pair
of length d/g is shared by all chunks, so this is neither a full-width LayerNorm (one set of
statistics) nor a per-group GroupNorm (one affine per group). With g = 1 it is ``nn.LayerNorm(d)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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


def shared_group_layer_norm(
    x: Tensor, groups: int, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5
) -> Tensor:
    """Normalise each of ``groups`` contiguous chunks of the last axis; affine of length d/g.

    One ``F.layer_norm`` call over a (..., g, d/g) view: the chunk axis becomes a batch axis.

    Shape:
        x (..., d), weight and bias (d/g,) -> (..., d)
    """
    d = x.shape[-1]
    if groups < 1 or d % groups:
        raise ValueError(f"cannot cut {d} features into {groups} groups")
    # (..., d) -> (..., g, d/g)
    chunks = x.unflatten(-1, (groups, d // groups))
    if weight is not None and weight.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
        # a 16-bit input with float32 affine outside autocast: normalised in float32 and returned
        # in the input's dtype on every device (CUDA's layer_norm refuses the mix; the CPU's
        # computes it so too)
        out = F.layer_norm(chunks.float(), (d // groups,), weight.float(), _float(bias), eps)
        return out.to(x.dtype).flatten(-2)
    # (..., g, d/g) -> (..., d)
    return F.layer_norm(chunks, (d // groups,), weight, bias, eps).flatten(-2)


def _float(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.float()
