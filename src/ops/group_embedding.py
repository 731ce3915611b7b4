"""Group embedding (Park et al., 2020, Sec. 3.1): the token embedding read as G feature groups.

The official model has no per-group embedding parameter: the token vector ``E[token] * sqrt(D)``
is split into G contiguous blocks of ``D / G`` features, and block g is the input of group g of
every later group layer. This op therefore returns the full (B, T, D) vector; ``x.unflatten(-1,
(G, D // G))`` is its grouped view.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GroupEmbedding(nn.Module):
    """``x = E[token] * sqrt(d_model)``; group g is features ``[g*D/G, (g+1)*D/G)``.

    Args:
        n_token: vocabulary size.
        d_model: D, the embedding width (the official model's ``d_embed == d_model``, no
            adaptive embedding).

    Parameters: ``weight`` (n_token, d_model), initialised N(0, 1/d_model) so that the scaled
    embedding has unit variance.

    Shape:
        (B, T) token ids -> (B, T, d_model)
    """

    def __init__(self, n_token: int, d_model: int) -> None:
        super().__init__()
        if n_token < 1 or d_model < 1:
            raise ValueError(f"n_token ({n_token}) and d_model ({d_model}) must be positive")
        self.n_token = n_token
        self.d_model = d_model
        self.weight = nn.Parameter(torch.empty(n_token, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.d_model**-0.5)

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.weight) * math.sqrt(self.d_model)

    def extra_repr(self) -> str:
        return f"n_token={self.n_token}, d_model={self.d_model}"
