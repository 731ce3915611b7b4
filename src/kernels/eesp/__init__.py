"""EESP's pyramid as a function of its parameters, its reference, its paths and their choice.

:class:`src.ops.eesp.EESP` is the unit; this is what it runs on. The pyramid (split, transform,
hierarchical feature fusion, concatenation, BN and PReLU) has three paths besides the unit's own
eager modules:

- :func:`eesp_pyramid`: the pyramid as a function, in PyTorch ops (the reference, the oracle of
  the fused pass) or in one Triton pass (:mod:`.triton_kernel`: the K dilated branches, the
  hierarchical sum, BN and PReLU in registers; the contract it shares is :mod:`.contract`).
  :func:`fused_pyramid` takes the Triton pass for a unit where it applies, ``impl="auto"`` where
  :func:`pyramid_path` chose it;
- :func:`folded_forward`: the whole unit in CPU inference
  (:func:`src.kernels.inference_folding.folded_inference`, ``impl="auto"``), its BNs folded into
  the 1x1 convolutions (run as batched matrix products) and the pyramid in one call of the C++
  kernel (``eesp.cpp``) where it is built (else in the unit's eager calls); the same map up to
  float rounding.

The functions of a unit read its modules and attributes: ``transform`` (the K depth-wise 3x3
branches), ``dilations``, ``stride``, ``hff``, ``fuse_norm`` and ``fuse_act`` (the BN and PReLU of
the concatenation), ``reduce``, ``merge`` and ``act``, ``impl`` and ``cpu_kernel``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from src.kernels import (
    Timer,
    autocast_dtype,
    autocast_operands,
    check_same_dtype,
    choose,
    declare,
    size_bucket,
    use_triton,
)
from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.eesp import contract as contract
from src.kernels.fused_norm import (
    batch_norm_factor,
    check_batch,
    refuse_autograd,
    running_affine,
    timed_pass,
    update_running_statistics,
)
from src.kernels.inference_folding import batch_norm_affine, cached, conv_bn, folded_inference
from src.kernels.prelu import prelu

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PYRAMID_CHOICE = declare("eesp.pyramid", ("fused", "eager"))


def eesp_pyramid(
    r: Tensor,
    weight: Tensor,
    *,
    dilations: Sequence[int],
    stride: int,
    hff: bool,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    norm_weight: Tensor,
    norm_bias: Tensor,
    alpha: Tensor,
    training: bool,
    momentum: float,
    eps: float,
    impl: str = "reference",
) -> Tensor:
    """EESP's pyramid as a function of its parameters: K depth-wise dilated 3x3 convolutions,
    hierarchical fusion, concatenation, BN (``training`` normalises with the batch statistics
    and, where running statistics are given, updates them in place with the resolved
    ``momentum`` and the unbiased variance, as ``F.batch_norm`` does; otherwise the running
    statistics are used) and PReLU.

    ``impl="reference"`` runs PyTorch ops (``F.conv2d``, ``F.batch_norm``): the oracle of the
    fused pass. ``impl="triton"`` runs the fused pass (:mod:`.triton_kernel`), a float dtype
    after autocast's casts; with running statistics it has no backward (an inference pass).

    Shape:
        r (B, n, H, W); weight (K, n, 9) (the K depth-wise 3x3 kernels); running statistics,
        norm_weight, norm_bias, alpha (K n,) -> (B, K n, ceil(H / stride), ceil(W / stride))
    """
    if impl not in ("reference", "triton"):
        raise ValueError(f"impl must be 'reference' or 'triton', got {impl!r}")
    if impl == "reference":
        channels = r.shape[1]
        fused: list[Tensor] = []
        for k, d in enumerate(dilations):
            kernel = weight[k].view(channels, 1, 3, 3)
            y = F.conv2d(r, kernel, stride=stride, padding=d, dilation=d, groups=channels)
            fused.append(y + fused[-1] if hff and fused else y)
        z = F.batch_norm(
            torch.cat(fused, dim=1), running_mean, running_var, norm_weight, norm_bias, training,
            momentum, eps,
        )  # fmt: skip
        return prelu(z, alpha)
    from src.kernels.eesp.triton_kernel import pyramid_inference, pyramid_training

    (r, weight) = autocast_operands(r.device.type, r, weight)
    dtype = check_same_dtype("EESP pyramid", r=r, weight=weight)
    if dtype not in TRITON_DTYPES:
        raise TypeError(f"the fused EESP pyramid takes {TRITON_DTYPES}, got {dtype}")
    branches = weight.shape[0]
    if weight.shape != (branches, r.shape[1], 9) or len(dilations) != branches:
        raise ValueError(
            f"weight must be (K, n, 9) = (K, {r.shape[1]}, 9) with K dilations, got "
            f"{tuple(weight.shape)} and {tuple(dilations)}"
        )
    weight = weight.contiguous()
    dilations = tuple(int(d) for d in dilations)
    gamma, beta, alpha = (t.float().contiguous() for t in (norm_weight, norm_bias, alpha))
    if training:
        _, _, out_h, out_w = contract.output_shape(r, branches, stride)
        count = r.shape[0] * out_h * out_w
        check_batch(count, r.shape)
        y, mean, var = pyramid_training(r, weight, gamma, beta, alpha, dilations, stride, hff, eps)
        update_running_statistics(running_mean, running_var, mean, var, count, momentum)
        return y
    refuse_autograd("EESP pyramid", r, weight, norm_weight, norm_bias, alpha)
    scale, shift = running_affine(running_mean, running_var, gamma, beta, eps)
    return pyramid_inference(r, weight, scale, shift, alpha, dilations, stride, hff)


def pyramid_weight(unit: nn.Module) -> Tensor:
    """The unit's K depth-wise kernels stacked (differentiably).

    Shape:
        (K, n, 9)
    """
    return torch.stack([conv.weight.reshape(-1, 9) for conv in unit.transform])


def pyramid_args(unit: nn.Module, *, advance: bool = True) -> dict:
    """Keyword arguments of :func:`eesp_pyramid` for the unit's state; in training ``advance``
    counts the batch in BN's ``num_batches_tracked``."""
    norm = unit.fuse_norm
    return {
        "dilations": unit.dilations,
        "stride": unit.stride,
        "hff": unit.hff,
        "running_mean": norm.running_mean,
        "running_var": norm.running_var,
        "norm_weight": norm.weight,
        "norm_bias": norm.bias,
        "alpha": unit.fuse_act.weight.expand(unit.out_channels),
        "training": unit.training,
        "momentum": batch_norm_factor(norm, advance=advance and unit.training),
        "eps": norm.eps,
    }


