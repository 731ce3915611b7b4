"""ESPNetv2: a stack of EESP units with strided EESP down-samplers (thesis ch. 2, Table 2.2).

Layout (thesis Table 2.2; official EdgeNets ``model/classification/espnetv2.py``): a 3x3 stride-2
CBR (level 1); a down-sampler to level 2; a down-sampler and [3, 7, 3] EESP units at levels 3, 4
and 5; a depth-wise 3x3 CBR and a grouped 1x1 CBR (4 groups) c4 -> c5; global average pooling,
dropout and a linear classifier. Every EESP has K = 4 branches; the receptive-field limits of
levels 1-5 are [13, 11, 9, 7, 5] (the down-sampler into level l + 1 uses level l's limit).

The down-samplers of levels 2-4 add the long-range shortcut to the input image (LRSC). The
official level-5 down-sampler is built with that shortcut too but is called without the image, so
its ``inp_reinf`` parameters never run (1,370 to 5,210 parameters by width; complexity.json
``unused_params``). This model does not build them; the converter drops them from official files.

Ablations (thesis Tables 2.4 and 2.5) are options of the same network: ``conv_type``
("depthwise_dilated", the EESP; "depthwise", all dilations 1; "dilated", standard dilated 3x3 convs
in the branches), ``hff`` (hierarchical feature fusion) and ``input_shortcut`` (LRSC).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import torch
from torch import Tensor, nn

from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import FusingSequential
from src.kernels.dispatch import check_impl
from src.kernels.inference_folding import ConvBNPReLU
from src.kernels.prelu import PReLU
from src.models.dicenet import init_conv_bn_linear, widths_for
from src.models.features import FeatureInfo
from src.ops.eesp import EESP, EESPDownsampler, image_pyramid

# Output channels of levels 1-5 and of the last grouped 1x1 CBR, by width s. The official
# ``espnetv2_config.py`` table (s = 0.5 ... 2.0); s = 1.75 is the 6th column of thesis Table 2.2
# (224 M FLOPs, 3.03 M params), built with the original ESPNetv2 channel rule.
ESPNETV2_WIDTHS: Mapping[float, tuple[int, int, int, int, int, int]] = MappingProxyType(
    {
        0.5: (16, 32, 64, 128, 256, 1024),
        1.0: (32, 64, 128, 256, 512, 1024),
        1.25: (32, 80, 160, 320, 640, 1024),
        1.5: (32, 96, 192, 384, 768, 1024),
        1.75: (32, 112, 224, 448, 896, 1280),
        2.0: (32, 128, 256, 512, 1024, 1280),
    }
)
ESPNETV2_UNITS = (3, 7, 3)  # EESP units after the down-samplers of levels 3, 4, 5
R_LIM = (13, 11, 9, 7, 5)  # receptive-field limit of levels 1-5
BRANCHES = 4
HEAD_GROUPS = 4
CONV_TYPES = ("depthwise_dilated", "depthwise", "dilated")


class EESPAblation(EESP):
    """EESP with the Table 2.4/2.5 ablations: branch convolution type and HFF on or off.

    ``conv_type="depthwise"`` keeps depth-wise branches with dilation 1; ``"dilated"`` makes the
    branches standard (dense) dilated 3x3 convolutions. ``hff=False`` concatenates the branch
    outputs without the cumulative sum. Arguments otherwise as :class:`EESP`.

    Shape:
        (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride))
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        stride: int = 1,
        branches: int = 4,
        r_lim: int = 7,
        down_method: str = "esp",
        conv_type: str = "depthwise_dilated",
        hff: bool = True,
        impl: str = "auto",
    ) -> None:
        if conv_type not in CONV_TYPES:
            raise ValueError(f"conv_type must be one of {CONV_TYPES}, got {conv_type!r}")
        # r_lim 3 clips every kernel size to 3, i.e. dilation 1 in every branch
        super().__init__(
            in_channels,
            out_channels,
            stride=stride,
            branches=branches,
            r_lim=3 if conv_type == "depthwise" else r_lim,
            down_method=down_method,
            hff=hff,
            impl=impl,
        )
        self.conv_type = conv_type
        if conv_type == "dilated":
            n = out_channels // branches
            self.transform = nn.ModuleList(
                nn.Conv2d(n, n, 3, stride=stride, padding=d, dilation=d, bias=False)
                for d in self.dilations
            )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, conv_type={self.conv_type!r}"


