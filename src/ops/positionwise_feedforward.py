"""Transformer-XL's position-wise feed-forward sublayer (Dai et al., 2019; kimiyoung's
``PositionwiseFF``): the full-width FFN of the Transformer-XL and of the Group-Transformer's
ablations without group feed-forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from src.kernels.dropout import dropout


class PositionwiseFeedForward(nn.Module):
    """Transformer-XL's position-wise FFN sublayer: ``y = W2 dropout(ReLU(W1 x + b1)) + b2``.

    Post-norm: ``norm(x + dropout(y))``; pre-norm: ``x + dropout(y(norm(x)))``.

    Args:
        d_model: D.
        d_inner: hidden width (4D in the papers).
        dropout: dropout after the ReLU and on the output.
        pre_norm: normalise the input instead of the residual sum.

    Parameters: ``linear_1`` (D -> d_inner), ``linear_2`` (d_inner -> D), ``norm``:
    ``2 D d_inner + d_inner + 3D``.

    Shape:
        (..., D) -> (..., D)
    """

    def __init__(
        self, d_model: int, d_inner: int, *, dropout: float = 0.0, pre_norm: bool = False
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.pre_norm = pre_norm
        self.linear_1 = nn.Linear(d_model, d_inner)
        self.linear_2 = nn.Linear(d_inner, d_model)
        self.norm = nn.LayerNorm(d_model)

    def reset_parameters(self) -> None:
        for module in self.children():
            module.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(x) if self.pre_norm else x
        y = dropout(torch.relu(self.linear_1(y)), p=self.dropout, training=self.training)
        out = x + dropout(self.linear_2(y), p=self.dropout, training=self.training)
        return out if self.pre_norm else self.norm(out)

    def extra_repr(self) -> str:
        return f"dropout={self.dropout}, pre_norm={self.pre_norm}"
