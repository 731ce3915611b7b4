"""Dimension-wise fusion (DimFuse): merge DimConv's 3C channels into C_out channels.

DiCENet (thesis ch. 3, Sec. 3.3.1, Fig. 3.3), as in the official ``DICE`` layer:

1. BN and PReLU over the 3C input channels;
2. local fusion: a grouped 1x1 conv 3C -> C with C groups (each group sees the three dimension-wise
   responses of one channel when the input is interleaved), then BN and PReLU; call it Y_l;
3. global fusion: a spatial 3x3 conv C -> C_out with gcd(C, C_out) groups, BN and PReLU, multiplied
   by a channel gate sigmoid(1x1(C//4 -> C_out)(ReLU(1x1(C -> C//4)(GAP(Y_l))))). The gate has no
   BN and no biases; C//4 is floor division (92 -> 23).

BN and PReLU act per channel on whatever order the input has; with the official concat-then-shuffle
layout the converter permutes their parameters (``src.compat.edgenets``).
"""

from __future__ import annotations

import math

from torch import Tensor, nn


class DimFuse(nn.Module):
    """Local (grouped 1x1) then global (spatial 3x3 x channel gate) fusion of 3C channels.

    Args:
        channels: C; the input has 3C channels, consecutive triples fused into one channel.
        out_channels: C_out.

    Shape:
        (B, 3C, H, W) -> (B, C_out, H, W)
    """

    def __init__(self, channels: int, out_channels: int) -> None:
        super().__init__()
        if channels < 4 or out_channels < 1:
            raise ValueError(
                "need channels >= 4 (the gate's hidden width is channels // 4) and "
                "out_channels >= 1, "
                f"got channels={channels}, out_channels={out_channels}"
            )
        self.channels = channels
        self.out_channels = out_channels
        self.norm = nn.BatchNorm2d(3 * channels)
        self.act = nn.PReLU(3 * channels)
        # local fusion: (D_c, H_c, W_c) -> one channel
        self.local = nn.Sequential(
            nn.Conv2d(3 * channels, channels, 1, groups=channels, bias=False),
            nn.BatchNorm2d(channels),
            nn.PReLU(channels),
        )
        # global fusion, spatial part
        self.spatial = nn.Sequential(
            nn.Conv2d(
                channels,
                out_channels,
                3,
                padding=1,
                groups=math.gcd(channels, out_channels),
                bias=False,
            ),
            nn.BatchNorm2d(out_channels),
            nn.PReLU(out_channels),
        )
        # global fusion, channel gate (squeeze-excitation without BN or bias)
        hidden = channels // 4
        self.gate = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(channels, hidden, 1, bias=False),
            nn.ReLU(),
            nn.Conv2d(hidden, out_channels, 1, bias=False),
            nn.Sigmoid(),
        )

    def reset_parameters(self) -> None:
        """PyTorch's defaults for every conv, BN and PReLU (the state right after construction)."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.BatchNorm2d, nn.PReLU)):
                module.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != 3 * self.channels:
            raise ValueError(f"expected (B, {3 * self.channels}, H, W), got {tuple(x.shape)}")
        fused = self.local(self.act(self.norm(x)))  # (B, C, H, W)
        return self.spatial(fused) * self.gate(fused)  # (B, C_out, H, W) * (B, C_out, 1, 1)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, out_channels={self.out_channels}"
