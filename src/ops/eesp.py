"""ESPNetv2's EESP unit, its depth-wise dilated separable convolution, and the strided down-sampler.

ESPNetv2 (Mehta et al., CVPR 2019, Sec. 3; thesis ch. 2), matching the official EdgeNets ``EESP``
and ``DownSampler``:

- :class:`DepthwiseDilatedSeparableConv` (Sec. 3.1): a depth-wise dilated k x k conv followed by a
  point-wise 1x1 conv. EESP factorises it differently (point-wise first, shared by K depth-wise
  branches), so EESP uses :func:`depthwise_dilated_conv` for its branches.
- :class:`EESP` (Fig. 1c): reduce (grouped 1x1 CBR, K groups, C_in -> n = C_out / K), split and
  transform (K depth-wise dilated 3x3 convs on the n channels, no BN, strided when stride = 2),
  hierarchical feature fusion (cumulative sum in ascending dilation), concatenate, BN + PReLU,
  merge (grouped 1x1 conv, K groups, + BN), then the residual (when shapes agree) and PReLU. The
  strided unit with ``down_method="avg"`` returns after the merge, as inside the down-sampler.
  Dilations: kernel sizes 3 + 2i (i < K), each above ``r_lim`` replaced by 3, sorted;
  d = (k - 1) / 2.
- :class:`EESPDownsampler` (Fig. 2.4 / Fig. 1d): [AvgPool(3, 2, 1)(x), EESP(C_in -> C_out - C_in,
  stride 2)(x)] concatenated, plus the long-range shortcut to the input image: the image
  average-pooled (3, 2, 1) from full size until it has the output's size, a 3x3 CBR and a 1x1 conv +
  BN to C_out, added; then PReLU. The official loop compares heights only (it assumes square
  inputs) and pools at least once; here both height and width are compared, an image already at
  the output size is used as is, and an image that cannot reach the output size raises
  ``ValueError`` (the official loop would not end).

"CBR" is conv (no bias) + BN + PReLU (per channel); AvgPool counts the padding.

In CPU inference (:func:`src.kernels.inference_folding.folded_inference`) with ``impl="auto"``, EESP
folds its BNs into the 1x1 convolutions (run as batched matrix products) and computes the pyramid
(K convolutions, HFF, BN, PReLU) in one call of the fused C++ kernel ``src/kernels/eesp/eesp.cpp``
where it is built (else in eager calls); the same map up to float rounding. On CUDA the pyramid
can run as one Triton pass (:mod:`src.kernels.eesp.triton_kernel`), in training too (``impl``,
:func:`pyramid_path`).
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
    check_impl,
    choose,
    declare,
    size_bucket,
    use_triton,
)
from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import FusingSequential, batch_norm_prelu
from src.kernels.cpu import cpu_kernels_loaded
from src.kernels.depthwise_conv import DepthwiseConv2d
from src.kernels.fused_norm import batch_norm_factor, timed_pass
from src.kernels.inference_folding import (
    ConvBNPReLU,
    batch_norm_affine,
    cached,
    conv_bn,
    folded_inference,
)
from src.kernels.pointwise_conv import PointwiseConv2d
from src.kernels.pooling import AvgPool2d
from src.kernels.prelu import PReLU, prelu


def depthwise_dilated_conv(
    channels: int, *, kernel_size: int = 3, dilation: int = 1, stride: int = 1
) -> nn.Conv2d:
    """A depth-wise k x k conv with "same" padding ``dilation * (k - 1) / 2`` and no bias.

    Shape:
        (B, C, H, W) -> (B, C, ceil(H / stride), ceil(W / stride)) for odd k.
    """
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd, got {kernel_size}")
    padding = dilation * (kernel_size - 1) // 2
    # an nn.Conv2d whose CPU backward of a dilated kernel is a one-pass kernel
    return DepthwiseConv2d(
        channels, kernel_size, stride=stride, padding=padding, dilation=dilation, bias=False
    )


class DepthwiseDilatedSeparableConv(nn.Module):
    """Depth-wise dilated k x k conv, then a (grouped) point-wise 1x1 conv; no norm, no bias.

    Args:
        in_channels: C_in.
        out_channels: C_out.
        kernel_size: k (odd).
        dilation: d of the depth-wise conv.
        stride: of the depth-wise conv.
        groups: of the point-wise conv.

    Shape:
        (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride))
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        kernel_size: int = 3,
        dilation: int = 1,
        stride: int = 1,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.depthwise = depthwise_dilated_conv(
            in_channels, kernel_size=kernel_size, dilation=dilation, stride=stride
        )
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, groups=groups, bias=False)

    def reset_parameters(self) -> None:
        self.depthwise.reset_parameters()
        self.pointwise.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return self.pointwise(self.depthwise(x))


