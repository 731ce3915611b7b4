"""The DiCE unit's fast paths, as functions of the unit, and the choice among them.

The unit is :class:`src.ops.dice.DiCE` (thesis ch. 3, Sec. 3.3): DimConv (``unit.dim_conv``) then
DimFuse (``unit.dim_fuse``). :func:`dice_path` gives the path that replaces the two calls for an
input, or None where none applies:

- CPU inference (:func:`src.kernels.inference_folding.folded_inference`) with ``impl="auto"``:
  the same map with every BN folded, as one call of the fused C++ kernel (``dice.cpp``,
  :func:`kernel_forward`, any input size) where it applies (float32, C_out = C, the kernels
  built; the unit's ``cpu_kernel = False`` opts it out), else at the build size as eager calls
  (:func:`folded_forward`);
- where DimConv's Triton kernel runs (CUDA, or ``impl="triton"``) at the build size: DimConv and
  the first half of DimFuse (BN, PReLU, grouped 1x1 conv: the local fusion) as one pass that never
  writes DimConv's 3C channels (:mod:`src.kernels.dim_fuse.triton_kernel`,
  :func:`local_fusion_forward`): in training with BN's batch statistics (the backward recomputes
  them), in inference with the second BN and PReLU folded in too. ``impl="triton"`` always takes
  it, ``"auto"`` where :func:`local_fusion_path` measured it faster; the unit's
  ``local_fusion = False`` opts it out.

The folded tensors are cached on the unit (:func:`src.kernels.inference_folding.cached`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.dim_conv import resize_matrix
from src.kernels.dim_fuse import local_fusion
from src.kernels.dispatch import autocast_dtype, choose, declare, size_bucket, use_triton
from src.kernels.fused_norm import batch_norm_factor, timed_pass
from src.kernels.inference_folding import batch_norm_affine, cached, folded_inference
from src.kernels.timing import Timer


def dice_path(unit: nn.Module, x: Tensor) -> Callable[[Tensor], Tensor] | None:
    """The fused path ``unit(x)`` takes (see the module docstring), or None: DimConv then DimFuse.

    Shape:
        x (B, C, H, W) -> the path's output (B, C_out, H, W)
    """
    conv = unit.dim_conv
    if (
        folded_inference(unit, x)
        and conv.impl == "auto"
        and conv.interleave
        and x.dim() == 4
        and x.shape[1] == conv.channels
    ):
        if _kernel_applies(unit, x) and cpu_kernels_loaded():
            return functools.partial(kernel_forward, unit)
        if x.shape[2:] == (conv.height, conv.width):
            return functools.partial(folded_forward, unit)
    if _local_fusion_applies(unit, x):
        return functools.partial(local_fusion_forward, unit)
    return None


def conv_weights(unit: nn.Module) -> tuple[Tensor, Tensor, Tensor]:
    """DimConv's channel-, height- and width-wise weights."""
    conv = unit.dim_conv
    return conv.weight_channel, conv.weight_height, conv.weight_width


def local_fusion_forward(unit: nn.Module, x: Tensor) -> Tensor:
    """The unit with DimConv and the local fusion as one Triton pass, then the global fusion.

    Shape:
        (B, C, H_b, W_b) -> (B, C_out, H_b, W_b)
    """
    from src.kernels.dim_fuse.triton_kernel import local_fusion_triton

    fuse = unit.dim_fuse
    fused = local_fusion_triton(x, conv_weights(unit), **local_fusion_args(unit))
    if unit.training:  # inference folded the second BN and PReLU in (post)
        fused = fuse.local[2](fuse.local[1](fused))
    return fuse.global_fusion(fused)


def _local_fusion_applies(unit: nn.Module, x: Tensor) -> bool:
    """Whether DimConv and DimFuse's local fusion run as one Triton pass: DimConv's kernel would
    run (CUDA, or ``impl="triton"``), interleaved, at the build size, BN tracking running
    statistics; in training, or in inference without autograd. ``impl="auto"`` takes it where
    :func:`local_fusion_path` chose it (while ``torch.compile`` traces, without timing: the eager
    steps' choice or the default)."""
    conv, fuse = unit.dim_conv, unit.dim_fuse
    norm = fuse.norm
    if not (
        unit.local_fusion
        and use_triton(conv.impl, x)  # first: on the CPU it ends the check
        and conv.interleave
        and x.dtype in (torch.float32, torch.float16, torch.bfloat16)  # the kernel's
        and x.dim() == 4
        and tuple(x.shape[1:]) == (conv.channels, conv.height, conv.width)
        and norm.track_running_stats
        and norm.affine
        and norm.training == fuse.local[1].training == unit.training
        and (unit.training or not torch.is_grad_enabled())
    ):
        return False
    if conv.impl == "triton":
        return True
    return local_fusion_path(unit, x) == "fused"


