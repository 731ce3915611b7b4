"""Channels-last training for the image tasks.

The vision networks' CPU kernels (PReLU's and BatchNorm's backward, DimConv, the local-fusion and
dilated depth-wise convolutions, ``src/kernels/cpu``) read rows of channels, and on GPUs cuDNN's
convolutions under mixed precision want the same layout. A DiCENet s=0.5 training step on the
digits (batch 32 of 32², 2 cores) took 106.5 ms NCHW against 62.6 ms channels-last; DiCENet and
ESPNetv2 s=1.0 at 4 x 224²: 155.8 / 167.2 ms against 118.4 / 115.4 ms. The tasks therefore
convert the network's parameters once and every batch of images (a copy only where the loader's
layout differs), unless ``channels_last=False``. The state-dict keys and values do not change, so
checkpoints load either way.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def channels_last_network(net: nn.Module) -> nn.Module:
    """``net`` with its 4-D parameters and buffers in channels-last layout, in place."""
    return net.to(memory_format=torch.channels_last)


def channels_last_images(images: Tensor) -> Tensor:
    """A (B, C, H, W) batch in channels-last layout (other ranks unchanged).

    Shape:
        (B, C, H, W) -> (B, C, H, W)
    """
    return images.contiguous(memory_format=torch.channels_last) if images.dim() == 4 else images
