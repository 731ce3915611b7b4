"""DiCENet: ShuffleNetv2 with the DiCE unit in place of its depth-wise convolution (thesis ch. 3).

Layout (thesis Table A.1; official EdgeNets ``model/classification/dicenet.py``): a 3x3 stride-2
CBR (level 1), a 3x3 stride-2 max pool (level 2), three stages of one strided DiCE unit and
[3, 7, 3] DiCENet units (levels 3-5), global average pooling, a grouped 1x1 "FC" (4 groups, no
bias), dropout and a 1x1 classifier with bias. The DiCE layers of levels 3, 4 and 5 are built for
the feature size of an ``input_size`` image (28, 14 and 7 for 224); other sizes are resized inside
DimConv (thesis Fig. 3.4).

Small images (not in the thesis) opt in with ``stem_stride``, the down-sampling of levels 1-2: 4 is
the ImageNet stem above; 2 drops the max pool; 1 also makes the level-1 CBR stride 1. A 32x32 image
would otherwise reach 1x1 at level 5 (32 / 32); level 5 is 2x2 with ``stem_stride=2`` and 4x4 with
``stem_stride=1``. The layers are the same; only the DiCE layers' height- and width-wise kernels,
built for the larger feature maps, have more parameters.

Ablations of the DiCE unit (thesis Tables 3.2 and 3.3) are constructor options of the same network:
``spatial`` ("dimconv" | "dwise"), ``fusion`` ("dimfuse" | "pointwise" | "se" | "pointwise_se")
and ``reduce`` ("pointwise" | "dimfuse", the 1x1 conv before the spatial op), passed to every
unit, which builds them (:mod:`src.ops.dice`). The default is the DiCE unit of every released
model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import torch
from torch import Tensor, nn

from src.kernels.inference_folding import ConvBNPReLU
from src.kernels.pointwise_conv import PointwiseConv2d
from src.kernels.pooling import MaxPool2d
from src.models.features import FeatureInfo
from src.ops.dice import DiCEShuffleUnit, StridedDiCE, check_unit_options
from src.ops.dim_conv import DimConv

# Output channels of level 1, level 2 (max pool), levels 3-5 and the grouped FC, by width s.
# Thesis Table A.1 (s = 0.1, 0.2, 2.4; [116, 232, 464] x s in between) as rounded by the official
# ``dicenet_config.py``; s = 0.1 is commented out there and given in Table A.1 (6.5 M FLOPs).
DICENET_WIDTHS: Mapping[float, tuple[int, int, int, int, int, int]] = MappingProxyType(
    {
        0.1: (8, 8, 16, 32, 64, 512),
        0.2: (16, 16, 32, 64, 128, 1024),
        0.5: (24, 24, 48, 96, 192, 1024),
        0.75: (24, 24, 86, 172, 344, 1024),
        1.0: (24, 24, 116, 232, 464, 1024),
        1.25: (24, 24, 144, 288, 576, 1024),
        1.5: (24, 24, 176, 352, 704, 1024),
        1.75: (24, 24, 210, 420, 840, 1024),
        2.0: (24, 24, 244, 488, 976, 1024),
        2.4: (24, 24, 278, 556, 1112, 1280),
    }
)
# DiCENet units after the strided unit of levels 3, 4 and 5 (Table A.1, N_i = {3, 7, 3})
DICENET_UNITS = (3, 7, 3)
FC_GROUPS = 4

# down-sampling of levels 1-2 -> (level-1 CBR stride, level-2 max pool stride; 1: no pool)
STEM_STRIDES: Mapping[int, tuple[int, int]] = MappingProxyType({4: (2, 2), 2: (2, 1), 1: (1, 1)})


def widths_for(table: Mapping[float, tuple[int, ...]], scale: float, name: str) -> tuple[int, ...]:
    """``table[scale]``; ValueError listing the valid widths otherwise."""
    if scale not in table:
        raise ValueError(f"{name} has no width s={scale}; valid widths: {sorted(table)}")
    return table[scale]


def feature_sizes(
    input_size: int | Sequence[int], levels: int, *, stem_stride: int = 4
) -> list[tuple[int, int]]:
    """(H, W) after each of the first ``levels`` levels: stride-2 layers (3x3, padding 1: ceil
    halving), except levels 1-2, which down-sample by ``stem_stride`` in all (:data:`STEM_STRIDES`).

    ``input_size`` is an int (square) or (H, W)."""
    size = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"input_size must be a positive int or (H, W), got {input_size}")
    strides = (*stem_strides(stem_stride), *(2,) * max(levels - 2, 0))
    sizes = []
    height, width = size
    for stride in strides[:levels]:
        height, width = -(-height // stride), -(-width // stride)
        sizes.append((height, width))
    return sizes


def stem_strides(stem_stride: int) -> tuple[int, int]:
    """(level-1 stride, level-2 stride) of :data:`STEM_STRIDES`; ValueError listing valid ones."""
    if stem_stride not in STEM_STRIDES:
        raise ValueError(f"stem_stride must be one of {sorted(STEM_STRIDES)}, got {stem_stride}")
    return STEM_STRIDES[stem_stride]


def init_conv_bn_linear(module: nn.Module) -> None:
    """EdgeNets' ``init_params`` (after He et al.): kaiming-normal (fan_out) convolutions (DimConv's
    three kernels included, which are Conv2d there), zero conv biases, BN (1, 0), linear
    N(0, 0.001) with zero bias. PReLU keeps PyTorch's 0.25."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, DimConv):
            for weight in (m.weight_channel, m.weight_height, m.weight_width):
                nn.init.kaiming_normal_(weight, mode="fan_out")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.001)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class DiCENetBackbone(nn.Module):
    """DiCENet levels 1 to ``depth`` (thesis Table A.1), returning every level's output.

    Args:
        scale: the width s, a key of :data:`DICENET_WIDTHS`.
        in_chans: image channels.
        input_size: the image size (int or (H, W)) the DiCE layers are built for; their height-
            and width-wise kernels are fixed to its feature size at each level.
        depth: 4 (up to stride 16, the segmentation encoder) or 5 (up to stride 32).
        stem_stride: down-sampling of levels 1-2: 4 (ImageNet: stride-2 CBR + stride-2 max pool,
            the released models), 2 (no max pool) or 1 (stride-1 CBR, no max pool), for small
            images (module docstring).
        spatial, fusion, reduce: the DiCE-unit ablations (module docstring); the defaults are the
            released DiCENet.
        impl: DimConv's ``"auto" | "reference" | "triton"``.

    Shape:
        (B, in_chans, H, W) -> features [(B, c_l, H / r_l, W / r_l) for l = 1..depth], r_l the
        ``feature_info`` stride (2^l with the ImageNet stem)
    """

    def __init__(
        self,
        scale: float = 1.0,
        in_chans: int = 3,
        *,
        input_size: int | Sequence[int] = 224,
        depth: int = 5,
        stem_stride: int = 4,
        spatial: str = "dimconv",
        fusion: str = "dimfuse",
        reduce: str = "pointwise",
        impl: str = "auto",
    ) -> None:
        super().__init__()
        widths = widths_for(DICENET_WIDTHS, scale, "DiCENet")
        check_unit_options(spatial=spatial, fusion=fusion, reduce=reduce)
        if depth not in (4, 5):
            raise ValueError(f"depth must be 4 or 5, got {depth}")
        level1_stride, level2_stride = stem_strides(stem_stride)
        self.scale = scale
        self.depth = depth
        self.stem_stride = stem_stride
        self.widths = widths
        sizes = feature_sizes(input_size, 5, stem_stride=stem_stride)
        self.level1 = ConvBNPReLU(in_chans, widths[0], 3, stride=level1_stride)
        self.level2: nn.Module = (
            MaxPool2d(3, stride=2, padding=1) if level2_stride == 2 else nn.Identity()
        )
        stages = []
        c_in = widths[1]
        for level in range(3, depth + 1):
            c_out, (height, width) = widths[level - 1], sizes[level - 1]
            units: list[nn.Module] = [
                StridedDiCE(c_in, height, width, spatial=spatial, fusion=fusion, impl=impl)
            ]
            c_stage = 2 * c_in
            for _ in range(DICENET_UNITS[level - 3]):
                units.append(
                    DiCEShuffleUnit(
                        c_stage,
                        c_out,
                        height,
                        width,
                        spatial=spatial,
                        fusion=fusion,
                        reduce=reduce,
                        impl=impl,
                    )
                )
                c_stage = c_out
            stages.append(nn.Sequential(*units))
            c_in = c_out
        self.level3 = stages[0]
        self.level4 = stages[1]
        self.level5 = stages[2] if depth == 5 else None
        strides = (level1_stride, stem_stride) + tuple(stem_stride * 2**i for i in range(1, 4))
        self.feature_info = tuple(
            FeatureInfo(widths[0] if level < 3 else widths[level - 1], strides[level - 1])
            for level in range(1, depth + 1)
        )

    def forward_features(self, x: Tensor) -> list[Tensor]:
        features = [self.level1(x)]  # (B, c0, H/2, W/2)
        levels = [self.level2, self.level3, self.level4]
        if self.level5 is not None:
            levels.append(self.level5)
        for level in levels:
            features.append(level(features[-1]))
        return features

    def forward(self, x: Tensor) -> list[Tensor]:
        return self.forward_features(x)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, depth={self.depth}, stem_stride={self.stem_stride}"


