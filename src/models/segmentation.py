"""The EdgeNets segmentation networks: a DiCENet or ESPNetv2 encoder and the EPP decoder.

Thesis Sec. 2.4.2 and 3.6; structure as the official ``model/segmentation/{dicenet,espnetv2}.py``
build it (REFERENCE.md Sec. 4). The encoder is the classification backbone up to stride 16
(no level 5, no classifier), giving features at strides 2, 4, 8 and 16. The decoder:

1. EPP (efficient pyramid pooling, :class:`src.ops.epp.EfficientPyramidPooling`, scales
   :data:`EPP_SCALES`) on the stride-16 feature;
2. three times: bilinear up-sampling to the next (finer) feature's size (x2, ``align_corners``),
   plus a gated projection of that skip feature (:class:`GatedProjection`), BN + PReLU, EPP;
3. bilinear up-sampling (``align_corners``) to the input size.

Decoder widths are [4b, 3b, 2b, classes] with b = 16 (``base_width``); EPP projects to
min(classes // 2, b) channels. DiCENet's encoder is built for 224x224 images whatever the input
size (its DiCE layers are fixed at 28 and 14 at levels 3 and 4), as the released weights are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

from src.kernels.batch_norm import BatchNorm2d
from src.kernels.inference_folding import ConvBNPReLU
from src.kernels.prelu import PReLU
from src.models.dicenet import DiCENetBackbone, init_conv_bn_linear
from src.models.espnetv2 import ESPNetv2Backbone
from src.ops.epp import EfficientPyramidPooling, upsample

EPP_SCALES = (2.0, 1.5, 1.0, 0.5, 0.1)  # the decoder's pyramid (official ``EfficientPyrPool``)


def _br(channels: int) -> nn.Sequential:
    return nn.Sequential(BatchNorm2d(channels), PReLU(channels))


class GatedProjection(nn.Module):
    """Skip-feature projection: 3x3 CBR (gcd(C_in, C_out) groups) times sigmoid(1x1(GAP(x))).

    The official ``EfficientPWConv``; the gate's 1x1 conv has no bias.

    Shape:
        (B, C_in, h, w) -> (B, C_out, h, w)
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.gate = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(in_channels, out_channels, 1, bias=False),
            nn.Sigmoid(),
        )
        self.expand = ConvBNPReLU(
            in_channels, out_channels, 3, groups=math.gcd(in_channels, out_channels)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.expand(x) * self.gate(x)


class EPPDecoder(nn.Module):
    """The EdgeNets segmentation decoder over features at strides 2, 4, 8 and 16.

    Args:
        in_channels: channels of the four encoder features, finest first.
        num_classes: output channels.
        base_width: b; decoder widths [4b, 3b, 2b, classes] (b = 16 for PASCAL and Cityscapes).

    Shape:
        4 features [(B, in_channels[i], H / 2^(i+1), W / 2^(i+1))], size (H, W)
        -> (B, num_classes, H, W)
    """

    def __init__(
        self, in_channels: Sequence[int], num_classes: int, *, base_width: int = 16
    ) -> None:
        super().__init__()
        if len(in_channels) != 4:
            raise ValueError(f"need four encoder features (strides 2-16), got {in_channels}")
        widths = (4 * base_width, 3 * base_width, 2 * base_width, num_classes)
        proj = min(num_classes // 2, base_width)
        if proj < 1:
            raise ValueError(f"num_classes={num_classes} gives an empty EPP projection")
        c_in = (in_channels[3], *widths[:3])
        self.epp = nn.ModuleList(
            EfficientPyramidPooling(c_in[i], proj, widths[i], scales=EPP_SCALES, last=i == 3)
            for i in range(4)
        )
        # skips: stride 8, 4, 2 features onto decoder widths 4b, 3b, 2b
        self.skip = nn.ModuleList(GatedProjection(in_channels[2 - i], widths[i]) for i in range(3))
        self.skip_norm = nn.ModuleList(_br(widths[i]) for i in range(3))

    def forward(self, features: Sequence[Tensor], size: Sequence[int]) -> Tensor:
        out = self.epp[0](features[3])  # (B, 4b, H/16, W/16)
        for i in range(3):
            skip = features[2 - i]
            out = upsample(out, skip.shape[-2:])  # x2
            out = self.epp[i + 1](self.skip_norm[i](self.skip[i](skip) + out))
        return upsample(out, size)  # (B, classes, H, W)


class EdgeNetsSegmentation(nn.Module):
    """Encoder (a backbone with ``forward_features``/``feature_info``) + :class:`EPPDecoder`.

    Parameters are named ``backbone.*`` and ``decoder.*`` (the segmentation task's
    ``head_prefix=decoder`` gives the decoder its 10x learning rate).

    Shape:
        (B, in_chans, H, W) -> (B, num_classes, H, W)
    """

    def __init__(self, backbone: nn.Module, num_classes: int, *, base_width: int = 16) -> None:
        super().__init__()
        self.backbone = backbone
        self.decoder = EPPDecoder(
            [info.channels for info in backbone.feature_info], num_classes, base_width=base_width
        )

    def init_weights(self) -> None:
        """EdgeNets' initialisation for the whole network (kaiming-normal fan_out, BN (1, 0))."""
        init_conv_bn_linear(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.backbone.forward_features(x), x.shape[-2:])


def dicenet_segmentation(
    scale: float = 1.0,
    num_classes: int = 21,
    in_chans: int = 3,
    *,
    input_size: int | Sequence[int] = 224,
    base_width: int = 16,
) -> EdgeNetsSegmentation:
    """DiCENet segmentation (thesis Sec. 3.6): DiCENet levels 1-4 (DiCE built for ``input_size``,
    224 as in the released weights) + EPP decoder. The official
    ``dicenet_s_<s>_<pascal|city>_<W>x<H>.pth`` load with :func:`src.compat.load_official`."""
    backbone = DiCENetBackbone(scale, in_chans, input_size=input_size, depth=4)
    net = EdgeNetsSegmentation(backbone, num_classes, base_width=base_width)
    net.init_weights()
    return net


def espnetv2_segmentation(
    scale: float = 1.0,
    num_classes: int = 21,
    in_chans: int = 3,
    *,
    base_width: int = 16,
) -> EdgeNetsSegmentation:
    """ESPNetv2 segmentation (thesis Sec. 2.4.2): ESPNetv2 levels 1-4 + EPP decoder. The official
    ``espnetv2_s_<s>_<pascal|city>_<W>x<H>.pth`` load with :func:`src.compat.load_official`."""
    backbone = ESPNetv2Backbone(scale, in_chans, depth=4)
    net = EdgeNetsSegmentation(backbone, num_classes, base_width=base_width)
    net.init_weights()
    return net
