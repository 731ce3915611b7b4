from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from src.kernels.dim_conv import auto_path, dim_conv_reference, resize_matrix
from src.ops.dim_conv import DimConv
from tests.helpers import path_timer

triton_dim_conv = pytest.importorskip("src.kernels.dim_conv.triton_kernel")

from src.kernels.triton import stencil  # noqa: E402


def _weights(
    channels: int,
    height: int,
    width: int,
    k: int = 3,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    return [
        torch.randn(n, 1, k, k, dtype=dtype, device=device, requires_grad=True)
        for n in (channels, height, width)
    ]


def _official_dim_conv(x: torch.Tensor, wc, wh, ww, dilation=(1, 1, 1)) -> torch.Tensor:
    """DimConv spelled out as the official code does it (transpose per branch, cat, shuffle)."""
    _, c, h, w = x.shape
    k = wc.shape[-1]
    pads = [(k - 1) // 2 * d for d in dilation]
    y_c = F.conv2d(x, wc, padding=pads[0], dilation=dilation[0], groups=c)
    y_h = F.conv2d(
        x.transpose(1, 2), wh, padding=pads[1], dilation=dilation[1], groups=h
    ).transpose(1, 2)
    y_w = F.conv2d(
        x.transpose(1, 3), ww, padding=pads[2], dilation=dilation[2], groups=w
    ).transpose(1, 3)
    return F.channel_shuffle(torch.cat([y_c, y_h, y_w], dim=1), 3)


@pytest.mark.parametrize("k, dilation", [(3, (1, 1, 1)), (3, (2, 1, 3)), (5, (1, 2, 1))])
def test_reference_matches_the_official_formulation(k: int, dilation: tuple[int, int, int]) -> None:
    x = torch.randn(2, 6, 7, 9)
    weights = _weights(6, 7, 9, k)
    out = dim_conv_reference(x, weights, dilation=dilation)
    torch.testing.assert_close(out, _official_dim_conv(x, *weights, dilation))
    concat = dim_conv_reference(x, weights, dilation=dilation, interleave=False)
    torch.testing.assert_close(F.channel_shuffle(concat, 3), out)


@pytest.mark.parametrize("interleave", [True, False])
def test_reference_keeps_a_channels_last_layout(interleave: bool) -> None:
    # the same values as from a contiguous input, laid out as the Triton kernel lays them out
    x = torch.randn(2, 6, 7, 9)
    weights = _weights(6, 7, 9)
    want = dim_conv_reference(x, weights, dilation=(1, 2, 1), interleave=interleave)
    got = dim_conv_reference(
        x.to(memory_format=torch.channels_last), weights, dilation=(1, 2, 1), interleave=interleave
    )
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # oneDNN's layouts may round apart
    if interleave:
        torch.testing.assert_close(got, _official_dim_conv(x, *weights, (1, 2, 1)))


@pytest.mark.parametrize(
    "shape, k, dilation, interleave, tile",
    [
        ((2, 5, 7, 9), 3, (1, 1, 1), True, None),  # odd sizes, H != W
        ((1, 19, 6, 13), 3, (1, 2, 3), False, None),  # dilations, concatenated output
        ((2, 3, 4, 4), 5, (1, 1, 2), True, None),  # k = 5, fewer channels than taps reach
        # small tiles: several programs along W (partial last block) and along H ...
        ((1, 3, 3, 11), 3, (1, 1, 1), True, 8),
        # ... and along C (7 = 2 + 2 + 2 + 1): block edges and cross-program atomics
        ((1, 7, 2, 2), 3, (1, 1, 1), False, 8),
    ],
)
def test_triton_matches_reference_fp32(
    shape, k, dilation, interleave, tile, monkeypatch, kernel_device: torch.device
) -> None:
    if tile is not None:
        budget = "TILE_GPU" if kernel_device.type == "cuda" else "TILE_INTERPRETER"
        monkeypatch.setattr(stencil, budget, tile)
    torch.manual_seed(0)
    _, c, h, w = shape
    x = torch.randn(*shape, device=kernel_device, requires_grad=True)
    weights = _weights(c, h, w, k, device=kernel_device)
    kwargs = {"dilation": dilation, "interleave": interleave}
    out = triton_dim_conv.dim_conv_triton(x, weights, **kwargs)
    ref = dim_conv_reference(x, weights, **kwargs)
    # float32 on both sides, summed in another order (see the kernel_device fixture)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *weights], grad)
    want = torch.autograd.grad(ref, [x, *weights], grad)
    # weight gradients sum over every image and pixel, in blocks joined by atomics on a GPU
    for name, g, r in zip(("input", "channel", "height", "width"), got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4, msg=f"grad of {name}")


@pytest.mark.parametrize("layout", ["channels_last", "sliced"])
@pytest.mark.parametrize("interleave", [True, False])
def test_triton_reads_any_layout(
    layout: str, interleave: bool, kernel_device: torch.device
) -> None:
    """Channels-last inputs and strided views are read in place: a channels-last input gives
    channels-last outputs and input gradients, and every value matches the reference."""
    torch.manual_seed(0)
    base = torch.randn(2, 10, 5, 7, device=kernel_device)
    if layout == "channels_last":
        x = base.to(memory_format=torch.channels_last).requires_grad_()
    else:  # every other channel of a wider tensor: neither layout is dense
        x = base.repeat_interleave(2, dim=1)[:, ::2].requires_grad_()
        assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    x_ref = x.detach().contiguous().requires_grad_()
    weights = _weights(10, 5, 7, device=kernel_device)
    kwargs = {"dilation": (1, 2, 1), "interleave": interleave}
    out = triton_dim_conv.dim_conv_triton(x, weights, **kwargs)
    ref = dim_conv_reference(x_ref, weights, **kwargs)
    assert out.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # a channels-last output gradient, as the next layer of a channels-last network hands back
    grad = torch.randn(out.shape, device=kernel_device).to(memory_format=torch.channels_last)
    got = torch.autograd.grad(out, [x, *weights], grad)
    want = torch.autograd.grad(ref, [x_ref, *weights], grad)
    if layout == "channels_last":
        assert got[0].is_contiguous(memory_format=torch.channels_last)
    for name, g, r in zip(("input", "channel", "height", "width"), got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4, msg=f"grad of {name}")


def test_triton_bf16_within_bf16_tolerance(kernel_device: torch.device) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 5, 7, dtype=torch.bfloat16, device=kernel_device, requires_grad=True)
    weights = _weights(6, 5, 7, dtype=torch.bfloat16, device=kernel_device)
    out = triton_dim_conv.dim_conv_triton(x, weights)
    assert out.dtype == torch.bfloat16
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *weights], grad)
    x32 = x.detach().float().requires_grad_()
    w32 = [w.detach().float().requires_grad_() for w in weights]
    ref = dim_conv_reference(x32, tuple(w32))
    want = torch.autograd.grad(ref, [x32, *w32], grad.float())
    # bf16 keeps 8 bits: inputs are rounded once, outputs once more; accumulation is fp32
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=5e-2)
    for g, r in zip(got, want):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), r, rtol=2e-2, atol=1e-1)


