"""DimFuse's local fusion as a function of its parameters, and DimConv with it in one pass.

:class:`src.ops.dim_fuse.DimFuse` is the layer (thesis ch. 3, Sec. 3.3.1). Its local fusion, BN and
PReLU over DimConv's 3C channels then the grouped 1x1 conv 3C -> C, is :func:`local_fusion` here;
:func:`local_fusion_reference` is DimConv followed by it, in PyTorch, the oracle of the Triton
kernels (``triton_kernel.py``) that compute both in registers without writing the 3C channels, and
of their contract (``contract.py``). The DiCE unit chooses between them (:mod:`src.kernels.dice`).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from src.kernels.dim_conv import dim_conv_reference
from src.kernels.prelu import prelu


def local_fusion_reference(
    x: Tensor,
    weight_channel: Tensor,
    weight_height: Tensor,
    weight_width: Tensor,
    *,
    dilation: tuple[int, int, int],
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor,
    bias: Tensor,
    alpha: Tensor,
    w_local: Tensor,
    training: bool,
    momentum: float,
    eps: float,
    post: tuple[Tensor, Tensor, Tensor] | None = None,
) -> Tensor:
    """Interleaved DimConv then DimFuse's local fusion, in plain PyTorch (the oracle of the fused
    kernel, :func:`src.kernels.dim_fuse.triton_kernel.local_fusion_triton`):
    ``conv1x1_groups=C(PReLU(BN(DimConv(x))))``, BN as ``F.batch_norm`` (``training`` uses and
    ``momentum`` updates the running statistics). ``post = (scale, shift, slope)`` appends the
    second BN folded to an affine map and its PReLU (inference).

    Shape:
        x (B, C, H, W); DimConv weights as :class:`src.ops.dim_conv.DimConv`'s; running
        statistics, weight, bias, alpha (3C,); w_local (C, 3, 1, 1); post three (C,)
        -> (B, C, H, W)
    """
    h = dim_conv_reference(
        x, weight_channel, weight_height, weight_width, dilation=dilation, interleave=True
    )
    return local_fusion(
        h,
        running_mean=running_mean,
        running_var=running_var,
        weight=weight,
        bias=bias,
        alpha=alpha,
        w_local=w_local,
        training=training,
        momentum=momentum,
        eps=eps,
        post=post,
    )


def local_fusion(
    h: Tensor,
    *,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor,
    bias: Tensor,
    alpha: Tensor,
    w_local: Tensor,
    training: bool,
    momentum: float,
    eps: float,
    post: tuple[Tensor, Tensor, Tensor] | None = None,
) -> Tensor:
    """DimFuse's local fusion of DimConv's interleaved output h, as functions of its parameters
    (see :func:`local_fusion_reference`).

    Shape:
        h (B, 3C, H, W) -> (B, C, H, W)
    """
    z = F.batch_norm(h, running_mean, running_var, weight, bias, training, momentum, eps)
    local = F.conv2d(prelu(z, alpha), w_local, groups=h.shape[1] // 3)
    if post is not None:
        scale, shift, slope = post
        local = F.prelu(local * scale[:, None, None] + shift[:, None, None], slope)
    return local