def local_fusion_args(unit: nn.Module, *, advance: bool = True) -> dict:
    """Keyword arguments of :func:`src.kernels.dim_fuse.local_fusion_reference` for the unit:
    DimConv's dilation and the :class:`~src.kernels.dim_fuse.LocalFusionState`. In training
    ``advance`` counts the batch in BN's ``num_batches_tracked`` and resolves ``momentum=None`` (a
    cumulative average) as ``nn.BatchNorm2d`` does."""
    fuse = unit.dim_fuse
    norm = fuse.norm
    momentum = batch_norm_factor(norm, advance=advance and unit.training)
    post = None
    if not unit.training:
        scale, shift = batch_norm_affine(fuse.local[1])
        post = (scale, shift, fuse.local[2].weight.expand(fuse.channels))
    return {
        "dilation": unit.dim_conv.dilation,
        "running_mean": norm.running_mean,
        "running_var": norm.running_var,
        "weight": norm.weight,
        "bias": norm.bias,
        "alpha": fuse.act.weight,
        "w_local": fuse.local[0].weight,
        "training": unit.training,
        "momentum": momentum,
        "eps": norm.eps,
        "post": post,
    }


LOCAL_FUSION_CHOICE = declare("dice.local_fusion", ("fused", "unfused"))


def local_fusion_path(unit: nn.Module, x: Tensor, timer: Timer | None = None) -> str:
    """``impl="auto"`` on CUDA: "fused" (DimConv and the local fusion in one Triton pass,
    :mod:`src.kernels.dim_fuse.triton_kernel`) or "unfused" (DimConv's own choice, then BN, PReLU
    and the grouped 1x1 conv), whichever was faster on the first call with this input shape (batch
    by :func:`~src.kernels.size_bucket`), dtype and mode (:func:`~src.kernels.choose`).
    Training times forward and backward, on copies of the running statistics and without touching
    the parameters' gradients; inference times the forward.

    Under ``torch.use_deterministic_algorithms(True)`` training takes "unfused" (the fused
    backward adds DimConv's weight gradient with float atomics) and inference "fused".

    Shape:
        x (B, C, H_b, W_b)
    """
    device = x.device.type
    autocast = autocast_dtype(device)
    conv = unit.dim_conv
    key = (
        size_bucket(x.shape[0]), *x.shape[1:], x.dtype, autocast, conv.dilation, unit.training,
        str(x.device),
    )  # fmt: skip

    def run(path: str) -> None:
        from src.kernels.dim_fuse.triton_kernel import local_fusion_triton

        def fused(inputs: Tensor, args: dict) -> Tensor:
            return local_fusion_triton(inputs, conv_weights(unit), **args)

        def unfused(inputs: Tensor, args: dict) -> Tensor:
            return local_fusion(conv(inputs), **{k: v for k, v in args.items() if k != "dilation"})

        forward = fused if path == "fused" else unfused
        timed_pass(unit, x, forward, local_fusion_args(unit, advance=False))

    def candidates() -> dict:
        return {path: functools.partial(run, path) for path in ("fused", "unfused")}

    deterministic = "unfused" if unit.training else "fused"
    return choose(
        LOCAL_FUSION_CHOICE, key, candidates,
        default=deterministic, reference="unfused", timer=timer,
    )  # fmt: skip


def _kernel_applies(unit: nn.Module, x: Tensor) -> bool:
    """Whether the fused C++ kernel covers the unit: float32, depth-wise global fusion."""
    spatial = unit.dim_fuse.spatial[0]
    return (
        unit.cpu_kernel
        and x.dtype == torch.float32
        and spatial.groups == spatial.out_channels == x.shape[1]
    )