def _ran_triton(out: torch.Tensor) -> bool:
    return "DimConvFunction" in type(out.grad_fn).__name__


def test_module_dispatch(kernel_device: torch.device) -> None:
    layer = DimConv(4, 5, 6, impl="triton").to(kernel_device)
    weights = (layer.weight_channel, layer.weight_height, layer.weight_width)
    x = torch.randn(1, 4, 5, 6, device=kernel_device)
    out = layer(x)
    assert _ran_triton(out)
    torch.testing.assert_close(out, dim_conv_reference(x, weights))
    # off the build size the resizing reference runs, whatever impl says
    other = torch.randn(1, 4, 7, 3, device=kernel_device)
    out = layer(other)
    assert not _ran_triton(out)
    torch.testing.assert_close(out, dim_conv_reference(other, weights))
    # auto: on a CUDA tensor the path measured faster for the shape, the reference on a CPU tensor
    layer.impl = "auto"
    measured = kernel_device.type == "cuda" and auto_path(x, weights, (1, 1, 1), True) == "triton"
    assert _ran_triton(layer(x)) == measured
    assert not _ran_triton(layer.cpu()(x.cpu()))


def test_auto_path_is_measured_once_per_shape(fresh_choices, kernel_device: torch.device) -> None:
    """The kernel and the reference compute the same output; the faster (injected timer) is kept
    per input shape."""
    from src.kernels import chosen, dim_conv

    times = {"triton": 1.0, "reference": 2.0}
    outputs: dict = {}
    timer = path_timer(times, outputs)

    torch.manual_seed(0)
    x = torch.randn(2, 4, 5, 6, device=kernel_device)
    weights = tuple(w.to(kernel_device) for w in _weights(4, 5, 6))
    assert auto_path(x, weights, (1, 2, 1), True, timer) == "triton"
    torch.testing.assert_close(outputs["triton"], outputs["reference"], atol=1e-5, rtol=1e-5)
    # the weights require grad: a training step on detached copies, the caller's grads untouched
    assert outputs["reference"].requires_grad and all(w.grad is None for w in weights)
    times["triton"] = 3.0
    assert auto_path(x, weights, (1, 2, 1), True, timer) == "triton"  # kept
    assert auto_path(x[:1], weights, (1, 2, 1), True, timer) == "reference"  # another shape
    with torch.autocast(kernel_device.type, dtype=torch.bfloat16):  # another key: autocast dtype
        assert auto_path(x[:1], weights, (1, 2, 1), True, timer) == "reference"
    assert len(chosen(dim_conv.CHOICE)) == 3
    # deterministic algorithms: nothing timed, cuDNN's convolutions (the kernel adds atomics)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert auto_path(x, weights, (1, 2, 1), True) == "reference"
    finally:
        torch.use_deterministic_algorithms(deterministic)


