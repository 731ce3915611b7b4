"""The output side of the segment-recurrent language models (Transformer-XL, Group-Transformer):
a Linear over the vocabulary (character level) or the adaptive softmax that shares its tables with
the adaptive input (word level, Baevski & Auli 2019; :mod:`src.ops.adaptive_io`).

A network that mixes in :class:`AdaptiveHead` provides ``hidden_states(tokens, memories)`` and
holds ``embedding`` (an ``AdaptiveInputSoftmax`` at word level) and ``output`` (the Linear, or
None); the mix-in gives it ``forward`` (logits, or log-probabilities at word level, so that
sampling and cross-entropy read both alike) and ``loss`` (per-position NLL without forming the
(B, T, V) scores at word level: a WikiText-103 vocabulary has 267,744 words).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from src.ops.adaptive_io import AdaptiveInputSoftmax

# the fairseq dictionary's <pad> (src.datamodules.dictionary.PAD_ID): the adaptive input's zero row,
# never a target (the ordered segments never pad)
PADDING_IDX = 1

Memories = list[Tensor] | None


class AdaptiveHead:
    """``forward`` and ``loss`` of a segment-recurrent language model from its ``hidden_states``.

    Shape:
        forward: tokens (B, T), memories -> (B, T, V) logits (log-probabilities when adaptive),
        new memories; loss: tokens (B, T), targets (B, T), memories -> (B, T) float32 NLL (nats),
        new memories
    """

    embedding: nn.Module
    output: nn.Linear | None

    def hidden_states(self, tokens: Tensor, memories: Memories = None) -> tuple[Tensor, Memories]:
        raise NotImplementedError

    @property
    def adaptive(self) -> bool:
        """Whether the network reads and scores words through the adaptive input/softmax."""
        return isinstance(self.embedding, AdaptiveInputSoftmax)

    @staticmethod
    def adaptive_io(
        n_token: int,
        d_model: int,
        cutoffs: Sequence[int],
        factor: float,
        dropout: float,
        tie_weight: bool,
    ) -> AdaptiveInputSoftmax:
        """The adaptive input and softmax of a ``d_model``-wide network over ``n_token`` words."""
        if not tie_weight:
            raise ValueError(
                "the adaptive input and softmax share their band tables: cutoffs need "
                "tie_weight=true"
            )
        return AdaptiveInputSoftmax(
            n_token,
            cutoffs,
            initial_dim=d_model,
            output_dim=d_model,
            factor=factor,
            padding_idx=PADDING_IDX,
            dropout=dropout,
        )

    def forward(self, tokens: Tensor, memories: Memories = None) -> tuple[Tensor, Memories]:
        h, memories = self.hidden_states(tokens, memories)  # (B, T, D)
        if self.adaptive:
            return self.embedding.log_prob(h), memories  # (B, T, V) float32
        return self.output(h), memories  # (B, T, V)

    def loss(
        self, tokens: Tensor, targets: Tensor, memories: Memories = None
    ) -> tuple[Tensor, Memories]:
        """Negative log-likelihood of each target given its segment and the memories."""
        h, memories = self.hidden_states(tokens, memories)  # (B, T, D)
        if self.adaptive:
            return self.embedding.loss(h, targets, reduction="none"), memories
        logits = self.output(h)  # (B, T, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
        return nll.view_as(targets), memories