def eesp_dilations(branches: int, r_lim: int) -> tuple[int, ...]:
    """Dilation of each EESP branch: kernel sizes 3 + 2i clipped to 3 above ``r_lim``, sorted."""
    sizes = sorted(k if k <= r_lim else 3 for k in (3 + 2 * i for i in range(branches)))
    return tuple((k - 1) // 2 for k in sizes)


DOWN_METHODS = ("esp", "avg")


class EESP(nn.Module):
    """Extremely efficient spatial pyramid of depth-wise dilated separable convolutions.

    Args:
        in_channels: C_in, divisible by ``branches``.
        out_channels: C_out, divisible by ``branches`` squared.
        stride: 1 or 2 (of the depth-wise branches).
        branches: K, the number of parallel dilated branches and the 1x1 convs' groups.
        r_lim: the receptive-field limit that sets the dilations (:func:`eesp_dilations`).
        down_method: with stride 2, ``"avg"`` returns after the merge (no residual, no PReLU), as
            inside :class:`EESPDownsampler`; ``"esp"`` applies the final PReLU.
        hff: hierarchical feature fusion (thesis Table 2.5); False concatenates the branches as
            they are.
        impl: the pyramid's path: ``"auto"`` (on CUDA, per shape and mode the faster of the fused
            Triton pass, :mod:`src.kernels.eesp.triton_kernel`, and the eager ops,
            :func:`pyramid_path`),
            ``"reference"`` or ``"triton"``.

    Shape:
        (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride))
    """

    #: take the fused C++ kernel for the pyramid in CPU inference (False: eager calls)
    cpu_kernel: bool = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        stride: int = 1,
        branches: int = 4,
        r_lim: int = 7,
        down_method: str = "esp",
        hff: bool = True,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if branches < 1 or in_channels % branches or out_channels % (branches * branches):
            raise ValueError(
                f"in_channels ({in_channels}) must be divisible by branches ({branches}) and "
                f"out_channels ({out_channels}) by branches**2 (the reduced width "
                "out_channels / branches feeds a conv with branches groups)"
            )
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        if down_method not in DOWN_METHODS:
            raise ValueError(f"down_method must be one of {DOWN_METHODS}, got {down_method!r}")
        n = out_channels // branches
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.stride = stride
        self.down_method = down_method
        self.hff = hff
        self.impl = check_impl(impl)
        self.dilations = eesp_dilations(branches, r_lim)
        self.reduce = ConvBNPReLU(in_channels, n, 1, groups=branches)
        self.transform = nn.ModuleList(
            depthwise_dilated_conv(n, dilation=d, stride=stride) for d in self.dilations
        )
        self.fuse_norm = BatchNorm2d(out_channels)
        self.fuse_act = PReLU(out_channels)
        self.merge = nn.Sequential(
            nn.Conv2d(out_channels, out_channels, 1, groups=branches, bias=False),
            BatchNorm2d(out_channels),
        )
        self.act = PReLU(out_channels)

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.BatchNorm2d, nn.PReLU)):
                module.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        reduced = self.reduce(x)  # (B, n, H, W)
        if self.impl == "auto" and folded_inference(self, x):
            pyramid = self._folded_pyramid(reduced)
            merged = conv_bn(self.merge[0], self.merge[1], pyramid)  # a fresh tensor
            if self.stride == 2 and self.down_method == "avg":
                return merged
            if merged.shape == x.shape:
                merged += x
            return F.prelu(merged, self.act.weight)
        pyramid = self._pyramid(reduced)
        if self.stride == 2 and self.down_method == "avg":
            return self.merge(pyramid)
        conv, norm = self.merge
        merged = conv(pyramid)
        # BN, the residual and PReLU as one op where it applies
        residual = x if merged.shape == x.shape else None
        return batch_norm_prelu(merged, norm, self.act, residual=residual)

    def _pyramid(self, reduced: Tensor) -> Tensor:
        """Split, transform, hierarchical fusion, concatenation, BN and PReLU.

        Shape:
            (B, n, H, W) -> (B, K n, H', W')
        """
        if self._fused_applies(reduced):
            from src.kernels.eesp.triton_kernel import eesp_pyramid_triton

            return eesp_pyramid_triton(reduced, self._pyramid_weight(), **self._pyramid_args())
        fused = [self.transform[0](reduced)]
        for conv in self.transform[1:]:
            # hierarchical feature fusion: branch k adds the fused output of branch k - 1
            fused.append(conv(reduced) + fused[-1] if self.hff else conv(reduced))
        # K x (B, n, H', W') -> (B, K n, H', W')
        return batch_norm_prelu(torch.cat(fused, dim=1), self.fuse_norm, self.fuse_act)

    def _pyramid_weight(self) -> Tensor:
        """The K depth-wise kernels stacked (differentiably).

        Shape:
            (K, n, 9)
        """
        return torch.stack([conv.weight.reshape(-1, 9) for conv in self.transform])

    def _pyramid_args(self, *, advance: bool = True) -> dict:
        """Keyword arguments of :func:`eesp_pyramid_reference` for this unit's state; in training
        ``advance`` counts the batch in BN's ``num_batches_tracked``."""
        norm = self.fuse_norm
        return {
            "dilations": self.dilations,
            "stride": self.stride,
            "hff": self.hff,
            "running_mean": norm.running_mean,
            "running_var": norm.running_var,
            "norm_weight": norm.weight,
            "norm_bias": norm.bias,
            "alpha": self.fuse_act.weight.expand(self.out_channels),
            "training": self.training,
            "momentum": batch_norm_factor(norm, advance=advance and self.training),
            "eps": norm.eps,
        }

    def _depthwise_branches(self) -> bool:
        """Whether every branch is the depth-wise 3x3 the fused kernels compute (an ablation may
        replace them by dense convolutions, see ``src.models.espnetv2.EESPAblation``)."""
        n = self.out_channels // len(self.dilations)
        return all(
            conv.kernel_size == (3, 3)
            and conv.groups == conv.in_channels == conv.out_channels == n
            and conv.dilation == conv.padding == (d, d)
            and conv.stride == (self.stride, self.stride)
            for conv, d in zip(self.transform, self.dilations, strict=True)
        )

    def _fused_applies(self, reduced: Tensor) -> bool:
        """Whether the pyramid runs as one Triton pass (:mod:`src.kernels.eesp.triton_kernel`):
        CUDA (or
        ``impl="triton"``), a float dtype, BN tracking running statistics, depth-wise 3x3
        branches; in
        training, or in inference without autograd. ``impl="auto"`` takes it where
        :func:`pyramid_path` chose it (while ``torch.compile`` traces, without timing: the eager
        steps' choice or the default)."""
        norm = self.fuse_norm
        if not (
            use_triton(self.impl, reduced)  # first: on the CPU it ends the check
            and reduced.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and reduced.dim() == 4
            and norm.track_running_stats
            and norm.affine
            and norm.training == self.training
            and (self.training or not torch.is_grad_enabled())
            and self._depthwise_branches()
        ):
            return False
        if self.impl == "triton":
            return True
        return pyramid_path(self, reduced) == "fused"

    def _folded_pyramid(self, reduced: Tensor) -> Tensor:
        """:meth:`_pyramid` in one call of the fused C++ kernel (``src/kernels/eesp/eesp.cpp``)
        where
        it applies (float32, the kernel built, ``cpu_kernel`` set), else in eager calls."""
        if not (
            self.cpu_kernel
            and reduced.dtype == torch.float32
            and self._depthwise_branches()
            and cpu_kernels_loaded()
        ):
            return self._pyramid(reduced)

        def build() -> tuple[Tensor, Tensor]:
            scale, shift = batch_norm_affine(self.fuse_norm)
            weight = torch.stack([conv.weight.reshape(-1, 9) for conv in self.transform])
            return weight, torch.stack((scale, shift, self.fuse_act.weight))  # (K, n, 9), (3, K n)

        weight, affine = cached(
            self, build, (*self.transform, self.fuse_norm, self.fuse_act), name="_pyramid"
        )
        return torch.ops.lightnets_cpu.eesp_pyramid(
            reduced.contiguous(), weight, self.dilations, self.stride, affine, self.hff
        )

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"stride={self.stride}, dilations={self.dilations}, down_method={self.down_method!r}, "
            f"hff={self.hff}, impl={self.impl!r}"
        )