class DiCENet(nn.Module):
    """DiCENet for image classification (thesis Sec. 3.2.4, Table A.1).

    Args:
        scale: the width s: one of 0.1, 0.2, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.4.
        num_classes: classifier outputs.
        in_chans: image channels.
        input_size: the image size the DiCE layers are built for (224 for the released models).
        stem_stride: down-sampling of levels 1-2: 4 is the ImageNet stem of the released models;
            2 or 1 keep small images (32x32 digits) above 1x1 at level 5 (module docstring).
        dropout: before the classifier; ``None`` is the official rule, 0.2 if s > 1 else 0.1.
        spatial, fusion, reduce: DiCE-unit ablations (Tables 3.2, 3.3); defaults = DiCENet.
        impl: DimConv's implementation.

    Official EdgeNets ImageNet weights are loaded by :func:`src.compat.load_official` (in
    training, ``task.init_checkpoint=<.pth>``).

    Shape:
        (B, in_chans, H, W) -> (B, num_classes)
    """

    def __init__(
        self,
        scale: float = 1.0,
        num_classes: int = 1000,
        in_chans: int = 3,
        *,
        input_size: int | Sequence[int] = 224,
        stem_stride: int = 4,
        dropout: float | None = None,
        spatial: str = "dimconv",
        fusion: str = "dimfuse",
        reduce: str = "pointwise",
        impl: str = "auto",
    ) -> None:
        super().__init__()
        self.backbone = DiCENetBackbone(
            scale,
            in_chans,
            input_size=input_size,
            stem_stride=stem_stride,
            spatial=spatial,
            fusion=fusion,
            reduce=reduce,
            impl=impl,
        )
        widths = self.backbone.widths
        self.dropout = (0.2 if scale > 1 else 0.1) if dropout is None else dropout
        self.pool = nn.AdaptiveAvgPool2d(1)
        # grouped "FC" as a 1x1 conv on the pooled (B, c4, 1, 1) map, as the official model
        self.fc_group = nn.Conv2d(widths[4], widths[5], 1, groups=FC_GROUPS, bias=False)
        self.drop = nn.Dropout(self.dropout)
        self.fc = PointwiseConv2d(widths[5], num_classes)
        self.feature_info = self.backbone.feature_info
        self.init_weights()

    def init_weights(self) -> None:
        """EdgeNets' initialisation (:func:`init_conv_bn_linear`)."""
        init_conv_bn_linear(self)

    def forward_features(self, x: Tensor) -> list[Tensor]:
        return self.backbone.forward_features(x)

    def forward_head(self, x: Tensor) -> Tensor:
        """(B, c4, h, w) -> (B, num_classes): GAP, grouped FC, dropout, FC (no nonlinearity)."""
        return torch.flatten(self.fc(self.drop(self.fc_group(self.pool(x)))), 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x)[-1])
