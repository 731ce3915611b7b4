"""GroupLinear: the fast PyTorch path and the Triton kernel against the plain oracle.

The kernel tests run on CUDA tensors where there is a GPU and otherwise in Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1), so the shapes stay tiny; rows are never a multiple of
the row block (32 in the interpreter, 64 on a GPU). The ``kernel_device`` fixture turns TF32 off on
CUDA, so float32 products are exact on both sides and the 1e-5 tolerances cover summation order.
"""

from __future__ import annotations

import pytest
import torch

from src.kernels.group_linear import group_linear, group_linear_reference, interleaved_group_linear
from src.ops.group_linear import GroupLinear
from tests.helpers import path_timer, tf32

CUDA = torch.cuda.is_available()


def _params(
    groups: int,
    k: int,
    n: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    bias: bool = True,
):
    weight = torch.randn(groups, k, n, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn(groups, n, dtype=dtype, device=device, requires_grad=True) if bias else None
    return weight, b


def _grads(y: torch.Tensor, inputs: list[torch.Tensor], seed: int = 1) -> list[torch.Tensor]:
    grad_y = torch.randn(
        y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32
    )
    return list(torch.autograd.grad(y, inputs, grad_y.to(y)))


def _interleave(parts: list[torch.Tensor], groups: int) -> torch.Tensor:
    """The input mixer written out: [p0_1, p1_1, ..., p0_g, p1_g] as one (N, sum d_j) matrix."""
    chunks = [p.chunk(groups, dim=1) for p in parts]
    return torch.cat([c[i] for i in range(groups) for c in chunks], dim=1)


@pytest.mark.parametrize("shuffle", [False, True], ids=["plain", "shuffle"])
@pytest.mark.parametrize("groups", range(1, 9))
def test_triton_matches_reference(groups: int, shuffle: bool, kernel_device: torch.device) -> None:
    torch.manual_seed(groups)
    rows, k, n = 37, 3 + groups % 3, 5 + groups % 2  # odd sizes: masked tails everywhere
    x = torch.randn(rows, groups * k, device=kernel_device, requires_grad=True)
    weight, bias = _params(groups, k, n, torch.float32, kernel_device)
    y = group_linear(x, weight, bias, shuffle=shuffle, impl="triton")
    ref = group_linear_reference(x, weight, bias, shuffle)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(_grads(y, [x, weight, bias]), _grads(ref, [x, weight, bias]), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 12), (1, 40, 12), (65, 12)], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_triton_shapes_and_no_bias(
    shape: tuple[int, ...], bias: bool, kernel_device: torch.device
) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape, device=kernel_device, requires_grad=True)
    glt = GroupLinear(12, 20, 4, bias=bias, shuffle=True, impl="triton").to(kernel_device)
    y = glt(x)
    ref = group_linear_reference(x, glt.weight, glt.bias, True)
    assert y.shape == (*shape[:-1], 20)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    inputs = [x, *glt.parameters()]
    for got, want in zip(_grads(y, inputs), _grads(ref, inputs), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["plain", "shuffle"])