def eesp_pyramid_reference(
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
) -> Tensor:
    """EESP's pyramid as functions of its parameters, in plain PyTorch (the oracle of the fused
    pass, :func:`src.kernels.eesp.triton_kernel.eesp_pyramid_triton`): K depth-wise dilated 3x3
    convolutions, hierarchical fusion, concatenation, ``F.batch_norm`` (``training`` uses and
    ``momentum`` updates the running statistics) and PReLU.

    Shape:
        r (B, n, H, W); weight (K, n, 9); running statistics, norm_weight, norm_bias, alpha (K n,)
        -> (B, K n, ceil(H / stride), ceil(W / stride))
    """
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


PYRAMID_CHOICE = declare("eesp.pyramid", ("fused", "eager"))


def pyramid_path(unit: EESP, reduced: Tensor, timer: Timer | None = None) -> str:
    """``impl="auto"`` on CUDA: "fused" (:mod:`src.kernels.eesp.triton_kernel`) or "eager" (the
    branch
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
        from src.kernels.eesp.triton_kernel import eesp_pyramid_triton

        pyramid = eesp_pyramid_triton if path == "fused" else eesp_pyramid_reference

        def forward(inputs: Tensor, args: dict) -> Tensor:
            return pyramid(inputs, unit._pyramid_weight(), **args)

        timed_pass(unit, reduced, forward, unit._pyramid_args(advance=False))

    def candidates() -> dict:
        return {path: functools.partial(run, path) for path in ("fused", "eager")}

    return choose(PYRAMID_CHOICE, key, candidates, default="eager", reference="eager", timer=timer)


class EESPDownsampler(nn.Module):
    """ESPNetv2's strided EESP block with the average-pool shortcut and the input-image shortcut.

    Args:
        in_channels: C_in.
        out_channels: C_out > C_in; the strided EESP produces C_out - C_in of them.
        branches: K of the EESP.
        r_lim: the EESP's receptive-field limit.
        image_channels: channels of the image given to :meth:`forward` for the long-range
            shortcut; ``None`` builds no shortcut.

    Shape:
        x (B, C_in, H, W), image (B, image_channels, H_img, W_img) or None
        -> (B, C_out, ceil(H / 2), ceil(W / 2))
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        branches: int = 4,
        r_lim: int = 9,
        image_channels: int | None = 3,
    ) -> None:
        super().__init__()
        if out_channels <= in_channels:
            raise ValueError(
                f"out_channels ({out_channels}) must exceed in_channels ({in_channels})"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.pool = AvgPool2d(3, stride=2, padding=1)
        self.eesp = EESP(
            in_channels,
            out_channels - in_channels,
            stride=2,
            branches=branches,
            r_lim=r_lim,
            down_method="avg",
        )
        self.image_shortcut = None
        if image_channels is not None:
            c = image_channels
            self.image_shortcut = FusingSequential(
                nn.Conv2d(c, c, 3, padding=1, bias=False),
                BatchNorm2d(c),
                PReLU(c),
                PointwiseConv2d(c, out_channels, bias=False),
                BatchNorm2d(out_channels),
            )
        self.act = PReLU(out_channels)

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.BatchNorm2d, nn.PReLU)):
                module.reset_parameters()

    def forward(self, x: Tensor, image: Tensor | None = None) -> Tensor:
        pooled = self.pool(x)  # (B, C_in, H/2, W/2)
        out = torch.cat((pooled, self.eesp(x)), dim=1)  # (B, C_out, H/2, W/2)
        if image is not None:
            if self.image_shortcut is None:
                raise ValueError(
                    "an image was given, but the block was built with image_channels=None"
                )
            out = out + self.image_shortcut(pool_to(image, out.shape[-2:]))
        return self.act(out)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, out_channels={self.out_channels}"


