"""Networks used only by tests to drive the training loop into specific situations."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class DivergingNet(nn.Module):
    """A linear classifier whose logits turn NaN from the ``diverge_at``-th training forward on.

    Shape:
        (B, C, H, W) -> (B, num_classes)
    """

    def __init__(self, num_classes: int, in_chans: int, image_size: int, diverge_at: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_chans * image_size * image_size, num_classes)
        self.diverge_at = diverge_at
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        logits = self.linear(x.flatten(1))
        if self.training:
            self.calls += 1
            if self.calls >= self.diverge_at:
                logits = logits * torch.tensor(float("nan"))
        return logits
