"""DimConv as a function of its three weights: its PyTorch reference, its paths and their choice.

:class:`src.ops.dim_conv.DimConv` is the layer (thesis ch. 3, Sec. 3.3.1); :func:`dim_conv` is the
op it runs, on one of three paths:

- :func:`dim_conv_reference`: three depth-wise convolutions in PyTorch, at any input size (off the
  build size the height- and width-wise branches are resized, :func:`resize_axis`); the test
  oracle, and the path under export (at the build size of a graph of static size as
  :func:`dim_conv_exported`, the same map without resize products, for runtimes);
- the fused Triton kernel (:mod:`.triton_kernel`) at the build size, on CUDA or with
  ``impl="triton"``;
- the C++ kernels (``dim_conv.cpp``, :func:`dim_conv_cpu`) with ``impl="auto"`` at the build size
  on a channels-last CPU tensor;

``impl="auto"`` takes the kernel where :func:`auto_path` measured it faster.

The C++ kernels, for training and inference without folding. The eager path runs three depth-wise
oneDNN convolutions, two of them on transposed copies of the input (height or width as the channel
axis), and stacks the three branches; its backward makes as many passes again. On 2 cores this
was a fifth of a DiCENet s=1.0 training step. ``lightnets_cpu::dim_conv_forward`` and
``dim_conv_backward`` compute all three branches in one pass over the rows of channels each way,
reading every tap along the contiguous channels, and write the interleaved (or concatenated)
output directly. The weight gradients are summed in float32 per fixed block of rows and the blocks
in order, so they do not depend on the thread count. They take float32, bfloat16 or float16 (after
autocast's casts); everything else takes the eager path, as does a ``TorchDispatchMode``
(``FlopCounterMode`` then counts the three convolutions; fake tensors). ``torch.compile`` sees both
directions as opaque ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from src.kernels import (
    ATEN,
    OURS,
    Timer,
    autocast_dtype,
    autocast_off,
    autocast_operands,
    candidate_steps,
    choose,
    declare,
    exporting,
    needs_backward,
    opaque_op,
    size_bucket,
    static_size,
    use_triton,
)
from src.kernels.cpu import cpu_kernels_loaded, dispatch_mode_active
from src.kernels.dim_conv import contract as contract
from src.kernels.dim_conv.contract import Weights
from src.kernels.layout import is_channels_last
from src.kernels.pooling import adaptive_pool_matrix

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def dim_conv(
    x: Tensor,
    weights: Weights,
    *,
    dilation: tuple[int, int, int] = (1, 1, 1),
    interleave: bool = True,
    impl: str = "auto",
) -> Tensor:
    """DimConv of :class:`src.ops.dim_conv.DimConv` as a function of its weights, on the path
    ``impl`` names: ``"auto"`` (on CUDA at the build size the faster of the Triton kernel and the
    reference, on a channels-last CPU tensor at the build size the faster of the C++ kernels and
    the reference, :func:`auto_path`), ``"reference"`` or ``"triton"``. Off the build size the
    reference runs, whatever ``impl`` says.

    Shape:
        x (B, C, H, W), weights as :data:`~src.kernels.dim_conv.contract.Weights`
        -> (B, 3C, H, W)
    """
    weight_channel, weight_height, weight_width = weights
    if x.dim() != 4 or x.shape[1] != weight_channel.shape[0]:
        raise ValueError(f"expected (B, {weight_channel.shape[0]}, H, W), got {tuple(x.shape)}")
    path = "reference"
    if use_triton(impl, x) and x.shape[-2:] == (weight_height.shape[0], weight_width.shape[0]):
        path = "triton" if impl == "triton" else auto_path(x, weights, dilation, interleave)
    if path == "reference" and impl == "auto" and _cpu_applies(x, weights):
        path = auto_path(x, weights, dilation, interleave, device="cpu")
    return _run(path, x, weights, dilation, interleave)


def _run(
    path: str,
    x: Tensor,
    weights: Weights,
    dilation: tuple[int, int, int],
    interleave: bool,
) -> Tensor:
    """DimConv on ``path``: "triton", OURS (the C++ kernels, or the reference for dtypes they do
    not take), or the reference ("reference", ATEN)."""
    if path == "triton":
        from src.kernels.dim_conv.triton_kernel import dim_conv_triton

        return dim_conv_triton(x, weights, dilation=dilation, interleave=interleave)
    y = dim_conv_cpu(x, weights, dilation=dilation, interleave=interleave) if path == OURS else None
    if y is None:
        y = dim_conv_reference(x, weights, dilation=dilation, interleave=interleave)
    return y


# the paths timed against each other: on CUDA the Triton kernel and cuDNN's depth-wise
# convolutions; on the CPU the C++ kernels (OURS) and the eager path's oneDNN convolutions (ATEN)
PATHS = {"cuda": ("triton", "reference"), "cpu": (OURS, ATEN)}
CHOICE = declare("dim_conv", PATHS["cuda"])
CPU_CHOICE = declare("dim_conv", PATHS["cpu"], device="cpu")


def auto_path(
    x: Tensor,
    weights: Weights,
    dilation: tuple[int, int, int],
    interleave: bool,
    timer: Timer | None = None,
    *,
    device: str = "cuda",
) -> str:
    """``impl="auto"``: the path of :data:`PATHS` ``[device]`` whose call (a training step when
    autograd wants the backward) ran faster on the first call with this input shape (batch by
    :func:`~src.kernels.size_bucket`), dtype and mode (:func:`~src.kernels.choose`); while
    ``torch.compile`` traces, that choice untimed (the eager steps' or the default), the kernel a
    custom op of the graph.

    - ``"cuda"``, at the build size where the Triton kernel runs: "triton" or "reference".
      Deterministic mode takes "reference": the kernel's weight gradients add float atomics in a
      run-dependent order; cuDNN's do not.
    - ``"cpu"``, where the C++ kernels apply: OURS or ATEN, measured per shape on this machine.
      The kernels read every tap along the contiguous channels, which pays at 116-464 channels
      (1.6-2.9x) and not at DiCENet's 24-channel stem (0.69-0.82x on an AMD EPYC, AVX2 and AVX-512
      alike).

    Shape:
        x (B, C, H, W) (channels-last on the CPU), weights as :func:`dim_conv`'s
    """
    key = (
        size_bucket(x.shape[0]), *x.shape[1:], x.dtype, autocast_dtype(x.device.type), dilation,
        interleave, *((str(x.device),) if device == "cuda" else ()), needs_backward(x, *weights),
    )  # fmt: skip

    def run(path: str, x: Tensor, *weights: Tensor) -> Tensor:
        return _run(path, x, tuple(weights), dilation, interleave)

    def candidates() -> dict:
        return candidate_steps(run, PATHS[device], x, *weights)

    if device == "cpu":
        return choose(
            CPU_CHOICE, key, candidates, default=OURS, reference=ATEN, device="cpu", timer=timer
        )
    return choose(CHOICE, key, candidates, default="reference", timer=timer)


def resize_matrix(n_in: int, n_out: int, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The linear map resizing an axis of length ``n_in`` to ``n_out`` as DiCE does.

    Growing: linear interpolation with ``align_corners=True`` (``F.interpolate(mode="bilinear")``
    along one axis). Shrinking: adaptive average pooling, output i averaging inputs
    ``[floor(i n_in / n_out), ceil((i + 1) n_in / n_out))``. Equal sizes give the identity.

    Shape:
        (n_out, n_in)
    """
    if n_out <= n_in:
        return adaptive_pool_matrix(n_in, n_out, dtype=dtype, device=device)
    out_idx = torch.arange(n_out, device=device, dtype=torch.float64)
    in_idx = torch.arange(n_in, device=device, dtype=torch.float64)
    pos = out_idx * ((n_in - 1) / (n_out - 1))  # n_out >= 2 here
    low = pos.floor().clamp(max=n_in - 1)
    high = (low + 1).clamp(max=n_in - 1)
    frac = (pos - low)[:, None]
    matrix = (1 - frac) * (in_idx == low[:, None]) + frac * (in_idx == high[:, None])
    return matrix.to(dtype)


