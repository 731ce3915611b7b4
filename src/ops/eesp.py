"""ESPNetv2's EESP unit, its depth-wise dilated separable convolution, and the strided down-sampler.

ESPNetv2 (Mehta et al., CVPR 2019, Sec. 3; thesis ch. 2), matching the official EdgeNets ``EESP``
and ``DownSampler``:

- :class:`DepthwiseDilatedSeparableConv` (Sec. 3.1): a depth-wise dilated k x k conv followed by a
  point-wise 1x1 conv. EESP factorises it differently (point-wise first, shared by K depth-wise
  branches), so EESP uses :func:`depthwise_dilated_conv` for its branches.
- :class:`EESP` (Fig. 1c): reduce (grouped 1x1 CBR, K groups, C_in -> n = C_out / K), split and
  transform (K depth-wise dilated 3x3 convs on the n channels, no BN, strided when stride = 2),
  hierarchical feature fusion (cumulative sum in ascending dilation), concatenate, BN + PReLU,
  merge (grouped 1x1 conv, K groups, + BN), then the residual (when shapes agree) and PReLU. The
  strided unit with ``down_method="avg"`` returns after the merge, as inside the down-sampler.
  Dilations: kernel sizes 3 + 2i (i < K), each above ``r_lim`` replaced by 3, sorted;
  d = (k - 1) / 2.
- :class:`EESPDownsampler` (Fig. 2.4 / Fig. 1d): [AvgPool(3, 2, 1)(x), EESP(C_in -> C_out - C_in,
  stride 2)(x)] concatenated, plus the long-range shortcut to the input image: the image
  average-pooled (3, 2, 1) from full size until it has the output's size, a 3x3 CBR and a 1x1 conv +
  BN to C_out, added; then PReLU. The official loop compares heights only (it assumes square
  inputs) and pools at least once; here both height and width are compared, an image already at
  the output size is used as is, and an image that cannot reach the output size raises
  ``ValueError`` (the official loop would not end).

"CBR" is conv (no bias) + BN + PReLU (per channel); AvgPool counts the padding.

The fused paths a unit can take are in :mod:`src.kernels.eesp`: on CUDA the pyramid (K
convolutions, HFF, BN, PReLU) as one Triton pass, in training too (``impl``,
:func:`src.kernels.eesp.pyramid_path`); in CPU inference with ``impl="auto"`` the BNs folded into
the 1x1 convolutions and the pyramid in one call of the C++ kernel ``src/kernels/eesp/eesp.cpp``
where it is built (``cpu_kernel``); the same map up to float rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from src.kernels import check_impl
from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import FusingSequential, batch_norm_prelu
from src.kernels.depthwise_conv import DepthwiseConv2d
from src.kernels.eesp import folded_forward, fused_pyramid
from src.kernels.inference_folding import ConvBNPReLU
from src.kernels.pointwise_conv import PointwiseConv2d
from src.kernels.pooling import AvgPool2d, avg_pool2d
from src.kernels.prelu import PReLU


def depthwise_dilated_conv(
    channels: int, *, kernel_size: int = 3, dilation: int = 1, stride: int = 1
) -> nn.Conv2d:
    """A depth-wise k x k conv with "same" padding ``dilation * (k - 1) / 2`` and no bias.

    Shape:
        (B, C, H, W) -> (B, C, ceil(H / stride), ceil(W / stride)) for odd k.
    """
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd, got {kernel_size}")
    padding = dilation * (kernel_size - 1) // 2
    # an nn.Conv2d whose CPU backward of a dilated kernel is a one-pass kernel
    return DepthwiseConv2d(
        channels, kernel_size, stride=stride, padding=padding, dilation=dilation, bias=False
    )


class DepthwiseDilatedSeparableConv(nn.Module):
    """Depth-wise dilated k x k conv, then a (grouped) point-wise 1x1 conv; no norm, no bias.

    Args:
        in_channels: C_in.
        out_channels: C_out.
        kernel_size: k (odd).
        dilation: d of the depth-wise conv.
        stride: of the depth-wise conv.
        groups: of the point-wise conv.

    Shape:
        (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride))
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        kernel_size: int = 3,
        dilation: int = 1,
        stride: int = 1,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.depthwise = depthwise_dilated_conv(
            in_channels, kernel_size=kernel_size, dilation=dilation, stride=stride
        )
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, groups=groups, bias=False)

    def reset_parameters(self) -> None:
        self.depthwise.reset_parameters()
        self.pointwise.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return self.pointwise(self.depthwise(x))


