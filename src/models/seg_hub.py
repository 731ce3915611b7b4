"""torchvision segmentation networks as baselines: ``model=torchvision_seg model.name=...``.

torchvision's segmentation models return a dict (``out`` and, optionally, ``aux``); the tasks
expect a logits tensor, and the segmentation task's ``head_lr_multiplier`` expects the decoder's
parameters under one name. ``TorchvisionSegmentation`` provides both: ``backbone`` and ``decoder``
(torchvision's ``classifier``), returning the logits up-sampled to the input size as torchvision
does. Nothing is downloaded; weights come from a local file (``weights=...``).
"""

from __future__ import annotations

import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from torchvision.models.segmentation.lraspp import LRASPP

from src.models.hub import replace_input_conv
from src.models.weights import load_state_dict_file


class TorchvisionSegmentation(nn.Module):
    """A torchvision segmentation network as ``backbone`` + ``decoder``, returning logits.

    Shape:
        (B, in_chans, H, W) -> (B, num_classes, H, W)
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if getattr(model, "aux_classifier", None) is not None:
            raise ValueError(
                "build the torchvision model without its auxiliary classifier (aux_loss=False)"
            )
        self.backbone = model.backbone
        self.decoder = model.classifier
        # LR-ASPP's head reads the low- and high-level features; FCN's and DeepLabV3's read "out"
        self.decoder_reads_all_features = isinstance(model, LRASPP)

    def forward(self, x: Tensor) -> Tensor:
        features = self.backbone(x)
        logits = self.decoder(features if self.decoder_reads_all_features else features["out"])
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)

    def extra_repr(self) -> str:
        return f"decoder_reads_all_features={self.decoder_reads_all_features}"


def torchvision_segmentation(
    name: str,
    num_classes: int,
    in_chans: int = 3,
    *,
    weights: str | None = None,
) -> nn.Module:
    """A torchvision segmentation network by name, randomly initialised (no download).

    ``torchvision.models.list_models(module=torchvision.models.segmentation)`` lists the names,
    e.g. ``lraspp_mobilenet_v3_large`` (3.2 M parameters), ``deeplabv3_mobilenet_v3_large``,
    ``fcn_resnet50``.
    """
    available = torchvision.models.list_models(module=torchvision.models.segmentation)
    if name not in available:
        raise ValueError(f"torchvision has no segmentation model '{name}'; available: {available}")
    model = torchvision.models.get_model(
        name, weights=None, weights_backbone=None, num_classes=num_classes
    )
    net = TorchvisionSegmentation(model)
    if in_chans != 3:
        replace_input_conv(net.backbone, in_chans)
    if weights is not None:
        load_state_dict_file(net, weights)
    return net
