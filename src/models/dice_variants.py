"""The DiCE unit in the MobileNet and ResNet layouts of thesis Figure 3.5.

Thesis Sec. 3.2.4 and Table A.1: "For other architecture designs in Figure 3.5 (MobileNetv1 and
ResNet), we replace blocks 1, 2, and 3 with the corresponding blocks." Both networks therefore
share DiCENet's stem (3x3 stride-2 CBR, max pool), its widths (:data:`DICENET_WIDTHS`), its unit
counts (one strided unit + [3, 7, 3] units) and its head (GAP, grouped FC with 4 groups, dropout,
FC). Only the unit differs:

- MobileNet: the separable convolution (depth-wise + point-wise) is replaced by the DiCE unit,
  stacked without shortcuts: ``DiCE(C_in -> C_out)``.
- ResNet: the bottleneck's separable part is replaced by the DiCE unit, after its first
  point-wise conv: ``PReLU(DiCE(CBR1x1(x)) + shortcut(x))``, the shortcut being the identity, or a
  1x1 conv + BN where the width changes. The bottleneck width is ``bottleneck`` x C_out (0.5,
  ours; the thesis does not give it).

Every stage starts with the strided DiCE unit (C -> 2C at half resolution), as in DiCENet. The
thesis publishes no code for these layouts; the choices above are ours and documented here.
The DiCE-unit ablations (``spatial``, ``fusion``, ``reduce``; Tables 3.2 and 3.3) apply as in
:class:`src.models.dicenet.DiCENet`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from src.kernels.batch_norm import BatchNorm2d
from src.kernels.inference_folding import ConvBNPReLU
from src.kernels.pooling import MaxPool2d
from src.kernels.prelu import PReLU
from src.models.dicenet import (
    DICENET_UNITS,
    DICENET_WIDTHS,
    FC_GROUPS,
    feature_sizes,
    init_conv_bn_linear,
    widths_for,
)
from src.models.features import FeatureInfo
from src.ops.dice import StridedDiCE, check_unit_options, dice_block, reduce_block

LAYOUTS = ("mobilenet", "resnet")


class DiCEBottleneck(nn.Module):
    """ResNet bottleneck with the DiCE unit: reduce (1x1) -> DiCE -> + shortcut -> PReLU.

    Args:
        in_channels: C_in.
        out_channels: C_out.
        height, width: the DiCE's build size.
        bottleneck: the reduced width as a fraction of C_out.
        spatial, fusion, reduce, impl: DiCE-unit options (:func:`src.ops.dice.dice_block`,
            :func:`src.ops.dice.reduce_block`).

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
        bottleneck: float = 0.5,
        spatial: str = "dimconv",
        fusion: str = "dimfuse",
        reduce: str = "pointwise",
        impl: str = "auto",
    ) -> None:
        super().__init__()
        mid = max(4, round(bottleneck * out_channels))
        self.reduce = reduce_block(in_channels, mid, reduce=reduce)
        self.dice = dice_block(
            mid, out_channels, height, width, spatial=spatial, fusion=fusion, impl=impl
        )
        self.shortcut: nn.Module = (
            nn.Identity()
            if in_channels == out_channels
            else nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, bias=False), BatchNorm2d(out_channels)
            )
        )
        self.act = PReLU(out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.dice(self.reduce(x)) + self.shortcut(x))


