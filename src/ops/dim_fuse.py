"""Dimension-wise fusion (DimFuse): merge DimConv's 3C channels into C_out channels.

DiCENet (thesis ch. 3, Sec. 3.3.1, Fig. 3.3), as in the official ``DICE`` layer:

1. BN and PReLU over the 3C input channels;
2. local fusion: a grouped 1x1 conv 3C -> C with C groups (each group sees the three dimension-wise
   responses of one channel when the input is interleaved), then BN and PReLU; call it Y_l;
3. global fusion: a spatial 3x3 conv C -> C_out with gcd(C, C_out) groups, BN and PReLU, multiplied
   by a channel gate sigmoid(1x1(C//4 -> C_out)(ReLU(1x1(C -> C//4)(GAP(Y_l))))). The gate has no
   BN and no biases; C//4 is floor division (92 -> 23).

BN and PReLU act per channel on whatever order the input has; with the official concat-then-shuffle
layout the converter permutes their parameters (``src.compat.edgenets``).

The local fusion as a function of its parameters, with DimConv before it in one Triton pass, is
:mod:`src.kernels.dim_fuse`; the DiCE unit chooses that path (:mod:`src.kernels.dice`).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import FusingSequential, batch_norm_prelu
from src.kernels.inference_folding import ConvBNPReLU
from src.kernels.local_fusion_conv import LocalFusionConv
from src.kernels.pointwise_conv import PointwiseConv2d
from src.kernels.prelu import PReLU


def spatial_cbr(channels: int, out_channels: int) -> ConvBNPReLU:
    """The global fusion's spatial part: a 3x3 CBR C -> C_out with gcd(C, C_out) groups.

    Shape:
        (B, C, H, W) -> (B, C_out, H, W)
    """
    return ConvBNPReLU(channels, out_channels, 3, groups=math.gcd(channels, out_channels))


class ChannelGate(nn.Sequential):
    """The global fusion's channel gate, squeeze-excitation without BN or bias: GAP -> 1x1 C -> C//4
    -> ReLU -> 1x1 C//4 -> C_out -> sigmoid (C//4 is floor division: 92 -> 23).

    Shape:
        (B, C, H, W) -> (B, C_out, 1, 1)
    """

    def __init__(self, channels: int, out_channels: int) -> None:
        hidden = channels // 4
        super().__init__(
            nn.AdaptiveAvgPool2d(1),
            PointwiseConv2d(channels, hidden, bias=False),
            nn.ReLU(),
            PointwiseConv2d(hidden, out_channels, bias=False),
            nn.Sigmoid(),
        )


def ablation_gate(channels: int, out_channels: int) -> nn.Sequential:
    """A :class:`ChannelGate` as the DiCE-unit ablations hold it: the one child ``body`` (their
    state-dict keys are ``gate.body.*``, DimFuse's ``gate.*``).

    Shape:
        (B, C, H, W) -> (B, C_out, 1, 1)
    """
    return nn.Sequential(OrderedDict(body=ChannelGate(channels, out_channels)))


def global_fusion(y_local: Tensor, spatial: nn.Module, gate: nn.Module) -> Tensor:
    """Global fusion (thesis Sec. 3.3.1): ``spatial(Y_l) * gate(Y_l)``, the gate broadcast over
    (H, W).

    Shape:
        (B, C, H, W) -> (B, C_out, H, W)
    """
    return spatial(y_local) * gate(y_local)  # (B, C_out, H, W) * (B, C_out, 1, 1)


class GlobalFusion(nn.Module):
    """DimFuse's global fusion alone: :func:`spatial_cbr` times a channel gate. It fuses C channels
    without DimConv's 3C triples ("DWise + DimFuse", thesis Table 3.2b) and replaces the DiCENet
    unit's point-wise conv in Table 3.3 (``reduce="dimfuse"``).

    Shape:
        (B, C, H, W) -> (B, C_out, H, W)
    """

    def __init__(self, channels: int, out_channels: int) -> None:
        super().__init__()
        self.spatial = spatial_cbr(channels, out_channels)
        self.gate = ablation_gate(channels, out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return global_fusion(x, self.spatial, self.gate)


class DimFuse(nn.Module):
    """Local (grouped 1x1) then global (spatial 3x3 x channel gate) fusion of 3C channels.

    Args:
        channels: C; the input has 3C channels, consecutive triples fused into one channel.
        out_channels: C_out.

    Shape:
        (B, 3C, H, W) -> (B, C_out, H, W)
    """

    def __init__(self, channels: int, out_channels: int) -> None:
        super().__init__()
        if channels < 4 or out_channels < 1:
            raise ValueError(
                "need channels >= 4 (the gate's hidden width is channels // 4) and "
                "out_channels >= 1, "
                f"got channels={channels}, out_channels={out_channels}"
            )
        self.channels = channels
        self.out_channels = out_channels
        self.norm = BatchNorm2d(3 * channels)
        self.act = PReLU(3 * channels)
        # local fusion: (D_c, H_c, W_c) -> one channel
        self.local = FusingSequential(
            LocalFusionConv(channels),  # the grouped 1x1 conv 3C -> C, one-pass CPU kernels
            BatchNorm2d(channels),
            PReLU(channels),
        )
        # global fusion: spatial part and channel gate
        self.spatial = spatial_cbr(channels, out_channels)
        self.gate = ChannelGate(channels, out_channels)

    def reset_parameters(self) -> None:
        """PyTorch's defaults for every conv, BN and PReLU (the state right after construction)."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.BatchNorm2d, nn.PReLU)):
                module.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != 3 * self.channels:
            raise ValueError(f"expected (B, {3 * self.channels}, H, W), got {tuple(x.shape)}")
        return self.global_fusion(self.local(batch_norm_prelu(x, self.norm, self.act)))

    def fuse_branches(self, branches: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """``forward`` of DimConv's three branches before their interleave, in inference: the
        same map without joining them. Channel c of branch b is input channel 3c + b, so the
        BN and PReLU over 3C act per branch with every third parameter, and the local fusion
        (one 3 -> 1 group per channel) is a per-channel weighted sum of the branches.

        The exported graph of the DiCE unit at its build size (:class:`src.ops.dice.DiCE`): the
        join (a stack and reshape of 3C channels) needs the NCHW layout that XNNPACK converts to
        and from around each one; without it DiCENet s=1.0's ExecuTorch program ran 0.78x the
        time (6.30 -> 4.93 ms), onnxruntime's unchanged.

        Shape:
            3 x (B, C, H, W) -> (B, C_out, H, W)
        """
        norm, act, weight = self.norm, self.act, self.local[0].weight  # weight (C, 3, 1, 1)
        fused = None
        for b, y in enumerate(branches):
            every_third = slice(b, None, 3)
            z = F.batch_norm(
                y,
                norm.running_mean[every_third],
                norm.running_var[every_third],
                norm.weight[every_third],
                norm.bias[every_third],
                False,
                0.0,
                norm.eps,
            )
            term = F.prelu(z, act.weight[every_third]) * weight[:, b].reshape(1, -1, 1, 1)
            fused = term if fused is None else fused + term
        local_norm, local_act = self.local[1], self.local[2]
        return self.global_fusion(local_act(local_norm(fused)))

    def global_fusion(self, fused: Tensor) -> Tensor:
        """The global fusion of the local fusion's output Y_l.

        Shape:
            (B, C, H, W) -> (B, C_out, H, W)
        """
        return global_fusion(fused, self.spatial, self.gate)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, out_channels={self.out_channels}"