def halve(image: Tensor) -> Tensor:
    """One step of :func:`pool_to`: average pool (3, 2, 1).

    Shape:
        (B, C, H, W) -> (B, C, ceil(H / 2), ceil(W / 2))
    """
    return F.avg_pool2d(image, 3, stride=2, padding=1)


def image_pyramid(image: Tensor, steps: int) -> list[Tensor]:
    """``image`` halved (:func:`halve`) 1, 2, ..., ``steps`` times, each from the one before: the
    images that :func:`pool_to` gives for those sizes, at one pool per level.

    Shape:
        (B, C, H, W) -> [(B, C, ceil(H / 2^s), ceil(W / 2^s)) for s = 1..steps]
    """
    levels = []
    for _ in range(steps):
        image = halve(image)
        levels.append(image)
    return levels


def pool_to(image: Tensor, size: tuple[int, int] | torch.Size) -> Tensor:
    """Average-pool (3, 2, 1) ``image`` repeatedly until its (H, W) equals ``size``.

    Shape:
        (B, C, H_img, W_img) -> (B, C, *size)
    """
    target = tuple(size)
    start = tuple(image.shape[-2:])
    while tuple(image.shape[-2:]) != target:
        height, width = image.shape[-2:]
        if height < target[0] or width < target[1]:
            raise ValueError(f"cannot average-pool an image of {start} by halving to {target}")
        image = halve(image)
    return image