class DiCELayoutNet(nn.Module):
    """DiCENet's stem, widths and head around MobileNet- or ResNet-style DiCE units (Fig. 3.5).

    Args:
        layout: "mobilenet" or "resnet".
        scale: the width s, a key of :data:`DICENET_WIDTHS` (Table A.1).
        num_classes: classifier outputs.
        in_chans: image channels.
        input_size: the image size the DiCE layers are built for.
        dropout: before the classifier; ``None``: 0.2 if s > 1 else 0.1 (as DiCENet).
        bottleneck: the ResNet bottleneck width fraction (unused by "mobilenet").
        spatial, fusion, reduce: DiCE-unit ablations (Tables 3.2, 3.3); ``reduce`` is the
            ResNet bottleneck's first point-wise conv.
        impl: DimConv's implementation.

    Shape:
        (B, in_chans, H, W) -> (B, num_classes)
    """

    def __init__(
        self,
        layout: str,
        scale: float = 1.0,
        num_classes: int = 1000,
        in_chans: int = 3,
        *,
        input_size: int | Sequence[int] = 224,
        dropout: float | None = None,
        bottleneck: float = 0.5,
        spatial: str = "dimconv",
        fusion: str = "dimfuse",
        reduce: str = "pointwise",
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        widths = widths_for(DICENET_WIDTHS, scale, f"DiCE {layout}")
        check_unit_options(spatial=spatial, fusion=fusion, reduce=reduce)
        self.layout = layout
        self.scale = scale
        sizes = feature_sizes(input_size, 5)
        self.level1 = ConvBNPReLU(in_chans, widths[0], 3, stride=2)
        self.level2 = MaxPool2d(3, stride=2, padding=1)
        stages = []
        c_in = widths[1]
        for level in (3, 4, 5):
            c_out, (height, width) = widths[level - 1], sizes[level - 1]
            units: list[nn.Module] = [
                StridedDiCE(c_in, height, width, spatial=spatial, fusion=fusion, impl=impl)
            ]
            c_unit = 2 * c_in
            for _ in range(DICENET_UNITS[level - 3]):
                if layout == "mobilenet":
                    unit = dice_block(
                        c_unit, c_out, height, width, spatial=spatial, fusion=fusion, impl=impl
                    )
                else:
                    unit = DiCEBottleneck(
                        c_unit,
                        c_out,
                        height,
                        width,
                        bottleneck=bottleneck,
                        spatial=spatial,
                        fusion=fusion,
                        reduce=reduce,
                        impl=impl,
                    )
                units.append(unit)
                c_unit = c_out
            stages.append(nn.Sequential(*units))
            c_in = c_out
        self.level3, self.level4, self.level5 = stages
        self.dropout = (0.2 if scale > 1 else 0.1) if dropout is None else dropout
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc_group = nn.Conv2d(widths[4], widths[5], 1, groups=FC_GROUPS, bias=False)
        self.drop = nn.Dropout(self.dropout)
        self.fc = nn.Conv2d(widths[5], num_classes, 1)
        self.feature_info = tuple(
            FeatureInfo(widths[0] if level < 3 else widths[level - 1], 2**level)
            for level in range(1, 6)
        )
        self.init_weights()

    def init_weights(self) -> None:
        """EdgeNets' initialisation (:func:`src.models.dicenet.init_conv_bn_linear`)."""
        init_conv_bn_linear(self)

    def forward_features(self, x: Tensor) -> list[Tensor]:
        features = [self.level1(x)]  # (B, c0, H/2, W/2)
        for level in (self.level2, self.level3, self.level4, self.level5):
            features.append(level(features[-1]))
        return features

    def forward_head(self, x: Tensor) -> Tensor:
        """(B, c4, h, w) -> (B, num_classes)."""
        return torch.flatten(self.fc(self.drop(self.fc_group(self.pool(x)))), 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x)[-1])

    def extra_repr(self) -> str:
        return f"layout={self.layout!r}, scale={self.scale}"


def dice_mobilenet(
    scale: float = 1.0,
    num_classes: int = 1000,
    in_chans: int = 3,
    *,
    input_size: int | Sequence[int] = 224,
    dropout: float | None = None,
    spatial: str = "dimconv",
    fusion: str = "dimfuse",
    impl: str = "auto",
) -> DiCELayoutNet:
    """MobileNet with DiCE units (Fig. 3.5a): no shortcuts, no point-wise conv before the DiCE."""
    return DiCELayoutNet(
        "mobilenet",
        scale,
        num_classes,
        in_chans,
        input_size=input_size,
        dropout=dropout,
        spatial=spatial,
        fusion=fusion,
        impl=impl,
    )


def dice_resnet(
    scale: float = 1.0,
    num_classes: int = 1000,
    in_chans: int = 3,
    *,
    input_size: int | Sequence[int] = 224,
    dropout: float | None = None,
    bottleneck: float = 0.5,
    spatial: str = "dimconv",
    fusion: str = "dimfuse",
    reduce: str = "pointwise",
    impl: str = "auto",
) -> DiCELayoutNet:
    """ResNet with DiCE bottlenecks (Fig. 3.5b)."""
    return DiCELayoutNet(
        "resnet",
        scale,
        num_classes,
        in_chans,
        input_size=input_size,
        dropout=dropout,
        bottleneck=bottleneck,
        spatial=spatial,
        fusion=fusion,
        reduce=reduce,
        impl=impl,
    )