def resize_matrix_traced(
    n_in: int, n_out: int, *, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """:func:`resize_matrix` without a Python branch on the sizes, for exported graphs whose image
    size is dynamic: both maps are built from the index ranges and the graph picks one by
    comparing the sizes (equal sizes give the identity, as the pooling map does then).

    Shape:
        (n_out, n_in)
    """
    out_idx = torch.arange(n_out, device=device, dtype=torch.float64)
    in_idx = torch.arange(n_in, device=device, dtype=torch.float64)
    size_in, size_out = in_idx[-1:] + 1, out_idx[-1:] + 1  # (1,) each: the sizes as tensors
    pos = out_idx * ((size_in - 1) / (size_out - 1).clamp(min=1))
    low = torch.minimum(pos.floor(), size_in - 1)
    high = torch.minimum(low + 1, size_in - 1)
    frac = (pos - low)[:, None]
    grow = (1 - frac) * (in_idx == low[:, None]) + frac * (in_idx == high[:, None])
    start = torch.floor(out_idx * size_in / size_out)
    end = -torch.floor(-(out_idx + 1) * size_in / size_out)  # ceil
    inside = (in_idx >= start[:, None]) & (in_idx < end[:, None])
    shrink = inside / (end - start)[:, None]
    return torch.where(size_out > size_in, grow, shrink).to(dtype)


def resize_axis(x: Tensor, dim: int, size: int) -> Tensor:
    """Resize axis ``dim`` (1 or -1) of ``x`` to ``size`` with :func:`resize_matrix`.

    Shape:
        (B, N, A, M) -> (B, size, A, M) for dim=1, (B, N, A, size) for dim=-1.
    """
    n = x.shape[dim]
    if exporting():  # the size is the graph's: both resizes, chosen in the graph
        matrix = resize_matrix_traced(n, size, dtype=x.dtype, device=x.device)
    elif n == size:
        return x
    else:
        matrix = resize_matrix(n, size, dtype=x.dtype, device=x.device)
    if exporting():
        # the same products as a 1x1 convolution over axis 1 and a linear map of the last axis:
        # the matmuls below broadcast the matrix over the batch (``expand_copy``), which
        # ExecuTorch's XNNPACK partitioner leaves outside its delegates
        if dim == 1:
            return F.conv2d(x, matrix[:, :, None, None])
        return F.linear(x, matrix)
    if dim == 1:
        # (size, N) @ (B, N, A * M) -> (B, size, A * M) -> (B, size, A, M)
        return (matrix @ x.flatten(2)).unflatten(2, x.shape[2:])
    return x @ matrix.T  # (B, N, A, M) @ (M, size) -> (B, N, A, size)


def dim_conv_reference(
    x: Tensor,
    weights: Weights,
    *,
    dilation: tuple[int, int, int] = (1, 1, 1),
    interleave: bool = True,
) -> Tensor:
    """DimConv in plain PyTorch (the test oracle of the Triton and C++ kernels).

    The height- and width-wise convolutions share one transposed copy of the input, in memory order
    (b, h, c, w): read as (B, H, C, W) it is the height-wise conv's contiguous input, read as
    (B, W, H, C) it is the width-wise conv's input in channels-last layout. That saves a copy per
    call over transposing for each branch.

    Under ``torch.autocast`` the operands are cast to its dtype up front, so that the transposed
    copy and the resize matrices are in that dtype too; the result is what autocast gives the
    convolutions and products one by one, and the output is in that dtype.

    Shape:
        x (B, C, H, W), weights as :data:`~src.kernels.dim_conv.contract.Weights`
        -> (B, 3C, H, W), channels-last if x is
    """
    x, weight_channel, weight_height, weight_width = autocast_operands(x.device.type, x, *weights)
    channels, height, width = x.shape[1:]
    h_b, w_b = weight_height.shape[0], weight_width.shape[0]
    if exporting() and static_build_size(x, h_b, w_b):
        cast = (weight_channel, weight_height, weight_width)
        return dim_conv_exported(x, cast, dilation=dilation, interleave=interleave)
    half = (weight_channel.shape[-1] - 1) // 2
    d_c, d_h, d_w = dilation
    y_channel = F.conv2d(x, weight_channel, padding=half * d_c, dilation=d_c, groups=channels)
    x_hcw = x.transpose(1, 2)  # (B, C, H, W) -> (B, H, C, W)
    if not exporting():  # one copy both branches read (the docstring); a graph leaves it out,
        x_hcw = x_hcw.contiguous()  # as XNNPACK's partitioner takes no change of memory format
    # height-wise: H groups, kernel over (C, W); resized to H_b rows and back
    x_h = resize_axis(x_hcw, 1, h_b)  # (B, H_b, C, W)
    y_h = F.conv2d(x_h, weight_height, padding=half * d_h, dilation=d_h, groups=h_b)
    y_height = resize_axis(y_h, 1, height).transpose(1, 2)  # (B, H, C, W) -> (B, C, H, W)
    # width-wise: W groups, kernel over (H, C); resized to W_b columns and back
    x_w = resize_axis(x_hcw, -1, w_b).permute(0, 3, 1, 2)  # (B, H, C, W_b) -> (B, W_b, H, C)
    y_w = F.conv2d(x_w, weight_width, padding=half * d_w, dilation=d_w, groups=w_b)
    y_w = y_w.permute(0, 2, 3, 1)  # (B, W_b, H, C) -> (B, H, C, W_b)
    y_width = resize_axis(y_w, -1, width).transpose(1, 2)  # (B, H, C, W) -> (B, C, H, W)
    branches = (y_channel, y_height, y_width)
    if is_channels_last(x):
        # channels-last in, channels-last out, as the Triton kernel: the convolutions and norms
        # after it then read one layout (a contiguous output cost the DiCENet s=1.0 CPU training
        # step 1-3% in layout copies). 3 x (B, H, W, C) views -> (B, H, W, C, 3) interleaved or
        # (B, H, W, 3, C) concatenated -> (B, H, W, 3C) -> (B, 3C, H, W)
        rows = [branch.permute(0, 2, 3, 1) for branch in branches]
        out = torch.stack(rows, dim=-1 if interleave else -2).flatten(-2)
        return out.permute(0, 3, 1, 2)
    return join(branches, interleave)


def join(branches: tuple[Tensor, Tensor, Tensor], interleave: bool) -> Tensor:
    """DimConv's output from its three branches: interleaved, 3 x (B, C, H, W) -> (B, C, 3, H, W)
    -> (B, 3C, H, W), or concatenated [channel, height, width].

    Shape:
        3 x (B, C, H, W) -> (B, 3C, H, W)
    """
    if interleave:
        return torch.stack(branches, dim=2).flatten(1, 2)
    return torch.cat(branches, dim=1)


def static_build_size(x: Tensor, height: int, width: int) -> bool:
    """Whether ``x`` (B, C, H, W) is at the build size (H_b, W_b) = (``height``, ``width``) in
    a graph whose height and width are static: ``torch.export`` gives a dynamic size as a
    symbol, so a plain int is the graph's one size (``torch.jit.trace`` gives ints for dynamic
    sizes too, so it never counts as static)."""
    return static_size(x) == (height, width)


def dim_conv_exported(
    x: Tensor,
    weights: Weights,
    *,
    dilation: tuple[int, int, int] = (1, 1, 1),
    interleave: bool = True,
) -> Tensor:
    """DimConv as the graph an exported network holds at its build size, for runtimes that
    run each node as written (onnxruntime, XNNPACK): the same map as
    :func:`dim_conv_reference`, without its resize products (identities at the build size) and
    with every transpose moving one axis. The width-wise branch convolves
    (B, W, C, H) with its kernels' axes swapped to (channel, height) instead of the reference's
    (B, W, H, C): the reference reaches that from x through (B, H, C, W), and with the identity
    products gone the exporter merges the two into one transpose reversing axes 1-3, which
    onnxruntime copies 7-13x slower than a one-axis move (a (1, 232, 28, 28) map: 680 us
    against 51-89 us on one core).

    Shape:
        x (B, C, H_b, W_b), weights as :data:`~src.kernels.dim_conv.contract.Weights`
        -> (B, 3C, H_b, W_b)
    """
    return join(dim_conv_branches_exported(x, weights, dilation=dilation), interleave)


def dim_conv_branches_exported(
    x: Tensor, weights: Weights, *, dilation: tuple[int, int, int] = (1, 1, 1)
) -> tuple[Tensor, Tensor, Tensor]:
    """The three branches of :func:`dim_conv_exported`, not yet joined (the DiCE unit's exported
    graph fuses them per channel without the join: :meth:`src.ops.dim_fuse.DimFuse.fuse_branches`).

    Shape:
        x (B, C, H_b, W_b) -> 3 x (B, C, H_b, W_b): channel-, height- and width-wise responses
    """
    weight_channel, weight_height, weight_width = weights
    half = (weight_channel.shape[-1] - 1) // 2
    d_c, d_h, d_w = dilation
    channels, height, width = x.shape[1:]
    y_channel = F.conv2d(x, weight_channel, padding=half * d_c, dilation=d_c, groups=channels)
    # height-wise: (B, C, H, W) -> (B, H, C, W), H groups, kernel over (C, W), and back
    x_h = x.transpose(1, 2)
    y_h = F.conv2d(x_h, weight_height, padding=half * d_h, dilation=d_h, groups=height)
    y_height = y_h.transpose(1, 2)
    # width-wise: (B, C, H, W) -> (B, W, C, H), W groups, kernel over (C, H), and back
    x_w = x.permute(0, 3, 1, 2)
    kernel = weight_width.transpose(2, 3)  # (W, 1, height tap, channel tap) -> (channel, height)
    y_w = F.conv2d(x_w, kernel, padding=half * d_w, dilation=d_w, groups=width)
    y_width = y_w.permute(0, 2, 3, 1)
    return y_channel, y_height, y_width


def _cpu_applies(x: Tensor, weights: Weights) -> bool:
    """Whether :func:`dim_conv_cpu` takes ``x``: a channels-last CPU tensor at the build size
    (H and W equal to the height- and width-wise kernel counts), outside any dispatch mode, with
    the kernels built. The dtypes are checked by :func:`dim_conv_cpu` after autocast's casts."""
    weight_channel, weight_height, weight_width = weights
    return (
        x.is_cpu
        and is_channels_last(x)
        and x.shape[1] == weight_channel.shape[0]
        and x.shape[2:] == (weight_height.shape[0], weight_width.shape[0])
        and not dispatch_mode_active()
        and cpu_kernels_loaded()
    )


def dim_conv_cpu(
    x: Tensor,
    weights: Weights,
    *,
    dilation: tuple[int, int, int],
    interleave: bool,
) -> Tensor | None:
    """DimConv by the CPU kernels, or None where the operands' dtypes after autocast's casts are
    not the kernels' (the caller then takes the eager path). Under ``torch.autocast`` every
    operand is cast to its dtype first, as the eager path casts them (float32 weights keep float32
    gradients).

    Shape:
        x (B, C, H, W) channels-last, weights as :data:`~src.kernels.dim_conv.contract.Weights`
        (H = H_b, W = W_b) -> (B, 3C, H, W) channels-last
    """
    operands = autocast_operands("cpu", x, *weights)
    if operands[0].dtype not in KERNEL_DTYPES or any(
        w.dtype != operands[0].dtype for w in operands[1:]
    ):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in operands):
        return DimConvCpuFunction.apply(operands[0], dilation, interleave, *operands[1:])
    x_rows, *weights = _kernel_views(*operands)
    y = dim_conv_forward(x_rows, *weights, list(dilation), interleave)
    return y.permute(0, 3, 1, 2)