def eesp_dilations(branches: int, r_lim: int) -> tuple[int, ...]:
    """Dilation of each EESP branch: kernel sizes 3 + 2i clipped to 3 above ``r_lim``, sorted."""
    sizes = sorted(k if k <= r_lim else 3 for k in (3 + 2 * i for i in range(branches)))
    return tuple((k - 1) // 2 for k in sizes)


DOWN_METHODS = ("esp", "avg")


def _reset_children(module: nn.Module) -> None:
    """Re-initialise every convolution, BN and PReLU under ``module``."""
    for child in module.modules():
        if isinstance(child, (nn.Conv2d, nn.BatchNorm2d, nn.PReLU)):
            child.reset_parameters()


class EESP(nn.Module):
    """Extremely efficient spatial pyramid of depth-wise dilated separable convolutions.

    Args:
        in_channels: C_in, divisible by ``branches``.
        out_channels: C_out, divisible by ``branches`` squared.
        stride: 1 or 2 (of the depth-wise branches).
        branches: K, the number of parallel dilated branches and the 1x1 convs' groups.
        r_lim: the receptive-field limit that sets the dilations (:func:`eesp_dilations`).
        down_method: with stride 2, ``"avg"`` returns after the merge (no residual, no PReLU), as
            inside :class:`EESPDownsampler`; ``"esp"`` applies the final PReLU.
        hff: hierarchical feature fusion (thesis Table 2.5); False concatenates the branches as
            they are.
        impl: the pyramid's path: ``"auto"`` (on CUDA, per shape and mode the faster of the fused
            Triton pass, :mod:`src.kernels.eesp.triton_kernel`, and the eager ops,
            :func:`src.kernels.eesp.pyramid_path`; in CPU inference the folded path,
            :func:`src.kernels.eesp.folded_forward`), ``"reference"`` or ``"triton"``.

    Shape:
        (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride))
    """

    #: take the fused C++ kernel for the pyramid in CPU inference (False: eager calls;
    #: :func:`src.kernels.eesp.cpu_pyramid`)
    cpu_kernel: bool = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        stride: int = 1,
        branches: int = 4,
        r_lim: int = 7,
        down_method: str = "esp",
        hff: bool = True,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if branches < 1 or in_channels % branches or out_channels % (branches * branches):
            raise ValueError(
                f"in_channels ({in_channels}) must be divisible by branches ({branches}) and "
                f"out_channels ({out_channels}) by branches**2 (the reduced width "
                "out_channels / branches feeds a conv with branches groups)"
            )
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        if down_method not in DOWN_METHODS:
            raise ValueError(f"down_method must be one of {DOWN_METHODS}, got {down_method!r}")
        n = out_channels // branches
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.stride = stride
        self.down_method = down_method
        self.hff = hff
        self.impl = check_impl(impl)
        self.dilations = eesp_dilations(branches, r_lim)
        self.reduce = ConvBNPReLU(in_channels, n, 1, groups=branches)
        self.transform = nn.ModuleList(
            depthwise_dilated_conv(n, dilation=d, stride=stride) for d in self.dilations
        )
        self.fuse_norm = BatchNorm2d(out_channels)
        self.fuse_act = PReLU(out_channels)
        self.merge = nn.Sequential(
            nn.Conv2d(out_channels, out_channels, 1, groups=branches, bias=False),
            BatchNorm2d(out_channels),
        )
        self.act = PReLU(out_channels)

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        fused = folded_forward(self, x)  # CPU inference: BNs folded, the pyramid in one C++ call
        if fused is not None:
            return fused
        reduced = self.reduce(x)  # reduce, a grouped 1x1 CBR: (B, n, H, W)
        pyramid = self._pyramid(reduced)  # split, transform, HFF, BN + PReLU: (B, K n, H', W')
        if self.stride == 2 and self.down_method == "avg":
            return self.merge(pyramid)  # the down-sampler adds its own shortcuts and PReLU
        conv, norm = self.merge
        merged = conv(pyramid)  # merge (expand), a grouped 1x1 conv: (B, C_out, H', W')
        # BN, the residual (where the shapes agree) and PReLU, as one op where it applies
        residual = x if merged.shape == x.shape else None
        return batch_norm_prelu(merged, norm, self.act, residual=residual)

    def _pyramid(self, reduced: Tensor) -> Tensor:
        """Split, transform, hierarchical fusion, concatenation, BN and PReLU.

        Shape:
            (B, n, H, W) -> (B, K n, H', W')
        """
        fused = fused_pyramid(self, reduced)  # one Triton pass where it applies
        if fused is not None:
            return fused
        # K depth-wise dilated convolutions of the reduced map, in ascending dilation
        outputs = [self.transform[0](reduced)]
        for conv in self.transform[1:]:
            # hierarchical feature fusion: branch k adds the fused output of branch k - 1
            outputs.append(conv(reduced) + outputs[-1] if self.hff else conv(reduced))
        # K x (B, n, H', W') -> (B, K n, H', W'), then BN and PReLU
        return batch_norm_prelu(torch.cat(outputs, dim=1), self.fuse_norm, self.fuse_act)

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"stride={self.stride}, dilations={self.dilations}, down_method={self.down_method!r}, "
            f"hff={self.hff}, impl={self.impl!r}"
        )