@pytest.mark.parametrize("size", [(3, 11), (8, 8), (12, 5), (1, 1)])
def test_dynamic_size_keeps_the_input_size(size: tuple[int, int]) -> None:
    layer = DimConv(6, 8, 8)
    out = layer(torch.randn(2, 6, *size))
    assert out.shape == (2, 18, *size)


@pytest.mark.parametrize("n_in, n_out", [(20, 28), (36, 28), (16, 14), (5, 5), (1, 4), (7, 1)])
def test_resize_matrix_matches_interpolate_and_adaptive_pool(n_in: int, n_out: int) -> None:
    x = torch.randn(2, 3, n_in, 4, dtype=torch.float64)
    matrix = resize_matrix(n_in, n_out, dtype=x.dtype, device=x.device)
    if n_out > n_in:
        want = F.interpolate(x, size=(n_out, 4), mode="bilinear", align_corners=True)
    else:
        want = F.adaptive_avg_pool2d(x, (n_out, 4))
    torch.testing.assert_close(matrix @ x, want)


@pytest.mark.parametrize("size", [(4, 5), (3, 7), (6, 2)])
def test_reference_gradcheck(size: tuple[int, int]) -> None:
    layer = DimConv(3, 4, 5, dilation=(1, 2, 1)).double()
    x = torch.randn(1, 3, *size, dtype=torch.float64, requires_grad=True)
    weights = (layer.weight_channel, layer.weight_height, layer.weight_width)
    assert torch.autograd.gradcheck(
        lambda x, *w: dim_conv_reference(x, w, dilation=layer.dilation), (x, *weights)
    )


def test_exports_at_a_dynamic_size() -> None:
    layer = DimConv(4, 6, 6).eval()
    x = torch.randn(1, 4, 5, 9)
    exported = torch.export.export(layer, (x,))
    torch.testing.assert_close(exported.module()(x), layer(x))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="odd"):
        DimConv(4, 5, 6, kernel_size=4)
    with pytest.raises(ValueError, match="impl"):
        DimConv(4, 5, 6, impl="cuda")
    with pytest.raises(ValueError, match=r"expected \(B, 4, H, W\), got \(1, 3, 5, 6\)"):
        DimConv(4, 5, 6)(torch.randn(1, 3, 5, 6))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", [(8, 116, 28, 28), (3, 19, 6, 70)])
def test_triton_on_cuda_matches_reference(
    shape: tuple[int, int, int, int], kernel_device: torch.device
) -> None:
    """DiCENet's sizes, where the GPU tiles (512 pixels) cut the maps in several ways."""
    torch.manual_seed(0)
    _, c, h, w = shape
    x = torch.randn(*shape, device=kernel_device, requires_grad=True)
    weights = _weights(c, h, w, device=kernel_device)
    layer_out = triton_dim_conv.dim_conv_triton(x, weights)
    ref = dim_conv_reference(x, weights)
    torch.testing.assert_close(layer_out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(layer_out, [x, *weights], grad)
    want = torch.autograd.grad(ref, [x, *weights], grad)
    # the weight gradients here sum 8 x 28 x 28 products per tap
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-3)
