"""The DiCE unit (DimConv + DimFuse), its strided form, and the ShuffleNet-style DiCENet unit.

DiCENet (thesis ch. 3, Sec. 3.3 and Fig. 3.5). Matches the official EdgeNets ``DICE``,
``StridedDICE`` and ``ShuffleDICEBlock``:

- :class:`DiCE`: DimConv (three dimension-wise depth-wise convolutions, interleaved) followed by
  DimFuse. The official code concatenates the branches, applies BN + PReLU and then shuffles with 3
  groups; interleaving first and normalising after is the same map with permuted BN/PReLU
  parameters. With ``shuffle=False`` (not used by the released models) the official code skips the
  shuffle, so the grouped 1x1 conv fuses consecutive channels of the concatenation; that is
  DimConv with ``interleave=False``.
- :class:`StridedDiCE`: left = depth-wise 3x3 stride-2 CBR then 1x1 CBR; right = AvgPool(3, 2, 1)
  (padding counted), DiCE, 1x1 CBR; concatenate [left, right] and shuffle with 2 groups: C -> 2C
  at half resolution (thesis Sec. 3.3.2).
- :class:`DiCEShuffleUnit`: the ShuffleNetv2 unit with DiCE in place of its depth-wise conv. The
  first round(split_ratio * C_in) channels pass through; the rest go through a 1x1 CBR and DiCE;
  concatenate and shuffle. The first unit of a stage widens C_in -> C_out, so the right branch
  outputs C_out - round(split_ratio * C_in) channels. As in the official code there is no 1x1 CBR
  after the DiCE (ShuffleNetv2 has one after its depth-wise conv).

The ablations of thesis Tables 3.2 and 3.3 are built by name, by both units and by
:func:`dice_block` / :func:`reduce_block`: ``spatial`` ("dimconv" | "dwise"), ``fusion``
("dimfuse" | "pointwise" | "se" | "pointwise_se") and ``reduce`` ("pointwise" | "dimfuse", the
DiCENet unit's 1x1 conv before the DiCE). The defaults are the DiCE unit of every released model;
the others are a :class:`SpatialFusionBlock` in place of the :class:`DiCE` and a
:class:`~src.ops.dim_fuse.GlobalFusion` in place of the 1x1 CBR.

"CBR" is conv (no bias) + BN + PReLU (per channel).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels import Timer, autocast_dtype, choose, declare, size_bucket, use_triton
from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import FusingSequential
from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.fused_norm import batch_norm_factor, timed_pass
from src.kernels.inference_folding import (
    ConvBNPReLU,
    batch_norm_affine,
    cached,
    conv_bn_prelu,
    folded_inference,
)
from src.kernels.pointwise_conv import PointwiseConv2d
from src.kernels.pooling import AvgPool2d
from src.kernels.prelu import PReLU
from src.ops.dim_conv import DimConv, resize_matrix
from src.ops.dim_fuse import DimFuse, GlobalFusion, ablation_gate, local_fusion
from src.ops.shuffle import concat_shuffle

SPATIAL_OPS = ("dimconv", "dwise")
FUSION_OPS = ("dimfuse", "pointwise", "se", "pointwise_se")
REDUCE_OPS = ("pointwise", "dimfuse")


def _reset_children(module: nn.Module) -> None:
    """PyTorch's default initialisation for every conv, BN, PReLU and DimConv below ``module``."""
    for child in module.modules():
        if child is not module and isinstance(
            child, (nn.Conv2d, nn.BatchNorm2d, nn.PReLU, DimConv)
        ):
            child.reset_parameters()