def test_two_parts_are_the_input_mixer(
    impl: str, shuffle: bool, kernel_device: torch.device
) -> None:
    torch.manual_seed(0)
    groups, rows = 4, 33
    x0 = torch.randn(rows, 8, device=kernel_device, requires_grad=True)
    y_prev = torch.randn(rows, 12, device=kernel_device, requires_grad=True)
    weight, bias = _params(groups, (8 + 12) // groups, 3, torch.float32, kernel_device)
    y = interleaved_group_linear((x0, y_prev), weight, bias, shuffle=shuffle, impl=impl)
    ref = group_linear_reference(_interleave([x0, y_prev], groups), weight, bias, shuffle)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    inputs = [x0, y_prev, weight, bias]
    for got, want in zip(_grads(y, inputs), _grads(ref, inputs), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_triton_reads_strided_rows(kernel_device: torch.device) -> None:
    # a column slice of a wider matrix: rows strided, features unit-stride, read in place
    torch.manual_seed(0)
    wide = torch.randn(21, 30, device=kernel_device)
    x = wide[:, 5:17]
    weight, bias = _params(3, 4, 2, torch.float32, kernel_device)
    y = group_linear(x, weight, bias, shuffle=True, impl="triton")
    torch.testing.assert_close(
        y, group_linear_reference(x, weight, bias, True), atol=1e-5, rtol=1e-5
    )


def test_triton_float16(kernel_device: torch.device) -> None:
    torch.manual_seed(0)
    x = torch.randn(19, 16, device=kernel_device, dtype=torch.float16, requires_grad=True)
    weight, bias = _params(4, 4, 6, torch.float16, kernel_device)
    y = group_linear(x, weight, bias, shuffle=True, impl="triton")
    ref = group_linear_reference(x.float(), weight.float(), bias.float(), True)
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=2e-2)
    inputs = [x, weight, bias]
    for got, want in zip(_grads(y, inputs), _grads(ref, inputs), strict=True):
        torch.testing.assert_close(got.float(), want.float(), atol=5e-2, rtol=2e-2)


def test_triton_bfloat16(kernel_device: torch.device) -> None:
    """bf16 operands, float32 accumulation; in the interpreter the kernel widens them before
    tl.dot (which there multiplies bf16 bit patterns, triton-lang/triton#11584)."""
    torch.manual_seed(0)
    x = torch.randn(300, 64, device=kernel_device, dtype=torch.bfloat16, requires_grad=True)
    weight, bias = _params(8, 8, 16, torch.bfloat16, kernel_device)
    y = group_linear(x, weight, bias, shuffle=True, impl="triton")
    ref = group_linear_reference(x.float(), weight.float(), bias.float(), True)
    torch.testing.assert_close(y.float(), ref, atol=5e-2, rtol=2e-2)
    inputs = [x, weight, bias]
    for got, want in zip(_grads(y, inputs), _grads(ref, inputs), strict=True):
        torch.testing.assert_close(got.float(), want.float(), atol=2e-1, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="TF32 is a mode of CUDA devices")
def test_triton_tf32_where_torch_allows_it(kernel_device: torch.device) -> None:
    """With ``torch.backends.cuda.matmul.allow_tf32`` set, the kernel's float32 products are TF32
    ones, as PyTorch's matmuls then are: within TF32 rounding of the float64 oracle."""
    torch.manual_seed(0)
    x = torch.randn(300, 64, device=kernel_device)
    weight, bias = _params(8, 8, 16, torch.float32, kernel_device)
    with tf32(True):
        y = group_linear(x, weight, bias, shuffle=True, impl="triton")
    ref = group_linear_reference(x.double(), weight.double(), bias.double(), True)
    # TF32 keeps 11 significant bits of each input (relative error 2^-11 = 4.9e-4 each); outputs
    # are sums of 8 products of unit normals and a bias, about 3 in size: errors of a few 1e-3
    torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shuffle", [False, True], ids=["plain", "shuffle"])
def test_fast_reference_matches_oracle(shuffle: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 24, requires_grad=True)
    glt = GroupLinear(24, 18, 3, shuffle=shuffle, impl="reference")
    y = glt(x)
    ref = group_linear_reference(x, glt.weight, glt.bias, shuffle)
    torch.testing.assert_close(y, ref)
    inputs = [x, *glt.parameters()]
    for got, want in zip(_grads(y, inputs), _grads(ref, inputs), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["plain", "shuffle"])
@pytest.mark.parametrize("n_parts", [1, 2])
def test_reference_gradcheck(n_parts: int, shuffle: bool, bias: bool) -> None:
    torch.manual_seed(0)
    groups = 2
    parts = [
        torch.randn(5, 4 * (j + 1), dtype=torch.float64, requires_grad=True) for j in range(n_parts)
    ]
    k = sum(p.shape[1] for p in parts) // groups
    weight, b = _params(groups, k, 3, torch.float64, bias=bias)
    inputs = (*parts, weight) + ((b,) if bias else ())

    def fn(*args: torch.Tensor) -> torch.Tensor:
        return interleaved_group_linear(
            args[:n_parts],
            args[n_parts],
            args[n_parts + 1] if bias else None,
            shuffle=shuffle,
            impl="reference",
        )

    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["plain", "shuffle"])
@pytest.mark.parametrize("n_parts", [1, 2])
def test_reference_16_bit_matches_oracle(n_parts: int, shuffle: bool, dtype: torch.dtype) -> None:
    """In 16 bits the CPU reference takes the weight gradient one group at a time; output and
    every gradient equal the float64 oracle on the same 16-bit values within one 16-bit rounding
    of the result (each product accumulates in float32 and is rounded once)."""
    torch.manual_seed(0)
    groups, rows = 4, 37
    # strided rows: each part is a column slice of a wider matrix
    parts = [
        torch.randn(rows, 8 * (j + 1) + 3, dtype=dtype)[:, 3:].requires_grad_()
        for j in range(n_parts)
    ]
    k = sum(p.shape[1] for p in parts) // groups
    weight, bias = _params(groups, k, 5, dtype)
    y = interleaved_group_linear(parts, weight, bias, shuffle=shuffle, impl="reference")
    exact = [t.detach().double().requires_grad_() for t in (*parts, weight, bias)]
    ref = group_linear_reference(_interleave(exact[:n_parts], groups), *exact[n_parts:], shuffle)
    assert y.dtype == dtype
    grad_y = torch.randn(y.shape, dtype=dtype)
    grads = torch.autograd.grad(y, [*parts, weight, bias], grad_y)
    exact_grads = torch.autograd.grad(ref, exact, grad_y.double())
    eps = torch.finfo(dtype).eps
    for got, want in zip([y, *grads], [ref, *exact_grads], strict=True):
        assert got.dtype == dtype and got.shape == want.shape
        assert (got.double() - want).abs().max() <= eps * want.abs().max()


