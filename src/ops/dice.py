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

The ablations of thesis Tables 3.2 and 3.3 are built by name, by both units and by
:func:`dice_block` / :func:`reduce_block`: ``spatial`` ("dimconv" | "dwise"), ``fusion``
("dimfuse" | "pointwise" | "se" | "pointwise_se") and ``reduce`` ("pointwise" | "dimfuse", the
DiCENet unit's 1x1 conv before the DiCE). The defaults are the DiCE unit of every released model;
the others are a :class:`SpatialFusionBlock` in place of the :class:`DiCE` and a
:class:`~src.ops.dim_fuse.GlobalFusion` in place of the 1x1 CBR.

"CBR" is conv (no bias) + BN + PReLU (per channel).
"""

from __future__ import annotations

from torch import Tensor, nn

from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import FusingSequential
from src.kernels.dice import dice_path
from src.kernels.inference_folding import ConvBNPReLU, conv_bn_prelu
from src.kernels.pointwise_conv import PointwiseConv2d
from src.kernels.pooling import AvgPool2d
from src.kernels.prelu import PReLU
from src.ops.dim_conv import DimConv
from src.ops.dim_fuse import DimFuse, GlobalFusion, ablation_gate
from src.ops.shuffle import concat_shuffle

SPATIAL_OPS = ("dimconv", "dwise")
FUSION_OPS = ("dimfuse", "pointwise", "se", "pointwise_se")
REDUCE_OPS = ("pointwise", "dimfuse")


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

    Where they apply, the forward takes the same map on fused kernels (:mod:`src.kernels.dice`): in
    CPU inference with every BN folded (the C++ kernel, or eager calls), and where DimConv's Triton
    kernel runs, DimConv and DimFuse's local fusion in one Triton pass. The class attributes
    ``cpu_kernel`` and ``local_fusion`` switch them off.

    Shape:
        (B, C, H, W) -> (B, C_out, H, W), any H and W (see :class:`DimConv`).
    """

    #: take the fused C++ kernel in CPU inference where it applies (False: eager folded calls)
    cpu_kernel: bool = True
    #: run DimConv and DimFuse's local fusion as one Triton pass where it applies (False: never)
    local_fusion: bool = True

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
        if self.dim_conv.interleave and not self.training:
            # exported at the build size: the branches fused without their join
            # (DimFuse.fuse_branches says why)
            branches = self.dim_conv.exported_branches(x)
            if branches is not None:
                return self.dim_fuse.fuse_branches(branches)
        fused = dice_path(self, x)  # the kernels' fused path for this input, if one applies
        if fused is not None:
            return fused(x)
        return self.dim_fuse(self.dim_conv(x))


class SpatialFusionBlock(nn.Module):
    """An ablation of the DiCE unit: a spatial op (DimConv or depth-wise 3x3) and a fusion op.

    The spatial output is normalised (BN + PReLU). DimConv's 3C channels are first reduced to C
    by DimFuse's local fusion (grouped 1x1 CBR, C groups) for the "se" and "dimfuse" fusions;
    "pointwise" and "pointwise_se" fuse all 3C channels with a 1x1 CBR. This reading of Table 3.2
    is ours (the thesis gives no code for the ablations).

    Args:
        channels: C.
        out_channels: C_out (must equal C for ``fusion="se"``, which keeps the width).
        height, width: DimConv's build size.
        spatial: "dimconv" or "dwise".
        fusion: "dimfuse", "pointwise", "se" or "pointwise_se".
        impl: DimConv's implementation.

    Shape:
        (B, C, H, W) -> (B, C_out, H, W)
    """

    def __init__(
        self,
        channels: int,
        out_channels: int,
        height: int,
        width: int,
        *,
        spatial: str,
        fusion: str,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        check_unit_options(spatial=spatial, fusion=fusion)
        if fusion == "se" and channels != out_channels:
            raise ValueError(f"fusion='se' keeps the width; got {channels} -> {out_channels}")
        self.spatial_op, self.fusion_op = spatial, fusion
        if spatial == "dimconv":
            expanded = 3 * channels
            self.spatial = DimConv(channels, height, width, impl=impl)
        else:
            expanded = channels
            self.spatial = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.norm = FusingSequential(BatchNorm2d(expanded), PReLU(expanded))
        pointwise = fusion in ("pointwise", "pointwise_se")
        # DimFuse's local fusion: each channel's (D, H, W) triple -> one channel
        self.local = (
            ConvBNPReLU(expanded, channels, 1, groups=channels)
            if spatial == "dimconv" and not pointwise
            else nn.Identity()
        )
        if pointwise:
            self.fuse: nn.Module = ConvBNPReLU(expanded, out_channels, 1)
        elif fusion == "dimfuse":
            self.fuse = GlobalFusion(channels, out_channels)
        else:
            self.fuse = nn.Identity()
        self.gate = (
            ablation_gate(out_channels, out_channels) if fusion in ("se", "pointwise_se") else None
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.fuse(self.local(self.norm(self.spatial(x))))
        return out if self.gate is None else out * self.gate(out)

    def extra_repr(self) -> str:
        return f"spatial={self.spatial_op!r}, fusion={self.fusion_op!r}"


def check_unit_options(
    *, spatial: str = "dimconv", fusion: str = "dimfuse", reduce: str = "pointwise"
) -> None:
    """ValueError naming the valid choices of each DiCE-unit ablation option."""
    for name, value, valid in (
        ("spatial", spatial, SPATIAL_OPS),
        ("fusion", fusion, FUSION_OPS),
        ("reduce", reduce, REDUCE_OPS),
    ):
        if value not in valid:
            raise ValueError(f"{name} must be one of {valid}, got {value!r}")


def dice_block(
    channels: int,
    out_channels: int,
    height: int,
    width: int,
    *,
    spatial: str = "dimconv",
    fusion: str = "dimfuse",
    kernel_size: int = 3,
    dilation: tuple[int, int, int] = (1, 1, 1),
    shuffle: bool = True,
    impl: str = "auto",
) -> nn.Module:
    """The DiCE unit (DimConv + DimFuse) or one of its Table 3.2 ablations, by name.

    ``kernel_size``, ``dilation`` and ``shuffle`` are the :class:`DiCE`'s; the ablations are built
    with their defaults only.

    Shape:
        (B, C, H, W) -> (B, C_out, H, W)
    """
    check_unit_options(spatial=spatial, fusion=fusion)
    if (spatial, fusion) == ("dimconv", "dimfuse"):
        return DiCE(
            channels,
            out_channels,
            height,
            width,
            kernel_size=kernel_size,
            dilation=dilation,
            shuffle=shuffle,
            impl=impl,
        )
    if (kernel_size, tuple(dilation), shuffle) != (3, (1, 1, 1), True):
        raise ValueError(
            f"the ablation spatial={spatial!r}, fusion={fusion!r} has 3x3 kernels, no dilation and "
            f"shuffle; got kernel_size={kernel_size}, dilation={dilation}, shuffle={shuffle}"
        )
    return SpatialFusionBlock(
        channels, out_channels, height, width, spatial=spatial, fusion=fusion, impl=impl
    )


def reduce_block(c_in: int, c_out: int, *, reduce: str = "pointwise") -> nn.Module:
    """The point-wise layer before the spatial op: 1x1 CBR, or DimFuse's global fusion (Table 3.3).

    Shape:
        (B, C_in, H, W) -> (B, C_out, H, W)
    """
    check_unit_options(reduce=reduce)
    return ConvBNPReLU(c_in, c_out, 1) if reduce == "pointwise" else GlobalFusion(c_in, c_out)


class StridedDiCE(nn.Module):
    """The strided DiCE unit: two half-resolution branches, concatenated and shuffled.

    Args:
        in_channels: C (the output has 2C).
        height: H_b of the inner DiCE (the output height, e.g. 28 for a 56 x 56 input).
        width: W_b of the inner DiCE.
        kernel_size, dilation, shuffle, impl: of the inner :class:`DiCE`.
        spatial, fusion: the inner DiCE's ablation (:func:`dice_block`); the defaults are the DiCE.

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
        spatial: str = "dimconv",
        fusion: str = "dimfuse",
        impl: str = "auto",
    ) -> None:
        super().__init__()
        c = in_channels
        self.in_channels = in_channels
        self.left = nn.Sequential(
            nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c, bias=False),
            BatchNorm2d(c),
            PReLU(c),
            PointwiseConv2d(c, c, bias=False),
            BatchNorm2d(c),
            PReLU(c),
        )
        self.pool = AvgPool2d(3, stride=2, padding=1)
        self.dice = dice_block(
            c,
            c,
            height,
            width,
            spatial=spatial,
            fusion=fusion,
            kernel_size=kernel_size,
            dilation=dilation,
            shuffle=shuffle,
            impl=impl,
        )
        self.right = ConvBNPReLU(c, c, 1)

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        right = self.right(self.dice(self.pool(x)))
        # the two CBRs of the left branch, folded in inference
        # (indexing, not slicing: a Sequential slice builds a new module on every call)
        conv1, bn1, act1, conv2, bn2, act2 = self.left
        left = conv_bn_prelu(conv2, bn2, act2, conv_bn_prelu(conv1, bn1, act1, x))
        # [(B, C, H/2, W/2), (B, C, H/2, W/2)] -> (B, 2C, H/2, W/2), shuffled
        return concat_shuffle((left, right), 2)

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
        spatial, fusion: the DiCE's ablation (:func:`dice_block`).
        reduce: the 1x1 CBR before the DiCE, or its ablation (:func:`reduce_block`).
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
        spatial: str = "dimconv",
        fusion: str = "dimfuse",
        reduce: str = "pointwise",
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
        self.reduce = reduce_block(right_in, right_out, reduce=reduce)
        self.dice = dice_block(
            right_out, right_out, height, width, spatial=spatial, fusion=fusion, impl=impl
        )

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        # (B, C_in, H, W) -> (B, passed, H, W) and (B, C_in - passed, H, W)
        # slices, not split: XNNPACK's partitioner takes slices, and a split ended its delegate
        left, right = x[:, : self.passed], x[:, self.passed :]
        # [(B, passed, H, W), (B, C_out - passed, H, W)] -> (B, C_out, H, W), shuffled
        return concat_shuffle((left, self.dice(self.reduce(right))), self.groups)

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"passed={self.passed}, groups={self.groups}"
        )