class EESPDownsampler(nn.Module):
    """ESPNetv2's strided EESP block with the average-pool shortcut and the input-image shortcut.

    Args:
        in_channels: C_in.
        out_channels: C_out > C_in; the strided EESP produces C_out - C_in of them.
        branches: K of the EESP.
        r_lim: the EESP's receptive-field limit.
        image_channels: channels of the image given to :meth:`forward` for the long-range
            shortcut; ``None`` builds no shortcut.

    Shape:
        x (B, C_in, H, W), image (B, image_channels, H_img, W_img) or None
        -> (B, C_out, ceil(H / 2), ceil(W / 2))
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        branches: int = 4,
        r_lim: int = 9,
        image_channels: int | None = 3,
    ) -> None:
        super().__init__()
        if out_channels <= in_channels:
            raise ValueError(
                f"out_channels ({out_channels}) must exceed in_channels ({in_channels})"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.pool = AvgPool2d(3, stride=2, padding=1)
        self.eesp = EESP(
            in_channels,
            out_channels - in_channels,
            stride=2,
            branches=branches,
            r_lim=r_lim,
            down_method="avg",
        )
        self.image_shortcut = None
        if image_channels is not None:
            c = image_channels
            self.image_shortcut = FusingSequential(
                nn.Conv2d(c, c, 3, padding=1, bias=False),
                BatchNorm2d(c),
                PReLU(c),
                PointwiseConv2d(c, out_channels, bias=False),
                BatchNorm2d(out_channels),
            )
        self.act = PReLU(out_channels)

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor, image: Tensor | None = None) -> Tensor:
        pooled = self.pool(x)  # (B, C_in, H/2, W/2)
        out = torch.cat((pooled, self.eesp(x)), dim=1)  # (B, C_out, H/2, W/2)
        if image is not None:
            if self.image_shortcut is None:
                raise ValueError(
                    "an image was given, but the block was built with image_channels=None"
                )
            out = out + self.image_shortcut(pool_to(image, out.shape[-2:]))
        return self.act(out)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, out_channels={self.out_channels}"


def halve(image: Tensor) -> Tensor:
    """One step of :func:`pool_to`: average pool (3, 2, 1).

    Shape:
        (B, C, H, W) -> (B, C, ceil(H / 2), ceil(W / 2))
    """
    return avg_pool2d(image, 3, stride=2, padding=1)


def image_pyramid(image: Tensor, steps: int) -> list[Tensor]:
    """``image`` halved (:func:`halve`) 1, 2, ..., ``steps`` times, each from the one before: the
    images that :func:`pool_to` gives for those sizes, at one pool per level.

    Shape:
        (B, C, H, W) -> [(B, C, ceil(H / 2^s), ceil(W / 2^s)) for s = 1..steps]
    """
    levels = []
    for _ in range(steps):
        image = halve(image)
        levels.append(image)
    return levels


def pool_to(image: Tensor, size: tuple[int, int] | torch.Size) -> Tensor:
    """Average-pool (3, 2, 1) ``image`` repeatedly until its (H, W) equals ``size``.

    Shape:
        (B, C, H_img, W_img) -> (B, C, *size)
    """
    target = tuple(size)
    start = tuple(image.shape[-2:])
    while tuple(image.shape[-2:]) != target:
        height, width = image.shape[-2:]
        if height < target[0] or width < target[1]:
            raise ValueError(f"cannot average-pool an image of {start} by halving to {target}")
        image = halve(image)
    return image