def _eesp(
    c_in: int,
    c_out: int,
    r_lim: int,
    *,
    conv_type: str,
    hff: bool,
    stride: int = 1,
    impl: str = "auto",
) -> EESP:
    down = "avg" if stride == 2 else "esp"
    if conv_type == "depthwise_dilated" and hff:
        return EESP(
            c_in, c_out, stride=stride, branches=BRANCHES, r_lim=r_lim, down_method=down, impl=impl
        )
    return EESPAblation(
        c_in,
        c_out,
        stride=stride,
        branches=BRANCHES,
        r_lim=r_lim,
        down_method=down,
        conv_type=conv_type,
        hff=hff,
        impl=impl,
    )


def _downsampler(
    c_in: int,
    c_out: int,
    r_lim: int,
    image_channels: int | None,
    *,
    conv_type: str,
    hff: bool,
    impl: str = "auto",
) -> EESPDownsampler:
    block = EESPDownsampler(
        c_in, c_out, branches=BRANCHES, r_lim=r_lim, image_channels=image_channels
    )
    block.eesp.impl = check_impl(impl)
    if (conv_type, hff) != ("depthwise_dilated", True):
        # the ablated strided EESP replaces the default one while the block is being built
        block.eesp = _eesp(
            c_in, c_out - c_in, r_lim, conv_type=conv_type, hff=hff, stride=2, impl=impl
        )
    return block


