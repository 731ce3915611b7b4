"""Folded inference: the eval-mode forward of conv + BN (+ PReLU) blocks with BN folded away.

In eval mode a BatchNorm is a per-channel affine map ``y = s * x + t`` with
``s = gamma / sqrt(running_var + eps)`` and ``t = beta - running_mean * s``, so it folds into the
convolution before it (weights scaled per output channel, ``t`` as the bias). Small CNNs such as
DiCENet spend much of their CPU time on per-call overhead of tiny ops, so the inference forward of
their blocks runs the folded form: fewer, larger calls, numerically the same map up to float
rounding.

The folded path runs only for *inference*: eval mode, autograd off (``torch.no_grad`` or
``torch.inference_mode``), on the CPU, without autocast (the folded kernels are float32; under
autocast the plain modules run in the autocast dtype), outside tracing and compilation. Training,
eval with autograd (e.g. input gradients, and the MAC counter of :mod:`src.utils.complexity`, which
counts the training-time formulation as the papers do) and CUDA use the plain modules. The folded
tensors are cached on the module and rebuilt whenever a source tensor changes: the cache key holds
every source's version counter, which in-place updates (optimizer steps, ``load_state_dict``, EMA
weight swaps) bump, and its storage pointer, which changes when a tensor is replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import batch_norm_prelu
from src.kernels.dispatch import exporting
from src.kernels.pointwise_conv import PointwiseConv2d
from src.kernels.prelu import PReLU


def folded_inference(module: nn.Module, x: Tensor) -> bool:
    """Whether ``module(x)`` should take its folded inference path (see the module docstring)."""
    return (
        not module.training
        and not torch.is_grad_enabled()
        and x.is_cpu
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not exporting()
    )


def batch_norm_affine(bn: nn.BatchNorm2d) -> tuple[Tensor, Tensor]:
    """The eval-mode BN as ``(scale, shift)``, each (C,)."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("folding needs a BatchNorm2d with running statistics")
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    shift = -bn.running_mean * scale
    if bn.bias is not None:
        shift = shift + bn.bias
    return scale, shift


def cached(
    owner: nn.Module,
    build: Callable[[], tuple[Tensor, ...]],
    modules: Sequence[nn.Module] | None = None,
    *,
    name: str = "",
) -> tuple[Tensor, ...]:
    """``build()``'s folded tensors, rebuilt only when a source tensor has changed.

    The sources are the parameters and buffers of ``modules`` (default: every module under
    ``owner``), looked up by name in their modules on every call, so replaced tensors are seen
    too. The folded tensors live in a plain attribute of ``owner`` (not a buffer): they are
    derived, never saved. ``name`` keeps several derived sets of the same sources apart.
    """
    refs = owner.__dict__.get(f"_folded_sources{name}")
    if refs is None:
        # (the module's parameter or buffer dict, name) of every source, resolved once
        refs = [
            (tensors, name)
            for module in (owner.modules() if modules is None else modules)
            for tensors in (module._parameters, module._buffers)
            for name in tensors
        ]
        owner.__dict__[f"_folded_sources{name}"] = refs
    key = tuple(
        (t._version, t.data_ptr()) if t is not None else None
        for t in (tensors[name] for tensors, name in refs)
    )
    slot = f"_folded_cache{name}"
    entry = owner.__dict__.get(slot)
    if entry is None or entry[0] != key:
        entry = (key, build())
        owner.__dict__[slot] = entry
    return entry[1]


def conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d, x: Tensor) -> Tensor:
    """``bn(conv(x))``; in inference (:func:`folded_inference`) with the BN folded into the
    convolution (cached on ``conv``), and a 1x1 convolution run as one (batched, for groups > 1)
    matrix product, which costs about half a convolution call on the small maps of these networks.

    Shape:
        (B, C_in, H, W) -> (B, C_out, H', W') as ``conv`` gives
    """
    if not folded_inference(conv, x):
        return bn(conv(x))
    return _folded_conv_bn(conv, bn, x)


def _folded_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d, x: Tensor) -> Tensor:
    """:func:`conv_bn`'s inference branch (the caller has checked :func:`folded_inference`)."""

    def build() -> tuple[Tensor, Tensor]:
        scale, shift = batch_norm_affine(bn)
        return conv.weight * scale[:, None, None, None], shift

    weight, bias = cached(conv, build, (conv, bn))
    if conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.padding == (0, 0):
        batch, _, height, width = x.shape
        g = conv.groups
        # (g, C_out / g, C_in / g) @ (B, g, C_in / g, H * W) -> (B, g, C_out / g, H * W)
        y = torch.matmul(
            weight.view(g, -1, conv.in_channels // g),
            x.reshape(batch, g, conv.in_channels // g, height * width),
        )
        return y.view(batch, -1, height, width).add_(bias[:, None, None])
    return F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups)


def conv_bn_prelu(conv: nn.Conv2d, bn: nn.BatchNorm2d, act: nn.PReLU, x: Tensor) -> Tensor:
    """``act(bn(conv(x)))``, folded in inference as :func:`conv_bn`.

    Shape:
        (B, C_in, H, W) -> (B, C_out, H', W') as ``conv`` gives
    """
    if not folded_inference(conv, x):
        return batch_norm_prelu(conv(x), bn, act)
    return F.prelu(_folded_conv_bn(conv, bn, x), act.weight)


class ConvBNPReLU(nn.Sequential):
    """conv (no bias) -> BN -> PReLU (per channel): the "CBR" of the EdgeNets models.

    An ``nn.Sequential`` so that the state-dict keys are ``0.weight``, ``1.*``, ``2.weight``; its
    inference forward is :func:`conv_bn_prelu`'s folded one.

    Args:
        in_channels, out_channels, kernel_size, stride, groups: of the convolution; padding is
            ``kernel_size // 2``.

    Shape:
        (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride)) for odd kernels
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        groups: int = 1,
    ) -> None:
        conv = (
            PointwiseConv2d(in_channels, out_channels, groups=groups, bias=False)
            if kernel_size == 1 and stride == 1
            else nn.Conv2d(
                in_channels,
                out_channels,
                kernel_size,
                stride,
                kernel_size // 2,
                groups=groups,
                bias=False,
            )
        )
        super().__init__(
            conv,
            BatchNorm2d(out_channels),
            PReLU(out_channels),
        )

    def forward(self, x: Tensor) -> Tensor:
        return conv_bn_prelu(self[0], self[1], self[2], x)