def depthwise_branches(unit: nn.Module) -> bool:
    """Whether every branch of the unit is the depth-wise 3x3 the fused kernels compute (an
    ablation may replace them by dense convolutions, see ``src.models.espnetv2.EESPAblation``)."""
    n = unit.out_channels // len(unit.dilations)
    return all(
        conv.kernel_size == (3, 3)
        and conv.groups == conv.in_channels == conv.out_channels == n
        and conv.dilation == conv.padding == (d, d)
        and conv.stride == (unit.stride, unit.stride)
        for conv, d in zip(unit.transform, unit.dilations, strict=True)
    )


def fused_pyramid(unit: nn.Module, reduced: Tensor) -> Tensor | None:
    """The unit's pyramid in one Triton pass where it applies, else None (the unit's eager
    modules then compute it): CUDA (or ``impl="triton"``), a float dtype, BN tracking running
    statistics, depth-wise 3x3 branches; in training, or in inference without autograd.
    ``impl="auto"`` takes it where :func:`pyramid_path` chose it (while ``torch.compile`` traces,
    without timing: the eager steps' choice or the default).

    Shape:
        reduced (B, n, H, W) -> (B, K n, H', W')
    """
    norm = unit.fuse_norm
    applies = (
        use_triton(unit.impl, reduced)  # first: on the CPU it ends the check
        and reduced.dtype in TRITON_DTYPES
        and reduced.dim() == 4
        and norm.track_running_stats
        and norm.affine
        and norm.training == unit.training
        and (unit.training or not torch.is_grad_enabled())
        and depthwise_branches(unit)
        and (unit.impl == "triton" or pyramid_path(unit, reduced) == "fused")
    )
    if not applies:
        return None
    return eesp_pyramid(reduced, pyramid_weight(unit), **pyramid_args(unit), impl="triton")