class ESPNetv2Backbone(nn.Module):
    """ESPNetv2 levels 1 to ``depth``, returning every level's output.

    Args:
        scale: the width s, a key of :data:`ESPNETV2_WIDTHS`.
        in_chans: image channels (also the channels of the image shortcut).
        depth: 4 (up to stride 16, the segmentation encoder) or 5 (stride 32).
        conv_type, hff, input_shortcut: the ablations of Tables 2.4 and 2.5 (module docstring).
        impl: every EESP pyramid's path, ``"auto" | "reference" | "triton"``
            (:class:`src.ops.eesp.EESP`).

    Shape:
        (B, in_chans, H, W) -> features [(B, c_l, ceil(H / 2^l), ceil(W / 2^l)) for l = 1..depth]
    """

    def __init__(
        self,
        scale: float = 1.0,
        in_chans: int = 3,
        *,
        depth: int = 5,
        conv_type: str = "depthwise_dilated",
        hff: bool = True,
        input_shortcut: bool = True,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        widths = widths_for(ESPNETV2_WIDTHS, scale, "ESPNetv2")
        if conv_type not in CONV_TYPES:
            raise ValueError(f"conv_type must be one of {CONV_TYPES}, got {conv_type!r}")
        if depth not in (4, 5):
            raise ValueError(f"depth must be 4 or 5, got {depth}")
        self.scale = scale
        self.depth = depth
        self.widths = widths
        self.input_shortcut = input_shortcut
        image = in_chans if input_shortcut else None
        c = widths
        unit = functools.partial(_eesp, conv_type=conv_type, hff=hff, impl=impl)
        down = functools.partial(_downsampler, conv_type=conv_type, hff=hff, impl=impl)
        self.level1 = ConvBNPReLU(in_chans, c[0], 3, stride=2)
        self.level2_0 = down(c[0], c[1], R_LIM[0], image)
        self.level3_0 = down(c[1], c[2], R_LIM[1], image)
        self.level3 = nn.Sequential(*(unit(c[2], c[2], R_LIM[2]) for _ in range(ESPNETV2_UNITS[0])))
        self.level4_0 = down(c[2], c[3], R_LIM[2], image)
        self.level4 = nn.Sequential(*(unit(c[3], c[3], R_LIM[3]) for _ in range(ESPNETV2_UNITS[1])))
        self.level5_0 = None
        self.level5 = None
        if depth == 5:
            # no image shortcut: the official one is built but never called (module docstring)
            self.level5_0 = down(c[3], c[4], R_LIM[3], None)
            self.level5 = nn.Sequential(
                *(unit(c[4], c[4], R_LIM[4]) for _ in range(ESPNETV2_UNITS[2]))
            )
        # The strided EESP of a down-sampler returns before its final PReLU (``act``), as the
        # official one does; the official model still builds that PReLU and counts it. It is
        # kept (parameter count and state dict as official) and frozen: it never gets a gradient.
        for down in (self.level2_0, self.level3_0, self.level4_0, self.level5_0):
            if down is not None:
                down.eesp.act.requires_grad_(False)
        self.feature_info = tuple(FeatureInfo(c[i], 2 ** (i + 1)) for i in range(depth))

    def forward_features(self, x: Tensor) -> list[Tensor]:
        # Each down-sampler's shortcut takes the image average-pooled to its output size. The
        # official code pools the full image anew at every level (nine pools, six of them at the
        # two largest sizes); pooling each level's image from the last one gives the same tensors.
        images: Sequence[Tensor | None] = [None] * 4
        if self.input_shortcut:
            images = image_pyramid(x, 4)  # (B, 3, H / 2^s, W / 2^s), s = 1..4
        out1 = self.level1(x)  # (B, c0, H/2, W/2)
        out2 = self.level2_0(out1, images[1])  # (B, c1, H/4, W/4)
        out3 = self.level3(self.level3_0(out2, images[2]))  # (B, c2, H/8, W/8)
        out4 = self.level4(self.level4_0(out3, images[3]))  # (B, c3, H/16, W/16)
        features = [out1, out2, out3, out4]
        if self.level5_0 is not None and self.level5 is not None:
            features.append(self.level5(self.level5_0(out4)))  # (B, c4, H/32, W/32)
        return features

    def forward(self, x: Tensor) -> list[Tensor]:
        return self.forward_features(x)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, depth={self.depth}, input_shortcut={self.input_shortcut}"


class ESPNetv2(nn.Module):
    """ESPNetv2 for image classification (thesis Sec. 2.3, Table 2.2).

    Args:
        scale: the width s: one of 0.5, 1.0, 1.25, 1.5, 1.75, 2.0.
        num_classes: classifier outputs.
        in_chans: image channels.
        dropout: before the classifier (0.2, thesis Sec. 2.4.1).
        conv_type, hff, input_shortcut: ablations (Tables 2.4, 2.5); defaults = ESPNetv2.
        impl: the EESP pyramids' path, ``"auto" | "reference" | "triton"``.

    Official EdgeNets ImageNet weights are loaded by :func:`src.compat.load_official` (the unused
    level-5 image-shortcut weights are dropped; in training, ``task.init_checkpoint=<.pth>``).

    Shape:
        (B, in_chans, H, W) -> (B, num_classes)
    """

    def __init__(
        self,
        scale: float = 1.0,
        num_classes: int = 1000,
        in_chans: int = 3,
        *,
        dropout: float = 0.2,
        conv_type: str = "depthwise_dilated",
        hff: bool = True,
        input_shortcut: bool = True,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        self.backbone = ESPNetv2Backbone(
            scale, in_chans, conv_type=conv_type, hff=hff, input_shortcut=input_shortcut,
            impl=impl,
        )  # fmt: skip
        c4, c5 = self.backbone.widths[4:]
        self.head_conv = FusingSequential(
            nn.Conv2d(c4, c4, 3, padding=1, groups=c4, bias=False),
            BatchNorm2d(c4),
            PReLU(c4),
            nn.Conv2d(c4, c5, 1, groups=HEAD_GROUPS, bias=False),
            BatchNorm2d(c5),
            PReLU(c5),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(c5, num_classes)
        self.feature_info = self.backbone.feature_info
        self.init_weights()

    def init_weights(self) -> None:
        """EdgeNets' initialisation (:func:`src.models.dicenet.init_conv_bn_linear`)."""
        init_conv_bn_linear(self)

    def forward_features(self, x: Tensor) -> list[Tensor]:
        return self.backbone.forward_features(x)

    def forward_head(self, x: Tensor) -> Tensor:
        """(B, c4, h, w) -> (B, num_classes)."""
        pooled = torch.flatten(self.pool(self.head_conv(x)), 1)  # (B, c5)
        return self.classifier(self.drop(pooled))

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x)[-1])