class DiCE(nn.Module):
    """Dimension-wise convolution and fusion: DimConv (C -> 3C) then DimFuse (3C -> C_out).

    Args:
        in_channels: C.
        out_channels: C_out.
        height: H_b, the height the height-wise kernels are built for.
        width: W_b, the width the width-wise kernels are built for.
        kernel_size: k of the three dimension-wise convolutions.
        dilation: (d_channel, d_height, d_width).
        shuffle: interleave the dimension-wise responses per channel before the local fusion (the
            thesis's DiCE and every released model); False fuses consecutive concatenated channels.
        impl: DimConv's ``"auto" | "reference" | "triton"``.

    With ``impl="auto"``, in CPU inference (:func:`src.kernels.inference_folding.folded_inference`)
    the forward is the same map with every BN folded: one call of the fused C++ kernel
    (:meth:`_kernel_forward`, ``src/kernels/dice/dice.cpp``, any input size) where it applies
    (float32, C_out = C, the kernel built; ``cpu_kernel = False`` opts a unit out), else at the
    build size :meth:`_folded_forward`'s eager calls.

    Where DimConv's Triton kernel runs (CUDA, or ``impl="triton"``) at the build size, DimConv and
    the first half of DimFuse (BN, PReLU, grouped 1x1 conv: the local fusion) can run as one pass
    that never writes DimConv's 3C channels (:mod:`src.kernels.dim_fuse.triton_kernel`): in
    training with
    BN's batch statistics (the backward recomputes them), in inference with the second BN and
    PReLU folded in too. ``impl="triton"`` always takes it, ``"auto"`` where
    :func:`local_fusion_path` measured it faster; ``local_fusion = False`` opts a unit out.

    Shape:
        (B, C, H, W) -> (B, C_out, H, W), any H and W (see :class:`DimConv`).
    """

    #: take the fused C++ kernel in CPU inference where it applies (False: eager folded calls)
    cpu_kernel: bool = True
    #: run DimConv and DimFuse's local fusion as one Triton pass where it applies (False: never)
    local_fusion: bool = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        height: int,
        width: int,
        *,
        kernel_size: int = 3,
        dilation: tuple[int, int, int] = (1, 1, 1),
        shuffle: bool = True,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        self.dim_conv = DimConv(
            in_channels,
            height,
            width,
            kernel_size=kernel_size,
            dilation=dilation,
            interleave=shuffle,
            impl=impl,
        )
        self.dim_fuse = DimFuse(in_channels, out_channels)

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        conv = self.dim_conv
        if (
            folded_inference(self, x)
            and conv.impl == "auto"
            and conv.interleave
            and x.dim() == 4
            and x.shape[1] == conv.channels
        ):
            if self._kernel_applies(x) and cpu_kernels_loaded():
                return self._kernel_forward(x)
            if x.shape[2:] == (conv.height, conv.width):
                return self._folded_forward(x)
        if self._local_fusion_applies(x):
            from src.kernels.dim_fuse.triton_kernel import local_fusion_triton

            fused = local_fusion_triton(x, *self._conv_weights(), **self._local_fusion_args())
            if self.training:  # inference folded the second BN and PReLU in (post)
                fused = self.dim_fuse.local[2](self.dim_fuse.local[1](fused))
            return self.dim_fuse.global_fusion(fused)
        return self.dim_fuse(self.dim_conv(x))

    def _conv_weights(self) -> tuple[Tensor, Tensor, Tensor]:
        conv = self.dim_conv
        return conv.weight_channel, conv.weight_height, conv.weight_width

    def _local_fusion_applies(self, x: Tensor) -> bool:
        """Whether DimConv and DimFuse's local fusion run as one Triton pass
        (:mod:`src.kernels.dim_fuse.triton_kernel`): DimConv's kernel would run (CUDA, or
        ``impl="triton"``), interleaved, at the build size, BN tracking running statistics; in
        training, or in inference without autograd. ``impl="auto"`` takes it where
        :func:`local_fusion_path` chose it (while ``torch.compile`` traces, without timing: the
        eager steps' choice or the default)."""
        conv, fuse = self.dim_conv, self.dim_fuse
        norm = fuse.norm
        if not (
            self.local_fusion
            and use_triton(conv.impl, x)  # first: on the CPU it ends the check
            and conv.interleave
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16)  # the kernel's
            and x.dim() == 4
            and tuple(x.shape[1:]) == (conv.channels, conv.height, conv.width)
            and norm.track_running_stats
            and norm.affine
            and norm.training == fuse.local[1].training == self.training
            and (self.training or not torch.is_grad_enabled())
        ):
            return False
        if conv.impl == "triton":
            return True
        return local_fusion_path(self, x) == "fused"

    def _local_fusion_args(self, *, advance: bool = True) -> dict:
        """Keyword arguments of :func:`src.ops.dim_fuse.local_fusion_reference` for this unit's
        state. In training ``advance`` counts the batch in BN's ``num_batches_tracked`` and resolves
        ``momentum=None`` (a cumulative average) as ``nn.BatchNorm2d`` does."""
        fuse = self.dim_fuse
        norm = fuse.norm
        momentum = batch_norm_factor(norm, advance=advance and self.training)
        args = {
            "dilation": self.dim_conv.dilation,
            "running_mean": norm.running_mean,
            "running_var": norm.running_var,
            "weight": norm.weight,
            "bias": norm.bias,
            "alpha": fuse.act.weight,
            "w_local": fuse.local[0].weight,
            "training": self.training,
            "momentum": momentum,
            "eps": norm.eps,
        }
        if not self.training:
            scale, shift = batch_norm_affine(fuse.local[1])
            args["post"] = (scale, shift, fuse.local[2].weight.expand(fuse.channels))
        return args

    def _kernel_applies(self, x: Tensor) -> bool:
        """Whether the fused C++ kernel covers this unit: float32, depth-wise global fusion."""
        spatial = self.dim_fuse.spatial[0]
        return (
            self.cpu_kernel
            and x.dtype == torch.float32
            and spatial.groups == spatial.out_channels == x.shape[1]
        )

    def _kernel_forward(self, x: Tensor) -> Tensor:
        """The folded forward as one call of the fused C++ kernel (``src/kernels/dice/dice.cpp``),
        at
        any input size: off the build size the height- and width-wise branches are resized as in
        :class:`DimConv` (the inputs here, the outputs back inside the kernel).

        Shape:
            (B, C, H, W) -> (B, C, H, W)
        """
        conv = self.dim_conv
        x = x.contiguous()
        height, width = x.shape[2:]
        (to_height, from_height, to_width, from_width, *operands) = self._kernel_operands(
            height, width
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

    def _kernel_operands(self, height: int, width: int) -> tuple[Tensor, ...]:
        """The resize matrices and folded tensors in the kernel's layout (see ``dice.cpp``) for an
        (H, W) input, cached like :meth:`_folded` (one entry per input size)."""
        conv = self.dim_conv

        def build() -> tuple[Tensor, ...]:
            folded = self._folded()
            (w_channel, b_channel, a_channel, w_height, w_width) = folded[:5]
            per_channel = (b_channel, a_channel, *folded[5:16], *folded[17:19])
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
                folded[16].reshape(c, 9).contiguous(),
                folded[19],
                folded[20],
            )

        return cached(self, build, name=f"_kernel{height}x{width}")

    def _folded(self) -> tuple[Tensor, ...]:
        conv, fuse = self.dim_conv, self.dim_fuse
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
                # the (C, H) plane, see _folded_forward
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

        return cached(self, build)

    def _folded_forward(self, x: Tensor) -> Tensor:
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
        ) = self._folded()
        conv = self.dim_conv
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
        spatial_conv = self.dim_fuse.spatial[0]
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