def pyramid_path(unit: nn.Module, reduced: Tensor, timer: Timer | None = None) -> str:
    """``impl="auto"`` on CUDA: "fused" (:mod:`.triton_kernel`) or "eager" (the branch
    convolutions, sums, concatenation, BN and PReLU as PyTorch ops), whichever was faster on the
    first call with this input shape (batch by :func:`~src.kernels.size_bucket`), dtype and mode
    (:func:`~src.kernels.choose`). Training times forward and backward on copies of the running
    statistics, without touching the parameters' gradients; inference times the forward. Under
    ``torch.use_deterministic_algorithms(True)`` it is "eager".

    Shape:
        reduced (B, n, H, W)
    """
    device = reduced.device.type
    autocast = autocast_dtype(device)
    key = (
        size_bucket(reduced.shape[0]), *reduced.shape[1:], reduced.dtype, autocast,
        unit.dilations, unit.stride, unit.hff, unit.training, str(reduced.device),
    )  # fmt: skip

    def run(path: str) -> None:
        impl = "triton" if path == "fused" else "reference"

        def forward(inputs: Tensor, args: dict) -> Tensor:
            return eesp_pyramid(inputs, pyramid_weight(unit), **args, impl=impl)

        timed_pass(unit, reduced, forward, pyramid_args(unit, advance=False))

    def candidates() -> dict:
        return {path: functools.partial(run, path) for path in ("fused", "eager")}

    return choose(PYRAMID_CHOICE, key, candidates, default="eager", reference="eager", timer=timer)


def folded_forward(unit: nn.Module, x: Tensor) -> Tensor | None:
    """The whole unit in CPU inference with ``impl="auto"``
    (:func:`src.kernels.inference_folding.folded_inference`), else None: the merge's BN folded
    into its 1x1 convolution, and the pyramid in one call of the C++ kernel where it applies
    (:func:`cpu_pyramid`), else in the unit's eager calls (its ``_pyramid``).

    Shape:
        (B, C_in, H, W) -> (B, C_out, H', W')
    """
    if not (unit.impl == "auto" and folded_inference(unit, x)):
        return None
    reduced = unit.reduce(x)  # (B, n, H, W)
    pyramid = cpu_pyramid(unit, reduced)
    if pyramid is None:
        pyramid = unit._pyramid(reduced)
    merged = conv_bn(unit.merge[0], unit.merge[1], pyramid)  # a fresh tensor
    if unit.stride == 2 and unit.down_method == "avg":
        return merged
    if merged.shape == x.shape:
        merged += x
    return F.prelu(merged, unit.act.weight)


def cpu_pyramid(unit: nn.Module, reduced: Tensor) -> Tensor | None:
    """The unit's pyramid in one call of the fused C++ kernel (``src/kernels/eesp/eesp.cpp``)
    where it applies (float32, depth-wise 3x3 branches, the kernel built, the unit's
    ``cpu_kernel`` set), else None. Its BN and the stacked kernels are folded once and cached.

    Shape:
        reduced (B, n, H, W) -> (B, K n, H', W')
    """
    if not (
        unit.cpu_kernel
        and reduced.dtype == torch.float32
        and depthwise_branches(unit)
        and cpu_kernels_loaded()
    ):
        return None

    def build() -> tuple[Tensor, Tensor]:
        scale, shift = batch_norm_affine(unit.fuse_norm)
        # (K, n, 9), (3, K n)
        return pyramid_weight(unit), torch.stack((scale, shift, unit.fuse_act.weight))

    weight, affine = cached(
        unit, build, (*unit.transform, unit.fuse_norm, unit.fuse_act), name="_pyramid"
    )
    return torch.ops.lightnets_cpu.eesp_pyramid(
        reduced.contiguous(), weight, unit.dilations, unit.stride, affine, unit.hff
    )
