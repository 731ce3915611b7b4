"""SSD prior (default) boxes as the official EdgeNets generator builds them.

Official ``model/detection/ssd_config.py`` and ``generate_priors.py``: six maps with strides
(8, 16, 32, 64, 100, 300) at 300x300 and (8, 16, 32, 64, 128, 512) at 512x512, feature-map sizes
ceil(size / stride); box sizes ``int(linspace(ceil(0.1 size), ceil(1.05 size), 7))``, level k
using min = sizes[k] and max = sizes[k + 1]; aspect ratios (2, 3) at every level, so six boxes
per location, in the order: square min, square sqrt(min max), then for r in (2, 3)
(min sqrt r, min / sqrt r) and (min / sqrt r, min sqrt r). Centres are ((j + 0.5) / (size /
stride), (i + 0.5) / (size / stride)), row-major over (i, j); all four of (cx, cy, w, h) are then
clamped to [0, 1]. torchvision's ``DefaultBoxGenerator`` with ``scales = sizes / size`` and
``steps = strides`` gives the same boxes in the same order, except that it clamps w and h only:
at 300 the stride-32 map has 10 cells for 9.375 centre steps, and the official clamp moves the
centres of its last column and row from 9.5 / 9.375 = 1.0133 to 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import Tensor

# Image size -> strides of the six prior maps (official SSD300/SSD512 configurations)
PRIOR_STRIDES: Mapping[int, tuple[int, ...]] = MappingProxyType(
    {300: (8, 16, 32, 64, 100, 300), 512: (8, 16, 32, 64, 128, 512)}
)
ASPECT_RATIOS = (2, 3)
BOXES_PER_LOCATION = 2 + 2 * len(ASPECT_RATIOS)


def _strides(image_size: int) -> tuple[int, ...]:
    if image_size not in PRIOR_STRIDES:
        raise ValueError(
            f"no SSD prior configuration for image_size={image_size}; "
            f"valid: {sorted(PRIOR_STRIDES)}"
        )
    return PRIOR_STRIDES[image_size]


def prior_feature_sizes(image_size: int) -> tuple[int, ...]:
    """Side of each prior map: ceil(image_size / stride) (38, 19, 10, 5, 3, 1 at 300)."""
    return tuple(math.ceil(image_size / stride) for stride in _strides(image_size))


def prior_box_sizes(image_size: int) -> tuple[int, ...]:
    """The seven box sizes in pixels, ``int(linspace(ceil(0.1 s), ceil(1.05 s), 7))``.

    Level k uses min = sizes[k], max = sizes[k + 1]: (30, 77, 125, 172, 220, 267, 315) at 300."""
    levels = len(_strides(image_size))
    low, high = math.ceil(0.1 * image_size), math.ceil(1.05 * image_size)
    # numpy's linspace: low + i * step with step = (high - low) / levels, then truncation
    step = (high - low) / levels
    return tuple(int(low + i * step) for i in range(levels)) + (high,)


def ssd_priors(image_size: int) -> Tensor:
    """The official SSD priors for a square ``image_size`` image (300 or 512).

    Shape:
        (P, 4) float32 (cx, cy, w, h) normalised to [0, 1]; P = 11,640 at 300, 32,742 at 512,
        ordered by map (finest first), then location (row-major), then the six boxes.
    """
    strides = _strides(image_size)
    sizes = prior_box_sizes(image_size)
    maps = []
    for k, (stride, side) in enumerate(zip(strides, prior_feature_sizes(image_size))):
        steps = image_size / stride
        small = sizes[k] / image_size
        big = math.sqrt(sizes[k] * sizes[k + 1]) / image_size
        wh = [(small, small), (big, big)]
        for ratio in ASPECT_RATIOS:
            root = math.sqrt(ratio)
            wh += [(small * root, small / root), (small / root, small * root)]
        centres = (torch.arange(side, dtype=torch.float64) + 0.5) / steps
        cy, cx = torch.meshgrid(centres, centres, indexing="ij")  # (side, side) each
        # (side*side, 1, 2) centres beside (1, 6, 2) sizes -> (side*side, 6, 4)
        xy = torch.stack((cx, cy), dim=-1).reshape(-1, 1, 2).expand(-1, len(wh), 2)
        boxes = torch.cat((xy, torch.tensor(wh, dtype=torch.float64).expand(len(xy), -1, 2)), -1)
        maps.append(boxes.reshape(-1, 4))
    return torch.cat(maps).clamp_(0.0, 1.0).float()