def kernel_forward(unit: nn.Module, x: Tensor) -> Tensor:
    """The folded forward as one call of the fused C++ kernel (``dice.cpp``), at any input size:
    off the build size the height- and width-wise branches are resized as in
    :class:`src.ops.dim_conv.DimConv` (the inputs here, the outputs back inside the kernel).

    Shape:
        (B, C, H, W) -> (B, C, H, W)
    """
    conv = unit.dim_conv
    x = x.contiguous()
    height, width = x.shape[2:]
    (to_height, from_height, to_width, from_width, *operands) = _kernel_operands(
        unit, height, width
    )
    # (H_b, H) @ (B, C, H, W) -> (B, C, H_b, W); (B, C, H, W) @ (W, W_b) -> (B, C, H, W_b)
    x_height = x if height == conv.height else torch.matmul(to_height, x)
    x_width = x if width == conv.width else torch.matmul(x, to_width.t())
    return torch.ops.lightnets_cpu.dice_forward(
        x,
        x_height,
        x_width,
        from_height,
        from_width,
        *operands,
        conv.kernel_size,
        *conv.dilation,
    )


def _kernel_operands(unit: nn.Module, height: int, width: int) -> tuple[Tensor, ...]:
    """The resize matrices and folded tensors in the kernel's layout (see ``dice.cpp``) for an
    (H, W) input, cached like :func:`folded` (one entry per input size)."""
    conv = unit.dim_conv

    def build() -> tuple[Tensor, ...]:
        tensors = folded(unit)
        (w_channel, b_channel, a_channel, w_height, w_width) = tensors[:5]
        per_channel = (b_channel, a_channel, *tensors[5:16], *tensors[17:19])
        c, k, h_b, w_b = conv.channels, conv.kernel_size, conv.height, conv.width
        kk, half, (d_c, d_h, _) = k * k, (k - 1) // 2, conv.dilation
        # the padded row lengths of the height- and width-wise branches' grids: at the build
        # size one set of planes padded for all branches, else each branch's own
        if (height, width) == (h_b, w_b):
            pitch_h = pitch_w = width + 2 * half * max(d_c, d_h)
        else:
            pitch_h, pitch_w = width + 2 * half * d_h, w_b
        options = {"dtype": w_channel.dtype, "device": w_channel.device}
        return (
            resize_matrix(height, h_b, **options),  # (H_b, H)
            resize_matrix(h_b, height, **options),  # (H, H_b)
            resize_matrix(width, w_b, **options),  # (W_b, W)
            resize_matrix(w_b, width, **options),  # (W, W_b)
            w_channel.reshape(c, kk).contiguous(),
            # a weight per output position of each branch's grid, (kk, rows, pitch): the
            # height-wise kernel of row r, the width-wise one of column q (0 on pad columns)
            w_height.reshape(h_b, kk).t()[:, :, None].expand(kk, h_b, pitch_h).contiguous(),
            F.pad(w_width.reshape(w_b, kk).t(), (0, pitch_w - w_b))[:, None, :]
            .expand(kk, height, pitch_w)
            .contiguous(),
            torch.stack([t.reshape(c) for t in per_channel]),  # (15, C), rows as in dice.cpp
            tensors[16].reshape(c, 9).contiguous(),
            tensors[19],
            tensors[20],
        )

    return cached(unit, build, name=f"_kernel{height}x{width}")


def folded(unit: nn.Module) -> tuple[Tensor, ...]:
    """The unit's weights with every BN folded, in the order :func:`folded_forward` unpacks them,
    cached on the unit and rebuilt when a parameter or buffer changes."""
    conv, fuse = unit.dim_conv, unit.dim_fuse
    local_conv, local_bn, local_act = fuse.local
    spatial_conv, spatial_bn, spatial_act = fuse.spatial

    def build() -> tuple[Tensor, ...]:
        c = conv.channels
        # DimFuse's BN + PReLU over the interleaved 3C channels, as (C, branch)
        scale, shift = (t.view(c, 3) for t in batch_norm_affine(fuse.norm))
        slope = fuse.act.weight.view(c, 3)
        local_scale, local_shift = batch_norm_affine(local_bn)
        local = local_conv.weight.view(c, 3) * local_scale[:, None]  # (C, branch)
        s_scale, s_shift = batch_norm_affine(spatial_bn)

        def per_channel(t: Tensor) -> Tensor:
            return t.contiguous().view(c, 1, 1)  # (C,) -> (C, 1, 1), broadcast over (H, W)

        return (
            conv.weight_channel * scale[:, 0, None, None, None],
            shift[:, 0].contiguous(),
            slope[:, 0].contiguous(),
            conv.weight_height,
            # kernel axes (height, channel) -> (channel, height): the width-wise conv runs on
            # the (C, H) plane, see folded_forward
            conv.weight_width.transpose(2, 3).contiguous(),
            per_channel(scale[:, 1]),
            per_channel(shift[:, 1]),
            slope[:, 1].contiguous(),
            per_channel(scale[:, 2]),
            per_channel(shift[:, 2]),
            slope[:, 2].contiguous(),
            per_channel(local[:, 0]),
            per_channel(local[:, 1]),
            per_channel(local[:, 2]),
            per_channel(local_shift),
            local_act.weight,
            spatial_conv.weight * s_scale[:, None, None, None],
            s_shift,
            spatial_act.weight,
            # the gate's 1x1 convs as (in, out) matrices: (C, C // 4), (C // 4, C_out)
            fuse.gate[1].weight.flatten(1).t().contiguous(),
            fuse.gate[3].weight.flatten(1).t().contiguous(),
        )

    return cached(unit, build)


