"""DimFuse's local fusion as a function of its parameters, and DimConv with it in one pass.

:class:`src.ops.dim_fuse.DimFuse` is the layer (thesis ch. 3, Sec. 3.3.1). Its local fusion, BN and
PReLU over DimConv's 3C channels then the grouped 1x1 conv 3C -> C, is :func:`local_fusion` here;
:func:`local_fusion_reference` is DimConv followed by it, in PyTorch, the oracle of the Triton
kernels (``triton_kernel.py``) that compute both in registers without writing the 3C channels, and
of their contract (``contract.py``). The DiCE unit chooses between them (:mod:`src.kernels.dice`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import torch.nn.functional as F
from torch import Tensor

from src.kernels.dim_conv import dim_conv_reference
from src.kernels.dim_conv.contract import Weights
from src.kernels.prelu import prelu

if TYPE_CHECKING:
    from typing_extensions import Unpack


class LocalFusionState(TypedDict):
    """The local fusion's parameters and mode, as keyword arguments of :func:`local_fusion`,
    :func:`local_fusion_reference` and the fused kernel
    (:func:`src.kernels.dim_fuse.triton_kernel.local_fusion_triton`).

    - ``running_mean``, ``running_var`` (3C,) or None: BN's running statistics;
    - ``weight``, ``bias`` (3C,): BN's affine map; ``alpha`` (3C,): the PReLU's slopes;
    - ``w_local`` (C, 3, 1, 1): the grouped 1x1 conv 3C -> C;
    - ``training``: BN normalises with the batch statistics and ``momentum`` (the resolved
      factor) updates the running ones, as ``F.batch_norm``; ``eps``: BN's;
    - ``post``: None, or ``(scale, shift, slope)`` (C,) each: DimFuse's second BN folded to an
      affine map, and its PReLU (inference only).
    """

    running_mean: Tensor | None
    running_var: Tensor | None
    weight: Tensor
    bias: Tensor
    alpha: Tensor
    w_local: Tensor
    training: bool
    momentum: float
    eps: float
    post: tuple[Tensor, Tensor, Tensor] | None


def local_fusion_reference(
    x: Tensor,
    weights: Weights,
    *,
    dilation: tuple[int, int, int],
    **state: Unpack[LocalFusionState],
) -> Tensor:
    """Interleaved DimConv then DimFuse's local fusion, in plain PyTorch (the oracle of the fused
    kernel, :func:`src.kernels.dim_fuse.triton_kernel.local_fusion_triton`):
    ``conv1x1_groups=C(PReLU(BN(DimConv(x))))``, then the folded second BN and PReLU when
    ``state["post"]`` is given.

    Shape:
        x (B, C, H, W); weights, DimConv's (:data:`~src.kernels.dim_conv.contract.Weights`);
        state as :class:`LocalFusionState` -> (B, C, H, W)
    """
    h = dim_conv_reference(x, weights, dilation=dilation, interleave=True)
    return local_fusion(h, **state)


def local_fusion(h: Tensor, **state: Unpack[LocalFusionState]) -> Tensor:
    """DimFuse's local fusion of DimConv's interleaved output h, as a function of its parameters
    (:class:`LocalFusionState`).

    Shape:
        h (B, 3C, H, W) -> (B, C, H, W)
    """
    z = F.batch_norm(
        h, state["running_mean"], state["running_var"], state["weight"], state["bias"],
        state["training"], state["momentum"], state["eps"],
    )  # fmt: skip
    local = F.conv2d(prelu(z, state["alpha"]), state["w_local"], groups=h.shape[1] // 3)
    if state["post"] is not None:
        scale, shift, slope = state["post"]
        local = F.prelu(local * scale[:, None, None] + shift[:, None, None], slope)
    return local