LOCAL_FUSION_CHOICE = declare("dice.local_fusion", ("fused", "unfused"))


def local_fusion_path(unit: DiCE, x: Tensor, timer: Timer | None = None) -> str:
    """``impl="auto"`` on CUDA: "fused" (DimConv and the local fusion in one Triton pass,
    :mod:`src.kernels.dim_fuse.triton_kernel`) or "unfused" (DimConv's own choice, then BN, PReLU
    and the
    grouped 1x1 conv), whichever was faster on the first call with this input shape (batch by
    :func:`~src.kernels.size_bucket`), dtype and mode (:func:`~src.kernels.choose`).
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
            return local_fusion_triton(inputs, *unit._conv_weights(), **args)

        def unfused(inputs: Tensor, args: dict) -> Tensor:
            return local_fusion(conv(inputs), **{k: v for k, v in args.items() if k != "dilation"})

        forward = fused if path == "fused" else unfused
        timed_pass(unit, x, forward, unit._local_fusion_args(advance=False))

    def candidates() -> dict:
        return {path: functools.partial(run, path) for path in ("fused", "unfused")}

    deterministic = "unfused" if unit.training else "fused"
    return choose(
        LOCAL_FUSION_CHOICE, key, candidates,
        default=deterministic, reference="unfused", timer=timer,
    )  # fmt: skip


class SpatialFusionBlock(nn.Module):
    """An ablation of the DiCE unit: a spatial op (DimConv or depth-wise 3x3) and a fusion op.

    The spatial output is normalised (BN + PReLU). DimConv's 3C channels are first reduced to C
    by DimFuse's local fusion (grouped 1x1 CBR, C groups) for the "se" and "dimfuse" fusions;
    "pointwise" and "pointwise_se" fuse all 3C channels with a 1x1 CBR. This reading of Table 3.2
    is ours (the thesis gives no code for the ablations).

    Args:
        channels: C.
        out_channels: C_out (must equal C for ``fusion="se"``, which keeps the width).
        height, width: DimConv's build size.
        spatial: "dimconv" or "dwise".
        fusion: "dimfuse", "pointwise", "se" or "pointwise_se".
        impl: DimConv's implementation.

    Shape:
        (B, C, H, W) -> (B, C_out, H, W)
    """

    def __init__(
        self,
        channels: int,
        out_channels: int,
        height: int,
        width: int,
        *,
        spatial: str,
        fusion: str,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        check_unit_options(spatial=spatial, fusion=fusion)
        if fusion == "se" and channels != out_channels:
            raise ValueError(f"fusion='se' keeps the width; got {channels} -> {out_channels}")
        self.spatial_op, self.fusion_op = spatial, fusion
        if spatial == "dimconv":
            expanded = 3 * channels
            self.spatial = DimConv(channels, height, width, impl=impl)
        else:
            expanded = channels
            self.spatial = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.norm = FusingSequential(BatchNorm2d(expanded), PReLU(expanded))
        pointwise = fusion in ("pointwise", "pointwise_se")
        # DimFuse's local fusion: each channel's (D, H, W) triple -> one channel
        self.local = (
            ConvBNPReLU(expanded, channels, 1, groups=channels)
            if spatial == "dimconv" and not pointwise
            else nn.Identity()
        )
        if pointwise:
            self.fuse: nn.Module = ConvBNPReLU(expanded, out_channels, 1)
        elif fusion == "dimfuse":
            self.fuse = GlobalFusion(channels, out_channels)
        else:
            self.fuse = nn.Identity()
        self.gate = (
            ablation_gate(out_channels, out_channels) if fusion in ("se", "pointwise_se") else None
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.fuse(self.local(self.norm(self.spatial(x))))
        return out if self.gate is None else out * self.gate(out)

    def extra_repr(self) -> str:
        return f"spatial={self.spatial_op!r}, fusion={self.fusion_op!r}"


def check_unit_options(
    *, spatial: str = "dimconv", fusion: str = "dimfuse", reduce: str = "pointwise"
) -> None:
    """ValueError naming the valid choices of each DiCE-unit ablation option."""
    for name, value, valid in (
        ("spatial", spatial, SPATIAL_OPS),
        ("fusion", fusion, FUSION_OPS),
        ("reduce", reduce, REDUCE_OPS),
    ):
        if value not in valid:
            raise ValueError(f"{name} must be one of {valid}, got {value!r}")


def dice_block(
    channels: int,
    out_channels: int,
    height: int,
    width: int,
    *,
    spatial: str = "dimconv",
    fusion: str = "dimfuse",
    kernel_size: int = 3,
    dilation: tuple[int, int, int] = (1, 1, 1),
    shuffle: bool = True,
    impl: str = "auto",
) -> nn.Module:
    """The DiCE unit (DimConv + DimFuse) or one of its Table 3.2 ablations, by name.

    ``kernel_size``, ``dilation`` and ``shuffle`` are the :class:`DiCE`'s; the ablations are built
    with their defaults only.

    Shape:
        (B, C, H, W) -> (B, C_out, H, W)
    """
    check_unit_options(spatial=spatial, fusion=fusion)
    if (spatial, fusion) == ("dimconv", "dimfuse"):
        return DiCE(
            channels,
            out_channels,
            height,
            width,
            kernel_size=kernel_size,
            dilation=dilation,
            shuffle=shuffle,
            impl=impl,
        )
    if (kernel_size, tuple(dilation), shuffle) != (3, (1, 1, 1), True):
        raise ValueError(
            f"the ablation spatial={spatial!r}, fusion={fusion!r} has 3x3 kernels, no dilation and "
            f"shuffle; got kernel_size={kernel_size}, dilation={dilation}, shuffle={shuffle}"
        )
    return SpatialFusionBlock(
        channels, out_channels, height, width, spatial=spatial, fusion=fusion, impl=impl
    )


def reduce_block(c_in: int, c_out: int, *, reduce: str = "pointwise") -> nn.Module:
    """The point-wise layer before the spatial op: 1x1 CBR, or DimFuse's global fusion (Table 3.3).

    Shape:
        (B, C_in, H, W) -> (B, C_out, H, W)
    """
    check_unit_options(reduce=reduce)
    return ConvBNPReLU(c_in, c_out, 1) if reduce == "pointwise" else GlobalFusion(c_in, c_out)


class StridedDiCE(nn.Module):
    """The strided DiCE unit: two half-resolution branches, concatenated and shuffled.

    Args:
        in_channels: C (the output has 2C).
        height: H_b of the inner DiCE (the output height, e.g. 28 for a 56 x 56 input).
        width: W_b of the inner DiCE.
        kernel_size, dilation, shuffle, impl: of the inner :class:`DiCE`.
        spatial, fusion: the inner DiCE's ablation (:func:`dice_block`); the defaults are the DiCE.

    Shape:
        (B, C, H, W) -> (B, 2C, ceil(H / 2), ceil(W / 2))
    """

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        *,
        kernel_size: int = 3,
        dilation: tuple[int, int, int] = (1, 1, 1),
        shuffle: bool = True,
        spatial: str = "dimconv",
        fusion: str = "dimfuse",
        impl: str = "auto",
    ) -> None:
        super().__init__()
        c = in_channels
        self.in_channels = in_channels
        self.left = nn.Sequential(
            nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c, bias=False),
            BatchNorm2d(c),
            PReLU(c),
            PointwiseConv2d(c, c, bias=False),
            BatchNorm2d(c),
            PReLU(c),
        )
        self.pool = AvgPool2d(3, stride=2, padding=1)
        self.dice = dice_block(
            c,
            c,
            height,
            width,
            spatial=spatial,
            fusion=fusion,
            kernel_size=kernel_size,
            dilation=dilation,
            shuffle=shuffle,
            impl=impl,
        )
        self.right = ConvBNPReLU(c, c, 1)

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        right = self.right(self.dice(self.pool(x)))
        # the two CBRs of the left branch, folded in inference
        # (indexing, not slicing: a Sequential slice builds a new module on every call)
        conv1, bn1, act1, conv2, bn2, act2 = self.left
        left = conv_bn_prelu(conv2, bn2, act2, conv_bn_prelu(conv1, bn1, act1, x))
        # [(B, C, H/2, W/2), (B, C, H/2, W/2)] -> (B, 2C, H/2, W/2), shuffled
        return concat_shuffle((left, right), 2)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}"


class DiCEShuffleUnit(nn.Module):
    """The DiCENet unit: channel split, (1x1 CBR -> DiCE) on one part, concatenation, shuffle.

    Args:
        in_channels: C_in.
        out_channels: C_out (>= C_in; the first unit of a stage widens).
        height: H_b of the DiCE.
        width: W_b of the DiCE.
        split_ratio: the fraction of C_in passed through unchanged (rounded to a channel count).
        groups: the channel-shuffle groups after the concatenation.
        spatial, fusion: the DiCE's ablation (:func:`dice_block`).
        reduce: the 1x1 CBR before the DiCE, or its ablation (:func:`reduce_block`).
        impl: the DiCE's DimConv implementation.

    Shape:
        (B, C_in, H, W) -> (B, C_out, H, W)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        height: int,
        width: int,
        *,
        split_ratio: float = 0.5,
        groups: int = 2,
        spatial: str = "dimconv",
        fusion: str = "dimfuse",
        reduce: str = "pointwise",
        impl: str = "auto",
    ) -> None:
        super().__init__()
        passed = round(split_ratio * in_channels)
        right_in, right_out = in_channels - passed, out_channels - passed
        if not 0 < passed < in_channels or right_out < 1 or out_channels % groups:
            raise ValueError(
                f"split_ratio={split_ratio} of in_channels={in_channels} passes {passed} channels; "
                f"need 0 < passed < in_channels, out_channels ({out_channels}) > passed and "
                f"out_channels divisible by groups ({groups})"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.passed = passed
        self.groups = groups
        self.reduce = reduce_block(right_in, right_out, reduce=reduce)
        self.dice = dice_block(
            right_out, right_out, height, width, spatial=spatial, fusion=fusion, impl=impl
        )

    def reset_parameters(self) -> None:
        _reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        # (B, C_in, H, W) -> (B, passed, H, W) and (B, C_in - passed, H, W)
        left, right = x.split((self.passed, self.in_channels - self.passed), dim=1)
        # [(B, passed, H, W), (B, C_out - passed, H, W)] -> (B, C_out, H, W), shuffled
        return concat_shuffle((left, self.dice(self.reduce(right))), self.groups)

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"passed={self.passed}, groups={self.groups}"
        )