def folded_forward(unit: nn.Module, x: Tensor) -> Tensor:
    """The inference forward at the build size, with every BN folded (same map as forward).

    DimConv's interleaved 3C tensor is never built: each branch gets DimFuse's BN (folded into
    the channel-wise kernel, an affine map for the other two) and PReLU, and the local fusion
    (3 -> 1 per channel) is two fused multiply-adds. The width- and height-wise convolutions
    run as depth-wise convolutions on channels-last *views*: a (B, C, H, W) tensor is, read as
    (B, W, C, H), channels-last with W channels over the (C, H) plane (no copy); its
    transpose (B, C, W, H), one copy, is likewise (B, H, C, W) channels-last. oneDNN's
    depth-wise convolution is about twice as fast channels-last, and this avoids the permute
    copies of the reference.

    Shape:
        (B, C, H_b, W_b) -> (B, C_out, H_b, W_b)
    """
    (
        w_channel,
        b_channel,
        a_channel,
        w_height,
        w_width,
        s_height,
        t_height,
        a_height,
        s_width,
        t_width,
        a_width,
        l_channel,
        l_height,
        l_width,
        l_shift,
        a_local,
        w_spatial,
        b_spatial,
        a_spatial,
        w_gate_in,
        w_gate_out,
    ) = folded(unit)
    conv = unit.dim_conv
    height, width = x.shape[2:]
    half = (conv.kernel_size - 1) // 2
    d_c, d_h, d_w = conv.dilation
    y_c = F.conv2d(x, w_channel, b_channel, padding=half * d_c, dilation=d_c, groups=x.shape[1])
    a_c = F.prelu(y_c, a_channel)
    # width-wise: (B, C, H, W) read as (B, W, C, H) -> conv -> back to (B, C, H, W)
    y_w = F.conv2d(
        x.permute(0, 3, 1, 2), w_width, padding=half * d_w, dilation=d_w, groups=width
    ).permute(0, 2, 3, 1)
    # the branch BNs as affine maps written over the fresh conv outputs
    a_w = F.prelu(torch.addcmul(t_width, y_w, s_width, out=y_w), a_width)
    # height-wise: (B, C, W, H) read as (B, H, C, W) -> conv -> back to (B, C, W, H)
    x_t = x.transpose(2, 3).contiguous()  # (B, C, W, H)
    y_h = F.conv2d(
        x_t.permute(0, 3, 1, 2), w_height, padding=half * d_h, dilation=d_h, groups=height
    ).permute(0, 2, 3, 1)
    a_h = F.prelu(torch.addcmul(t_height, y_h, s_height, out=y_h), a_height)  # (B, C, W, H)
    # local fusion with its BN: (B, C, H, W) x 3 -> (B, C, H, W)
    fused = torch.addcmul(l_shift, a_c, l_channel, out=a_c)
    fused = fused.addcmul_(a_w, l_width).addcmul_(a_h.transpose(2, 3), l_height)
    fused = F.prelu(fused, a_local)
    spatial_conv = unit.dim_fuse.spatial[0]
    spatial = F.conv2d(
        fused,
        w_spatial,
        b_spatial,
        spatial_conv.stride,
        spatial_conv.padding,
        spatial_conv.dilation,
        spatial_conv.groups,
    )
    spatial = F.prelu(spatial, a_spatial)
    # channel gate: (B, C) -> (B, C // 4) -> (B, C_out)
    gate = torch.sigmoid(torch.relu_(fused.mean((2, 3)) @ w_gate_in) @ w_gate_out)
    return spatial.mul_(gate[:, :, None, None])
