"""The DiCE unit (DimConv + DimFuse), its strided form, and the ShuffleNet-style DiCENet unit.

DiCENet (thesis ch. 3, Sec. 3.3 and Fig. 3.5). Matches the official EdgeNets ``DICE``,
``StridedDICE`` and ``ShuffleDICEBlock``:

- :class:`DiCE`: DimConv (three dimension-wise depth-wise convolutions, interleaved) followed by
  DimFuse. The official code concatenates the branches, applies BN + PReLU and then shuffles with 3
  groups; interleaving first and normalising after is the same map with permuted BN/PReLU
  parameters. With ``shuffle=False`` (not used by the released models) the official code skips the
  shuffle, so the grouped 1x1 conv fuses consecutive channels of the concatenation; that is
  DimConv with ``interleave=False``.
- :class:`StridedDiCE`: left = depth-wise 3x3 stride-2 CBR then 1x1 CBR; right = AvgPool(3, 2, 1)
  (padding counted), DiCE, 1x1 CBR; concatenate [left, right] and shuffle with 2 groups: C -> 2C
  at half resolution (thesis Sec. 3.3.2).
- :class:`DiCEShuffleUnit`: the ShuffleNetv2 unit with DiCE in place of its depth-wise conv. The
  first round(split_ratio * C_in) channels pass through; the rest go through a 1x1 CBR and DiCE;
  concatenate and shuffle. The first unit of a stage widens C_in -> C_out, so the right branch
  outputs C_out - round(split_ratio * C_in) channels. As in the official code there is no 1x1 CBR
  after the DiCE (ShuffleNetv2 has one after its depth-wise conv).

"CBR" is conv (no bias) + BN + PReLU (per channel).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from src.ops.dim_conv import DimConv
from src.ops.dim_fuse import DimFuse
from src.ops.shuffle import channel_shuffle


def _reset_children(module: nn.Module) -> None:
    """PyTorch's default initialisation for every conv, BN, PReLU and DimConv below ``module``."""
    for child in module.modules():
        if child is not module and isinstance(
            child, (nn.Conv2d, nn.BatchNorm2d, nn.PReLU, DimConv)
        ):
            child.reset_parameters()


class DiCE(nn.Module):
    """Dimension-wise convolution and fusion: DimConv (C -> 3C) then DimFuse (3C -> C_out).

    Args:
        in_channels: C.
        out_channels: C_out.
        height: H_b, the height the height-wise kernels are built for.
        width: W_b, the width the width-wise kernels are built for.
        kernel_size: k of the three dimension-wise convolutions.
        dilation: (d_channel, d_height, d_width).
        shuffle: interleave the dimension-wise responses per channel before the local fusion (the
            thesis's DiCE and every released model); False fuses consecutive concatenated channels.
        impl: DimConv's ``"auto" | "reference" | "triton"``.

    Shape:
        (B, C, H, W) -> (B, C_out, H, W), any H and W (see :class:`DimConv`).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        height: int,
        width: int,
        *,
        kernel_size: int = 3,
        dilation: tuple[int, int, int] = (1, 1, 1),
        shuffle: bool = True,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        self.dim_conv = DimConv(
            in_channels,
            height,
            width,
            kernel_size=kernel_size,
            dilation=dilation,
            interleave=shuffle,
            impl=impl,
        )
        self.dim_fuse = DimFuse(in_channels, out_channels)

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.dim_fuse(self.dim_conv(x))


class StridedDiCE(nn.Module):
    """The strided DiCE unit: two half-resolution branches, concatenated and shuffled.

    Args:
        in_channels: C (the output has 2C).
        height: H_b of the inner DiCE (the output height, e.g. 28 for a 56 x 56 input).
        width: W_b of the inner DiCE.
        kernel_size, dilation, shuffle, impl: of the inner :class:`DiCE`.

    Shape:
        (B, C, H, W) -> (B, 2C, ceil(H / 2), ceil(W / 2))
    """

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        *,
        kernel_size: int = 3,
        dilation: tuple[int, int, int] = (1, 1, 1),
        shuffle: bool = True,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        c = in_channels
        self.in_channels = in_channels
        self.left = nn.Sequential(
            nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c, bias=False),
            nn.BatchNorm2d(c),
            nn.PReLU(c),
            nn.Conv2d(c, c, 1, bias=False),
            nn.BatchNorm2d(c),
            nn.PReLU(c),
        )
        self.pool = nn.AvgPool2d(3, stride=2, padding=1)
        self.dice = DiCE(
            c,
            c,
            height,
            width,
            kernel_size=kernel_size,
            dilation=dilation,
            shuffle=shuffle,
            impl=impl,
        )
        self.right = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.PReLU(c))

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        right = self.right(self.dice(self.pool(x)))
        # [(B, C, H/2, W/2), (B, C, H/2, W/2)] -> (B, 2C, H/2, W/2), shuffled
        return channel_shuffle(torch.cat((self.left(x), right), dim=1), 2)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}"


class DiCEShuffleUnit(nn.Module):
    """The DiCENet unit: channel split, (1x1 CBR -> DiCE) on one part, concatenation, shuffle.

    Args:
        in_channels: C_in.
        out_channels: C_out (>= C_in; the first unit of a stage widens).
        height: H_b of the DiCE.
        width: W_b of the DiCE.
        split_ratio: the fraction of C_in passed through unchanged (rounded to a channel count).
        groups: the channel-shuffle groups after the concatenation.
        impl: the DiCE's DimConv implementation.

    Shape:
        (B, C_in, H, W) -> (B, C_out, H, W)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        height: int,
        width: int,
        *,
        split_ratio: float = 0.5,
        groups: int = 2,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        passed = round(split_ratio * in_channels)
        right_in, right_out = in_channels - passed, out_channels - passed
        if not 0 < passed < in_channels or right_out < 1 or out_channels % groups:
            raise ValueError(
                f"split_ratio={split_ratio} of in_channels={in_channels} passes {passed} channels; "
                f"need 0 < passed < in_channels, out_channels ({out_channels}) > passed and "
                f"out_channels divisible by groups ({groups})"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.passed = passed
        self.groups = groups
        self.reduce = nn.Sequential(
            nn.Conv2d(right_in, right_out, 1, bias=False),
            nn.BatchNorm2d(right_out),
            nn.PReLU(right_out),
        )
        self.dice = DiCE(right_out, right_out, height, width, impl=impl)

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        # (B, C_in, H, W) -> (B, passed, H, W) and (B, C_in - passed, H, W)
        left, right = x.split((self.passed, self.in_channels - self.passed), dim=1)
        out = torch.cat((left, self.dice(self.reduce(right))), dim=1)  # (B, C_out, H, W)
        return channel_shuffle(out, self.groups)

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"passed={self.passed}, groups={self.groups}"
        )
