"""The relative softmax's Triton kernels (``src/kernels/relative_softmax/triton_kernel.py``;
compiled on CUDA, Triton's interpreter on the CPU) against the eager ops, forward and backward, and
how ``impl="auto"`` chooses on CUDA.

Tolerances: the scores are formed with the eager ops' roundings, so the float32 probabilities
differ by the exponential's and the division's rounding only, within 4 ulp (2^-21 relative) of the
largest; for 16-bit dtypes both paths normalise in float32 and round once, within one ulp of the
dtype at the largest value (2^-8 bfloat16, 2^-11 float16); the gradients, which the eager path
rounds after each of its three backward ops and the kernel once, within two. Triton's interpreter
casts float32 to bfloat16 by truncation, where the GPU and PyTorch round to nearest, at each of
the kernel's three roundings: there the bfloat16 bounds are tripled.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import src.kernels.relative_softmax
from src.kernels import chosen, forget, timings
from src.kernels.relative_softmax import (
    auto_path,
    rel_shift,
    relative_softmax,
    relative_softmax_reference,
)
from src.ops.relative_position import causal_memory_mask
from tests.helpers import assert_within_ulps

pytest.importorskip("triton")

from src.kernels.relative_softmax.triton_kernel import MAX_KEYS, covers

# (queries T, memory M, mask)
CONFIGS = [(5, 3, "causal"), (7, 0, "causal"), (1, 6, "causal"), (6, 4, "none"), (33, 40, "random")]


def _mask(kind: str, qlen: int, mlen: int, device: torch.device) -> Tensor | None:
    if kind == "causal":
        return causal_memory_mask(qlen, mlen, device=device)
    if kind == "random":
        mask = torch.rand(qlen, qlen + mlen, generator=torch.Generator().manual_seed(5)) < 0.3
        mask[:, 0] = False
        return mask.to(device)
    return None


def _operands(qlen: int, mlen: int, dtype: torch.dtype, device: torch.device) -> list[Tensor]:
    gen = torch.Generator().manual_seed(0)
    shape = (2, 3, qlen, qlen + mlen)
    return [(torch.randn(shape, generator=gen) * 2).to(device, dtype) for _ in range(3)]


def _run(content: Tensor, position: Tensor, mask: Tensor | None, probe: Tensor, impl: str):
    content = content.detach().requires_grad_()
    position = position.detach().requires_grad_()
    if impl == "reference":
        prob = relative_softmax_reference(content, position, mask, 0.35)
    else:
        prob = relative_softmax(content, position, mask, 0.35, impl=impl)
    return (prob, *torch.autograd.grad(prob, (content, position), probe))


@pytest.mark.parametrize(("qlen", "mlen", "mask_kind"), CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_kernel_matches_the_eager_ops(
    kernel_device: torch.device, qlen: int, mlen: int, mask_kind: str, dtype: torch.dtype
) -> None:
    content, position, probe = _operands(qlen, mlen, dtype, kernel_device)
    mask = _mask(mask_kind, qlen, mlen, kernel_device)
    ours = _run(content, position, mask, probe, "triton")
    eager = _run(content, position, mask, probe, "reference")
    ulps = 4 if dtype == torch.float32 else 1
    if dtype == torch.bfloat16 and kernel_device.type == "cpu":
        ulps = 3  # the interpreter casts to bfloat16 by truncation (the GPU rounds to nearest)
    assert all(t.dtype == dtype and t.shape == content.shape for t in ours)
    assert_within_ulps(ours[0], eager[0], ulps, dtype)
    for got, want in zip(ours[1:], eager[1:], strict=True):
        assert_within_ulps(got, want, 2 * ulps, dtype)
    if mask is not None:
        assert torch.all(ours[0][..., mask] == 0) and torch.all(ours[1][..., mask] == 0)


@pytest.mark.parametrize(("qlen", "mlen", "mask_kind"), CONFIGS, ids=str)
def test_position_gradient_is_the_adjoint_of_rel_shift(
    kernel_device: torch.device, qlen: int, mlen: int, mask_kind: str
) -> None:
    """Bit for bit rel_shift's autograd transpose of the kernel's own score gradient: the stores
    cover every position entry once, the zero-fed head of row 0 included."""
    content, position, probe = _operands(qlen, mlen, torch.float32, kernel_device)
    _, grad_content, grad_position = _run(
        content, position, _mask(mask_kind, qlen, mlen, kernel_device), probe, "triton"
    )
    x = position.clone().requires_grad_()
    (adjoint,) = torch.autograd.grad(rel_shift(x), x, grad_content)
    assert torch.equal(grad_position, adjoint)


def test_masked_rows_and_huge_scores(kernel_device: torch.device) -> None:
    content, position, probe = _operands(4, 4, torch.float32, kernel_device)
    content[0, 0, 1, 2] = 3e4  # one score far above the rest: a one-hot row
    mask = causal_memory_mask(4, 4, device=kernel_device)
    mask[3] = True
    ours = _run(content, position, mask, probe, "triton")
    eager = _run(content, position, mask, probe, "reference")
    assert torch.isnan(ours[0][..., 3, :]).all() and torch.all(ours[1][..., 3, :] == 0)
    assert torch.equal(ours[0][0, 0, 1], eager[0][0, 0, 1]) and ours[0][0, 0, 1, 2] == 1
    finite = ~torch.isnan(eager[0])
    assert_within_ulps(ours[0][finite], eager[0][finite], 4, torch.float32)


def test_kernel_is_deterministic(kernel_device: torch.device) -> None:
    content, position, probe = _operands(9, 7, torch.float32, kernel_device)
    mask = causal_memory_mask(9, 7, device=kernel_device)
    first, second = (_run(content, position, mask, probe, "triton") for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_what_the_kernel_covers(kernel_device: torch.device) -> None:
    scores = torch.zeros(1, 2, 4, 6, device=kernel_device)
    mask = causal_memory_mask(4, 2).to(kernel_device)
    assert covers(scores, scores, mask) and covers(scores, scores, None)
    assert not covers(scores.double(), scores.double(), mask)
    assert not covers(scores, scores.half(), mask)
    assert not covers(scores, scores, mask[None, None])  # a broadcast mask
    assert not covers(scores[..., :3], scores[..., :3], None)  # K < T
    long = torch.zeros(1, 1, 1, MAX_KEYS + 1, device=kernel_device)
    assert not covers(long, long, None)
    with pytest.raises(ValueError, match="does not cover"):
        relative_softmax(scores.double(), scores.double(), mask, 0.5, impl="triton")


def test_auto_times_both_on_cuda_and_keeps_the_faster(fresh_choices) -> None:
    """``auto_path`` with a fake timer: it times the kernel and the eager ops once per shape and
    keeps the faster; deterministic mode takes the kernel without timing."""
    content, position, _ = _operands(4, 2, torch.float32, torch.device("cpu"))
    mask = causal_memory_mask(4, 2)
    for faster in ("triton", "reference"):
        forget()
        timed: list[str] = []

        def timer(fn, faster=faster, timed=timed) -> float:
            timed.append(fn.args[0])
            return 1.0 if fn.args[0] == faster else 2.0

        assert auto_path(content, position, mask, 0.5, timer) == faster
        assert sorted(timed) == ["reference", "triton"]
    forget()
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert auto_path(content, position, mask, 0.5) == "triton"
    finally:
        torch.use_deterministic_algorithms(previous)
    assert chosen(src.kernels.relative_softmax.CHOICE) == {} and timings() == 0
