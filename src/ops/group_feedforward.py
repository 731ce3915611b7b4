"""Group feed-forward (Park et al., 2020, Sec. 3.3): per-group FFNs and a low-rank inter-group map.

Each of the G feature groups (``D_g = D / G`` contiguous features) runs its own two-layer FFN.
Before it, an inter-group map lets every group read every other one cheaply: a grouped linear
``D -> D`` followed by a feature shuffle, so that target group g' receives ``M = D_g / G``
features from each source group (interleaved, source group fastest). This is the paper's
low-rank ``W^{inter[1]}_{g'g}`` (Eqs. 5-7) realised with one grouped map and a permutation. The
first FFN linear of group g reads ``[x_g, inter_g]`` (2 D_g features). As in the official code,
the inter path is normalised on its own (``inter_norm``), the raw and inter halves of the FFN input
are normalised separately (``input_norm``), and the hidden layer is normalised between the ReLU
and the second linear (``hidden_norm``); none of these norms appears in the paper's equations.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from src.kernels.dropout import dropout
from src.ops.group_linear import GroupLinear
from src.ops.per_group_layer_norm import PerGroupLayerNorm


class GroupFeedForward(nn.Module):
    """One pre-norm group feed-forward sublayer: ``out = x + dropout(y)``.

    With ``t = shuffle(inter_linear(norm_g(x)))`` and ``z_g = [x_g, t_g]``:
    ``y_g = intra_linear_2_g(norm(ReLU(intra_linear_1_g(norm(z)_g))))``.

    Args:
        d_model: D, divisible by ``groups``; ``D / groups`` divisible by ``groups`` when
            ``inter_group`` (each group sends ``M = D_g / G`` features to every group).
        d_inner: hidden width of all groups together (4D in the paper), divisible by ``groups``.
        groups: G, the number of feature groups.
        inter_group: keep the inter-group path; False is the paper's ablation without
            inter-group operations in the FFN (independent per-group FFNs on ``x_g`` alone).
        dropout: dropout on ``y``. The paper applies it; the official code ignores its dropout
            argument, so 0.0 reproduces the official model.

    Parameters: ``inter_norm``, ``input_norm``, ``hidden_norm`` (PerGroupLayerNorm),
    ``inter_linear`` (GroupLinear D -> D, bias, shuffled output), ``intra_linear_1`` (GroupLinear
    2D -> d_inner, bias), ``intra_linear_2`` (GroupLinear d_inner -> D, bias). With
    ``d_inner = 4D``: weights ``13D^2/G``, biases ``6D``, norm parameters ``14D``.

    Shape:
        (..., D) -> (..., D)
    """

    def __init__(
        self,
        d_model: int,
        d_inner: int,
        groups: int,
        *,
        inter_group: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        _check_widths(d_model, d_inner, groups, inter_group)
        self.d_model = d_model
        self.d_inner = d_inner
        self.groups = groups
        self.d_group = d_model // groups
        self.inter_group = inter_group
        self.dropout = dropout
        if inter_group:
            self.inter_norm = PerGroupLayerNorm(d_model, groups)
            self.inter_linear = GroupLinear(d_model, d_model, groups, shuffle=True)
        else:
            self.inter_norm = self.inter_linear = None
        # with the inter path each group's input is [x_g, t_g], normalised half by half
        d_input = 2 * d_model if inter_group else d_model
        self.input_norm = PerGroupLayerNorm(d_input, d_input // self.d_group)
        self.intra_linear_1 = GroupLinear(d_input, d_inner, groups)
        self.hidden_norm = PerGroupLayerNorm(d_inner, groups)
        self.intra_linear_2 = GroupLinear(d_inner, d_model, groups)

    def reset_parameters(self) -> None:
        for module in self.children():
            module.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        z = x
        if self.inter_linear is not None:
            t = self.inter_linear(self.inter_norm(x))  # (..., D), shuffled across groups
            per_group = (self.groups, self.d_group)
            # (..., G, D_g) and (..., G, D_g) -> (..., G, 2 D_g) -> (..., 2D)
            z = torch.cat([x.unflatten(-1, per_group), t.unflatten(-1, per_group)], -1).flatten(-2)
        y = torch.relu(self.intra_linear_1(self.input_norm(z)))  # (..., d_inner)
        y = self.intra_linear_2(self.hidden_norm(y))  # (..., D)
        return x + dropout(y, p=self.dropout, training=self.training)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_inner={self.d_inner}, groups={self.groups}, "
            f"inter_group={self.inter_group}, dropout={self.dropout}"
        )


def _check_widths(d_model: int, d_inner: int, groups: int, inter_group: bool) -> None:
    """ValueError unless ``groups`` divides D and d_inner, and D / G too with the inter path."""
    if groups < 1 or d_model % groups or d_inner % groups:
        raise ValueError(
            f"d_model ({d_model}) and d_inner ({d_inner}) must be divisible by groups ({groups})"
        )
    if inter_group and (d_model // groups) % groups:
        raise ValueError(
            f"the inter-group shuffle needs d_model / groups ({d_model // groups}) divisible "
            f"by groups ({groups})"
        )
