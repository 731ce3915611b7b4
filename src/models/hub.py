"""Baseline networks from the ecosystem (timm, torchvision), built by name from config.

``model=timm model.name=mobilenetv2_100`` and ``model=torchvision model.name=shufflenet_v2_x1_0``
give any architecture those libraries register, with the task's number of classes and input
channels. Weights come from a local file (``weights=...``); nothing is downloaded.
"""

from __future__ import annotations

import timm
import torchvision
from torch import nn

from src.models.weights import load_state_dict_file


def timm_model(
    name: str,
    num_classes: int,
    in_chans: int = 3,
    *,
    drop_rate: float = 0.0,
    weights: str | None = None,
) -> nn.Module:
    """A timm network by registered name (``timm.list_models()``)."""
    if name not in timm.list_models():
        close = timm.list_models(f"*{name.split('_')[0]}*")[:20]
        raise ValueError(f"timm has no model '{name}'; similar names: {close}")
    model = timm.create_model(name, num_classes=num_classes, in_chans=in_chans, drop_rate=drop_rate)
    if weights is not None:
        load_state_dict_file(model, weights)
    return model


def replace_input_conv(model: nn.Module, in_chans: int) -> None:
    """Swap the first 3-channel convolution for one taking ``in_chans`` channels."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d) and child.in_channels == 3:
                setattr(
                    parent,
                    child_name,
                    nn.Conv2d(
                        in_chans,
                        child.out_channels,
                        child.kernel_size,
                        child.stride,
                        child.padding,
                        child.dilation,
                        child.groups,
                        child.bias is not None,
                    ),
                )
                return
    raise ValueError(f"{type(model).__name__} has no 3-channel input convolution to adapt")


def torchvision_model(
    name: str,
    num_classes: int,
    in_chans: int = 3,
    *,
    weights: str | None = None,
) -> nn.Module:
    """A torchvision classification network by name (``torchvision.models.list_models()``)."""
    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise ValueError(
            f"torchvision has no classification model '{name}'; available: {available}"
        )
    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    if in_chans != 3:
        replace_input_conv(model, in_chans)
    if weights is not None:
        load_state_dict_file(model, weights)
    return model