def _kernel_views(x: Tensor, *weights: Tensor) -> tuple[Tensor, ...]:
    """x (B, C, H, W) channels-last as (B, H, W, C); each weight (n, 1, k, k) as (n, k, k)."""
    return (x.permute(0, 2, 3, 1), *(w.squeeze(1) for w in weights))


@opaque_op(
    "lightnets::dim_conv_forward", contract.FORWARD_SCHEMA, contract.channels_last_forward_fake
)
def dim_conv_forward(
    x: Tensor, weight_channel: Tensor, weight_height: Tensor, weight_width: Tensor,
    dilation: list[int], interleave: bool,
) -> Tensor:  # fmt: skip
    """``lightnets_cpu::dim_conv_forward``; opaque to ``torch.compile``.

    Shape:
        x (B, H, W, C), weights (C, k, k), (H, k, k), (W, k, k) -> (B, H, W, 3C)
    """
    return torch.ops.lightnets_cpu.dim_conv_forward(
        x, weight_channel, weight_height, weight_width, dilation, interleave
    )


@opaque_op(
    "lightnets::dim_conv_backward",
    contract.CHANNELS_LAST_BACKWARD_SCHEMA,
    contract.channels_last_backward_fake,
)
def dim_conv_backward(
    grad_y: Tensor, x: Tensor, weight_channel: Tensor, weight_height: Tensor,
    weight_width: Tensor, dilation: list[int], interleave: bool, input_grad: bool,
    weight_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``lightnets_cpu::dim_conv_backward``: grad_x and the three float32 weight gradients, each
    an empty tensor where not wanted; opaque to ``torch.compile``.

    Shape:
        grad_y (B, H, W, 3C), x (B, H, W, C), weights as :func:`dim_conv_forward`'s
        -> (x's shape, the weights' shapes)
    """
    grad_x, grad_c, grad_h, grad_w = torch.ops.lightnets_cpu.dim_conv_backward(
        grad_y, x, weight_channel, weight_height, weight_width, dilation, interleave,
        input_grad, weight_grad,
    )  # fmt: skip
    return grad_x, grad_c, grad_h, grad_w


class DimConvCpuFunction(torch.autograd.Function):
    """Both directions of DimConv by the CPU kernels, on a channels-last x; the three weights
    last, as autograd's inputs."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, x: Tensor, dilation: tuple[int, int, int], interleave: bool, *weights: Tensor
    ) -> Tensor:
        with autocast_off("cpu"):  # the operands share a dtype already
            views = _kernel_views(x, *weights)
            y = dim_conv_forward(*views, list(dilation), interleave)
        ctx.save_for_backward(*views)
        ctx.dilation, ctx.interleave = list(dilation), interleave
        return y.permute(0, 3, 1, 2)  # (B, H, W, 3C) -> (B, 3C, H, W) channels-last

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, *weights = ctx.saved_tensors
        wanted = ctx.needs_input_grad
        weight_grad = any(wanted[3:])
        # a copy only if autograd's layout differs from the output's
        grad_rows = grad_y.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
        grad_x, *grad_weights = dim_conv_backward(
            grad_rows, x, *weights, ctx.dilation, ctx.interleave, wanted[0], weight_grad
        )
        return (
            grad_x.permute(0, 3, 1, 2) if wanted[0] else None,
            None,
            None,
            *(
                g.to(w.dtype).unsqueeze(1) if want else None
                for g, w, want in zip(grad_weights, weights, wanted[3:], strict=True)
            ),
        )