def test_auto_runs_reference_on_cpu_float64() -> None:
    glt = GroupLinear(8, 4, 2, impl="auto").double()
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(glt(x), group_linear_reference(x, glt.weight, glt.bias, False))


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match=r"in_features \(10\).*groups \(4\)"):
        GroupLinear(10, 8, 4)
    weight = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="expects 6"):
        group_linear(torch.randn(5, 8), weight, None, shuffle=False)
    with pytest.raises(ValueError, match="divisible by 2 groups"):
        interleaved_group_linear(
            (torch.randn(5, 3), torch.randn(5, 3)), weight, None, shuffle=False
        )
    with pytest.raises(ValueError, match="impl must be one of"):
        GroupLinear(4, 4, 2, impl="cuda")


@pytest.mark.parametrize("splits", [1, 2, 3, 7])
def test_split_k_grouped_gemm(splits: int, kernel_device: torch.device) -> None:
    """The weight-gradient product x^T dy split over the tokens: the sum of the float32 partials
    equals the one-pass product, and the column sums come out of the same programs."""
    from src.kernels.group_linear.triton_kernel import _grouped_gemm

    torch.manual_seed(splits)
    tokens, groups, k, n = 300, 3, 5, 6  # 300 tokens: 10 blocks of 32, a ragged last split
    xg = torch.randn(tokens, groups, k, device=kernel_device)
    dy = torch.randn(tokens, groups, n, device=kernel_device)
    out = torch.empty(groups, k, n, device=kernel_device)
    colsum = torch.empty(groups, n, device=kernel_device)
    _grouped_gemm(
        xg.permute(2, 1, 0), dy.transpose(0, 1), out.transpose(0, 1), colsum=colsum, splits=splits
    )
    torch.testing.assert_close(out, torch.einsum("tgk,tgn->gkn", xg, dy), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(colsum, dy.sum(0), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("method", ["splitk", "bmm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_weight_gradient_methods_match_reference(
    method: str, dtype: torch.dtype, kernel_device: torch.device, monkeypatch
) -> None:
    """Both weight-gradient methods, chosen by LIGHTNETS_GLT_WGRAD, through the GLT with the input
    mixer's two parts over enough tokens for split-K (bf16: within its rounding of the fp32
    sums)."""
    from src.kernels.environment import GLT_WEIGHT_GRAD_ENV
    from src.kernels.group_linear.triton_kernel import split_k_splits

    monkeypatch.setenv(GLT_WEIGHT_GRAD_ENV, method)
    torch.manual_seed(0)
    # split-K reduces at least 4 blocks a split: 64 tokens a block on a GPU, 32 in the interpreter
    tokens, groups, n = 555, 4, 7
    parts = [
        torch.randn(tokens, groups * d, device=kernel_device, dtype=dtype, requires_grad=True)
        for d in (3, 5)
    ]
    weight, bias = _params(groups, 8, n, dtype, kernel_device)
    assert split_k_splits(parts[0].unflatten(1, (groups, -1)).permute(2, 1, 0), n, programs=16) > 1
    y = interleaved_group_linear(parts, weight, bias, shuffle=True, impl="triton")
    ref = interleaved_group_linear(
        [p.float() for p in parts], weight.float(), bias.float(), shuffle=True, impl="reference"
    )
    tol = {"atol": 1e-4, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.25, "rtol": 2e-2}
    got = _grads(y, [weight, bias, *parts])
    want = _grads(ref, [weight, bias, *parts])
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), w.float(), **tol)


def test_weight_gradient_method_is_measured_once_per_shape(monkeypatch, fresh_choices) -> None:
    """auto: the faster method by the timer, kept per shape and dtype; a bad setting is named."""
    from src.kernels.environment import GLT_WEIGHT_GRAD_ENV
    from src.kernels.group_linear import triton_kernel as triton_glt

    monkeypatch.delenv(GLT_WEIGHT_GRAD_ENV, raising=False)
    calls = []

    def timer(fn) -> float:
        calls.append(fn.func.__name__)
        return {"weight_grad_splitk": 2.0, "weight_grad_bmm": 1.0}[fn.func.__name__]

    xg, dy = torch.randn(64, 2, 3), torch.randn(64, 2, 4)
    assert triton_glt.weight_grad_method(xg, dy, timer) == "bmm"
    assert triton_glt.weight_grad_method(xg, dy, timer) == "bmm"
    assert calls == ["weight_grad_splitk", "weight_grad_bmm"]  # measured once
    assert triton_glt.weight_grad_method(xg.double(), dy.double(), timer) == "bmm"
    assert len(calls) == 4  # another dtype is another choice
    assert triton_glt.weight_grad_method(xg, dy) == "splitk"  # CPU, untimed: the interpreted kernel
    monkeypatch.setenv(GLT_WEIGHT_GRAD_ENV, "cublas")
    with pytest.raises(
        ValueError, match="LIGHTNETS_GLT_WGRAD='cublas'; choose auto, splitk or bmm"
    ):
        triton_glt.weight_grad_method(xg, dy)


def test_auto_path_is_measured_once_per_shape(fresh_choices, kernel_device: torch.device) -> None:
    """impl="auto" on CUDA runs whichever of the kernel and the reference timed faster for the
    shape and mode (the timer injected here; both candidates compute the same output, a training
    step on detached operands while autograd records)."""
    from src.kernels import chosen, timings
    from src.kernels import group_linear as glt

    times = {"triton": 2.0, "reference": 1.0}
    outputs: dict = {}
    timer = path_timer(times, outputs)

    torch.manual_seed(0)
    parts = [torch.randn(37, 8, device=kernel_device), torch.randn(37, 12, device=kernel_device)]
    weight, bias = _params(4, 5, 3, torch.float32, kernel_device)
    assert glt.auto_path(parts, weight, bias, True, timer) == "reference"
    torch.testing.assert_close(outputs["triton"], outputs["reference"], atol=1e-5, rtol=1e-5)
    assert outputs["triton"].requires_grad and weight.grad is None  # a step, the caller's untouched
    times["reference"] = 3.0
    assert glt.auto_path(parts, weight, bias, True, timer) == "reference"  # kept
    assert glt.auto_path(parts, weight, None, True, timer) == "triton"  # another key
    # rows are kept by power-of-two bucket: 33..64 rows share the choice made at 37
    assert glt.auto_path([p[:50] for p in parts], weight, bias, True, timer) == "reference"
    assert glt.auto_path([p[:20] for p in parts], weight, bias, True, timer) == "triton"
    with torch.no_grad():  # inference: another choice, timed as a forward alone
        assert glt.auto_path(parts, weight, bias, True, timer) == "triton"
    assert not outputs["triton"].requires_grad
    assert len(chosen(glt.CHOICE)) == 4 and timings() == 4
    # deterministic algorithms: nothing timed, the kernel (a fixed summation order)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert glt.auto_path(parts, weight, bias, True) == "triton"
    finally:
        torch.use_deterministic_algorithms(deterministic)


@pytest.mark.parametrize("wanted", ["both", "x0", "y", "none"])
@pytest.mark.parametrize("rows", [33, 300], ids=["one split", "split-K"])
def test_two_part_gradients_in_one_launch_each(
    wanted: str, rows: int, kernel_device: torch.device
) -> None:
    """The mixer's two parts: both input gradients in one launch (columns split between them),
    the weight gradient of both in one (rows continued in the second part, split over the tokens
    at 300 rows); equal to the oracle whichever gradients are wanted."""
    torch.manual_seed(0)
    groups = 4
    x0 = torch.randn(rows, 8, device=kernel_device, requires_grad=wanted in ("both", "x0"))
    y_prev = torch.randn(rows, 20, device=kernel_device, requires_grad=wanted in ("both", "y"))
    weight, bias = _params(groups, (8 + 20) // groups, 6, torch.float32, kernel_device)
    y = interleaved_group_linear((x0, y_prev), weight, bias, shuffle=True, impl="triton")
    ref = group_linear_reference(_interleave([x0, y_prev], groups), weight, bias, True)
    inputs = [t for t in (x0, y_prev, weight, bias) if t.requires_grad]
    for got, want in zip(_grads(y, inputs), _grads(ref, inputs), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(CUDA, reason="launches are recorded in Triton's interpreter")
def test_two_part_backward_launches() -> None:
    from benchmarks.cross_compile import H100, recorded_launches

    x0 = torch.randn(300, 64, requires_grad=True)
    y_prev = torch.randn(300, 128, requires_grad=True)
    weight, bias = _params(8, (64 + 128) // 8, 32, torch.float32)
    y = interleaved_group_linear((x0, y_prev), weight, bias, shuffle=True, impl="triton")
    with recorded_launches(H100) as launches:
        y.backward(torch.ones_like(y))
    # one launch for both input gradients and one for the weight and bias gradients
    assert len(launches) == 2
    kinds = {dict(launch.constants)["SPLIT_C"]: dict(launch.constants) for launch in launches}
    assert kinds[True]["SPLIT_A"] is False and kinds[False]["SPLIT_A"] is True
    assert kinds[False]["COLSUM"] is True
