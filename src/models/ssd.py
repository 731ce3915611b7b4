"""SSD with an EdgeNets backbone (ESPNetv2 or DiCENet) and the EPP top-down fusion.

Thesis Sec. 2.4.3 and 3.6.1; structure as the official EdgeNets
``model/detection/{ssd,espnetv2}.py`` build it:

1. Backbone features at strides 8, 16 and 32: ESPNetv2 levels 3 and 4 (c2, c3) and level 5 after
   its depth-wise 3x3 CBR and grouped 1x1 CBR c4 -> c5 (4 groups) (``head_conv``, the layers the
   classifier pools; 38, 19 and 10 pixels at 300x300).
2. Extra layers: extra6 and extra7 each a depth-wise 3x3 stride-2 CBR and a 1x1 CBR (c5 -> 512,
   512 -> 256; 5 and 3 pixels), extra8 an adaptive average pool to 1x1, a 1x1 conv (256 -> 128,
   no bias) and ReLU.
3. Top-down fusion with EPP (:class:`src.ops.epp.EfficientPyramidPooling`, projection =
   out // 5): each coarser output is up-sampled (bilinear, ``align_corners``) to the next finer
   map, concatenated with it and fused: 3+5 -> 512 (scales 2, 1), 5+10 -> c5 (2, 1, 0.5),
   10+19 -> c3 (2, 1, 0.5, 0.25), 19+38 -> c2 (2, 1, 0.5, 0.25).
4. 1x1 heads with bias on [fused 38 (c2), fused 19 (c3), fused 10 (c5), fused 5 (512), extra 3
   (256), extra 1 (128)]: 6 * 4 box offsets and 6 * C class scores per location, flattened as
   (map, row, column, box) to match :func:`src.models.ssd_priors.ssd_priors`. The original SSD
   uses 3x3 heads; the official code's 1x1 heads are followed here.

Initialisation as the official ``init_params``: ``xavier_uniform_`` on every convolution weight
of the whole network (its comment: Kaiming "does not let the model converge"); biases, BN and
PReLU keep PyTorch's defaults. ImageNet weights (the official recipe's start) are loaded over the
backbone by :func:`src.compat.load_official` (in training, ``task.init_checkpoint=<.pth>``): the
names ``backbone.*`` and ``head_conv.*`` are those of the classification ESPNetv2 (DiCENet:
``backbone.*``), so an official ``.pth`` loads through the classifier's key map and a classifier
checkpoint of this project loads as it is.

Differences from the official code:

* ESPNetv2: the official detector passes the image to the level-5 down-sampler, whose image
  shortcut never runs in ImageNet training and so starts from random weights. It is not built
  (as in :class:`src.models.espnetv2.ESPNetv2Backbone`): 5,210 parameters fewer at s = 2.0.
* DiCENet: the official DiCENet detector does not run (its level-5 width mismatches its extra
  layers). The same neck as ESPNetv2's is put on DiCENet's levels 3, 4 and 5 (thesis Sec. 3.6.1:
  DiCENet in SSD, 300x300); ``head_conv`` is a grouped 1x1 CBR c4 -> c5 (4 groups), the shape of
  the classifier's grouped FC, so that level 5 gives c5 channels as the official config intends.
  The DiCE layers are built for 224x224 (the ImageNet weights'), resizing inside DimConv.

Counts (``src.utils.complexity``, batch 1; MACs are convolution multiply-adds, the EdgeNets
convention). ESPNetv2 s = 2.0: 4,745,668 parameters with C = 21 and 5,807,668 with C = 81 (model
zoo: 4.75 M, 5.81 M); 0.913 B / 2.519 B MACs at 300 / 512 with C = 21 and 1.164 B / 3.217 B with
C = 81 (zoo: 0.9 / 2.5 and 1.1 / 3.2 B, i.e. these truncated to one decimal). DiCENet s = 2.4 at
300: 6.42 M / 7.51 M parameters and 1.00 B / 1.26 B convolution MACs (C = 21 / 81), above the
thesis's "about 5 M" and 0.7 / 0.9 B (Table 3.6): its backbone alone has 3.48 M parameters, so the
thesis's detector must have used a lighter neck, which it does not describe.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import Tensor, nn

from src.kernels.batch_norm import BatchNorm2d
from src.kernels.inference_folding import ConvBNPReLU
from src.kernels.prelu import PReLU
from src.models.dicenet import DiCENetBackbone
from src.models.espnetv2 import HEAD_GROUPS, ESPNetv2Backbone
from src.models.ssd_priors import BOXES_PER_LOCATION, prior_feature_sizes, ssd_priors
from src.ops.dim_conv import DimConv
from src.ops.epp import EfficientPyramidPooling, upsample

BACKBONES = ("espnetv2", "dicenet")
EXTRA_CHANNELS = (512, 256, 128)  # extra6, extra7, extra8 (official ``config += [512, 256, 128]``)
EPP_REDUCTION = 5
# pyramid scales of the four fusions, coarsest first (official
# ``bu_3x3_5x5`` ... ``bu_19x19_38x38``)
FUSION_SCALES = ((2.0, 1.0), (2.0, 1.0, 0.5), (2.0, 1.0, 0.5, 0.25), (2.0, 1.0, 0.5, 0.25))
DICENET_BUILD_SIZE = 224
# Published sizes, (backbone, scale, C, image size) -> (params in M or None, FLOPs in B, source):
# EdgeNets model zoo (model/detection/model_zoo/README.md; "FLOPs" are conv multiply-adds) and
# thesis Table 3.6(a) for DiCENet (COCO params "about 5 M").
REPORTED: Mapping[tuple[str, float, int, int], tuple[float | None, float, str]] = MappingProxyType(
    {
        ("espnetv2", 2.0, 21, 300): (4.75, 0.9, "EdgeNets model zoo"),
        ("espnetv2", 2.0, 21, 512): (4.75, 2.5, "EdgeNets model zoo"),
        ("espnetv2", 2.0, 81, 300): (5.81, 1.1, "EdgeNets model zoo"),
        ("espnetv2", 2.0, 81, 512): (5.81, 3.2, "EdgeNets model zoo"),
        ("dicenet", 2.4, 21, 300): (None, 0.7, "thesis Table 3.6(a)"),
        ("dicenet", 2.4, 81, 300): (5.0, 0.9, "thesis Table 3.6(a), params 'about 5 M'"),
    }
)


class ExtraLayer(nn.Module):
    """SSD extra layer (official ``SSDExtraLayers``): depth-wise 3x3 stride-2 CBR, 1x1 CBR.

    Shape:
        (B, C_in, h, w) -> (B, C_out, ceil(h / 2), ceil(w / 2))
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.layer = nn.Sequential(
            ConvBNPReLU(in_channels, in_channels, 3, stride=2, groups=in_channels),
            ConvBNPReLU(in_channels, out_channels, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)


def _backbone(name: str, scale: float) -> tuple[nn.Module, nn.Module, tuple[int, int, int]]:
    """(trunk up to stride 32, level-5 expansion, channels at strides 8, 16, 32)."""
    if name == "espnetv2":
        backbone: nn.Module = ESPNetv2Backbone(scale, depth=5)
        c = backbone.widths
        # the classification ESPNetv2's ``head_conv`` (same names, so its weights load)
        head_conv = nn.Sequential(
            nn.Conv2d(c[4], c[4], 3, padding=1, groups=c[4], bias=False),
            BatchNorm2d(c[4]),
            PReLU(c[4]),
            nn.Conv2d(c[4], c[5], 1, groups=HEAD_GROUPS, bias=False),
            BatchNorm2d(c[5]),
            PReLU(c[5]),
        )
    elif name == "dicenet":
        backbone = DiCENetBackbone(scale, input_size=DICENET_BUILD_SIZE, depth=5)
        c = backbone.widths
        head_conv = nn.Sequential(
            nn.Conv2d(c[4], c[5], 1, groups=HEAD_GROUPS, bias=False),
            BatchNorm2d(c[5]),
            PReLU(c[5]),
        )
    else:
        raise ValueError(f"backbone must be one of {BACKBONES}, got {name!r}")
    return backbone, head_conv, (c[2], c[3], c[5])


class SSD(nn.Module):
    """SSD300/SSD512 with an ESPNetv2 or DiCENet backbone (module docstring).

    Args:
        num_classes: C, background (index 0) included: 21 for VOC, 81 for COCO.
        backbone: "espnetv2" or "dicenet".
        scale: the backbone width s, a key of its width table (ESPNetv2: 0.5 ... 2.0, the model
            zoo's 2.0; DiCENet: 0.1 ... 2.4, the thesis's 2.4).
        image_size: 300 or 512, the square input the priors are laid out for.

    Attributes:
        priors: buffer (P, 4), (cx, cy, w, h) normalised (:func:`ssd_priors`).

    Shape:
        (B, 3, S, S) -> locations (B, P, 4), encoded offsets of the priors (centre variance 0.1,
        size variance 0.2), and logits (B, P, C); S = ``image_size``, P = 11,640 (300) or
        32,742 (512).
    """

    def __init__(
        self,
        num_classes: int,
        *,
        backbone: str = "espnetv2",
        scale: float = 2.0,
        image_size: int = 300,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes counts the background, so >= 2; got {num_classes}")
        self.num_classes = num_classes
        self.image_size = image_size
        self.register_buffer("priors", ssd_priors(image_size), persistent=False)
        self.map_sizes = prior_feature_sizes(image_size)
        self.backbone_name = backbone
        self.scale = scale
        self.backbone, self.head_conv, (c8, c16, c32) = _backbone(backbone, scale)
        c6, c7, c8_extra = EXTRA_CHANNELS
        self.extra6 = ExtraLayer(c32, c6)
        self.extra7 = ExtraLayer(c6, c7)
        self.extra8 = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(c7, c8_extra, 1, bias=False), nn.ReLU()
        )
        # (coarser input, finer input, output) channels of the four fusions, coarsest first
        fusions = ((c7, c6, c6), (c6, c32, c32), (c32, c16, c16), (c16, c8, c8))
        self.fusion = nn.ModuleList(
            EfficientPyramidPooling(a + b, out // EPP_REDUCTION, out, scales=scales)
            for (a, b, out), scales in zip(fusions, FUSION_SCALES)
        )
        self.head_channels = (c8, c16, c32, c6, c7, c8_extra)
        self.loc_heads = nn.ModuleList(
            nn.Conv2d(c, BOXES_PER_LOCATION * 4, 1) for c in self.head_channels
        )
        self.cls_heads = nn.ModuleList(
            nn.Conv2d(c, BOXES_PER_LOCATION * num_classes, 1) for c in self.head_channels
        )
        self.init_weights()

    def reported(self) -> tuple[float | None, float, str] | None:
        """This configuration's published (params in M, FLOPs in B, source), if any
        (:data:`REPORTED`)."""
        return REPORTED.get((self.backbone_name, self.scale, self.num_classes, self.image_size))

    def init_weights(self) -> None:
        """Official ``SSD300.init_params``: xavier-uniform weights for every convolution (DimConv's
        three kernels, Conv2d in the official DiCE, included); the rest keeps PyTorch's init."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
            elif isinstance(m, DimConv):
                for weight in (m.weight_channel, m.weight_height, m.weight_width):
                    nn.init.xavier_uniform_(weight)

    def forward_features(self, images: Tensor) -> list[Tensor]:
        """The six maps the heads see, finest first.

        Shape:
            (B, 3, S, S) -> [(B, head_channels[k], n_k, n_k)], n = (38, 19, 10, 5, 3, 1) at 300
        """
        _, _, x8, x16, x32 = self.backbone.forward_features(images)
        x32 = self.head_conv(x32)  # (B, c5, S/32, S/32)
        x64 = self.extra6(x32)  # (B, 512, 5, 5) at 300
        x128 = self.extra7(x64)  # (B, 256, 3, 3)
        x_global = self.extra8(x128)  # (B, 128, 1, 1)
        fused = x128
        outputs = []
        for fusion, skip in zip(self.fusion, (x64, x32, x16, x8)):
            fused = fusion(torch.cat((upsample(fused, skip.shape[-2:]), skip), dim=1))
            outputs.append(fused)
        return [*reversed(outputs), x128, x_global]

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        features = self.forward_features(images)
        sizes = tuple(f.shape[-1] for f in features)
        if sizes != self.map_sizes or any(f.shape[-2] != f.shape[-1] for f in features):
            maps = [tuple(f.shape[-2:]) for f in features]
            raise ValueError(
                f"input {tuple(images.shape[-2:])} gives maps {maps}; the priors need "
                f"{self.image_size}x{self.image_size} images (maps {self.map_sizes})"
            )
        batch = images.shape[0]
        locations, logits = [], []
        for feature, loc_head, cls_head in zip(features, self.loc_heads, self.cls_heads):
            # (B, 6 * 4, n, n) -> (B, n, n, 6 * 4) -> (B, n * n * 6, 4); likewise for C scores
            locations.append(loc_head(feature).permute(0, 2, 3, 1).reshape(batch, -1, 4))
            logits.append(
                cls_head(feature).permute(0, 2, 3, 1).reshape(batch, -1, self.num_classes)
            )
        return torch.cat(locations, dim=1), torch.cat(logits, dim=1)

    def extra_repr(self) -> str:
        return (
            f"backbone={self.backbone_name!r}, scale={self.scale}, num_classes={self.num_classes}, "
            f"image_size={self.image_size}"
        )
