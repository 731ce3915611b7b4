"""Which padded keys the self-attention of a batch masks (fairseq's rule, kept traceable).

fairseq passes a key padding mask to self-attention only when the batch has a padded position,
so a batch without any runs the unmasked (causal) kernel. Deciding that reads the batch on the
host, a synchronisation a traced step (torch.compile, CUDA graphs) cannot make, so there the mask
is always passed: an all-False mask changes no score, so the result is the same.
"""

from __future__ import annotations

import torch
from torch import Tensor


def keys_to_mask(padding_mask: Tensor) -> Tensor | None:
    """``padding_mask`` when the batch has a padded position or is being traced, else None.

    Shape:
        (B, T) bool, True = pad -> (B, T) bool or None
    """
    if torch.compiler.is_compiling() or bool(padding_mask.any()):
        return padding_mask
    return None
