"""What a backbone's ``forward_features`` returns: one :class:`FeatureInfo` per feature map.

Heads (segmentation decoders, detectors) read ``backbone.feature_info`` to size their layers, so a
backbone can be swapped without touching the head (STYLE rule 12).
"""

from __future__ import annotations

from typing import NamedTuple


class FeatureInfo(NamedTuple):
    """One feature map of ``forward_features``: its channels and its stride w.r.t. the input."""

    channels: int
    stride: int
