"""The relative-attention softmax's CPU kernels (``src/kernels/relative_softmax/__init__.py``,
``src/kernels/relative_softmax/relative_softmax.cpp``) against the eager ops they replace
(:func:`relative_softmax_reference`: Transformer-XL's pad-and-reshape shift, add, scale, mask,
softmax) under autograd, and a float64 oracle.

Tolerances: the scores are the eager ops' bit for bit, so the probabilities differ only by the
exponential's rounding: within 4 float32 ulp (2^-21 relative) of the row's largest. For 16-bit
dtypes both paths normalise in float32 and round once, so they agree within one ulp of the dtype
at the largest value (2^-8 bfloat16, 2^-11 float16); the gradients, which the eager path rounds
after each of its three backward ops and the kernel once, within two.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import src.kernels.relative_softmax
from src.kernels.relative_softmax import rel_shift, relative_softmax, relative_softmax_reference
from src.ops.relative_position import causal_memory_mask, relative_attention
from tests.helpers import (
    KIND_FAULTS,
    SHAPE_FAULTS,
    assert_rejected,
    assert_within_ulps,
    recording_backend,
    require_cpu_kernels,
)

KERNEL = "RelativeSoftmaxCpuFunctionBackward"


@pytest.fixture
def kernels() -> None:
    require_cpu_kernels()


# (queries T, memory M, mask): K = M + T keys
CONFIGS = [
    (5, 3, "causal"),
    (7, 0, "causal"),  # no memory: K = T
    (1, 6, "causal"),  # one query
    (6, 4, "none"),  # every entry, the shifted-in rows' values included, carries gradient
    (6, 4, "random"),  # any (T, K) mask
    (33, 40, "causal"),  # rows longer than a vector, more rows than a task
]


def _mask(kind: str, qlen: int, mlen: int) -> Tensor | None:
    if kind == "causal":
        return causal_memory_mask(qlen, mlen)
    if kind == "random":
        mask = torch.rand(qlen, qlen + mlen, generator=torch.Generator().manual_seed(5)) < 0.3
        mask[:, 0] = False  # no row entirely masked (that gives NaN, tested below)
        return mask
    return None


def _operands(qlen: int, mlen: int, dtype: torch.dtype, seed: int = 0) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    shape = (2, 3, qlen, qlen + mlen)
    content, position, probe = (torch.randn(shape, generator=gen) * 2 for _ in range(3))
    return content.to(dtype), position.to(dtype), probe.to(dtype)


def _run(fn, content: Tensor, position: Tensor, mask: Tensor | None, probe: Tensor, scale=0.35):
    content = content.detach().requires_grad_()
    position = position.detach().requires_grad_()
    prob = fn(content, position, mask, scale)
    grads = torch.autograd.grad(prob, (content, position), probe)
    return (prob, *grads, type(prob.grad_fn).__name__)


@pytest.mark.parametrize(("qlen", "mlen", "mask_kind"), CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_the_eager_ops_and_a_float64_oracle(
    kernels: None, qlen: int, mlen: int, mask_kind: str, dtype: torch.dtype
) -> None:
    content, position, probe = _operands(qlen, mlen, dtype)
    mask = _mask(mask_kind, qlen, mlen)
    ours = _run(relative_softmax, content, position, mask, probe)
    eager = _run(relative_softmax_reference, content, position, mask, probe)
    oracle = _run(relative_softmax_reference, content.double(), position.double(), mask,
                  probe.double())  # fmt: skip
    assert ours[3] == KERNEL and eager[3] != KERNEL
    assert all(t.dtype == dtype and t.shape == content.shape for t in ours[:3])
    ulps = 4 if dtype == torch.float32 else 1
    assert_within_ulps(ours[0], eager[0], ulps, dtype)
    for got, want in zip(ours[1:3], eager[1:3], strict=True):
        assert_within_ulps(got, want, 2 * ulps, dtype)
    if dtype == torch.float32:  # and the float32 kernel is as close to float64 as the eager ops
        for got, want, exact in zip(ours[:3], eager[:3], oracle[:3], strict=True):
            ours_error, eager_error = ((t.double() - exact).abs().max() for t in (got, want))
            assert ours_error <= 2 * eager_error + 1e-7
    if mask is not None:  # masked entries: probability and score gradient exactly 0
        assert torch.all(ours[0][..., mask] == 0) and torch.all(ours[1][..., mask] == 0)


@pytest.mark.parametrize(("qlen", "mlen", "mask_kind"), CONFIGS, ids=str)
def test_position_gradient_is_the_adjoint_of_rel_shift(
    kernels: None, qlen: int, mlen: int, mask_kind: str
) -> None:
    """The kernel's position gradient is rel_shift's autograd transpose applied to its own score
    gradient, bit for bit (pure data movement): the zero pad and, without a mask, the entries
    shifted in from the next row included."""
    content, position, probe = _operands(qlen, mlen, torch.float32)
    _, grad_content, grad_position, _ = _run(
        relative_softmax, content, position, _mask(mask_kind, qlen, mlen), probe
    )
    x = position.clone().requires_grad_()
    (adjoint,) = torch.autograd.grad(rel_shift(x), x, grad_content)
    assert torch.equal(grad_position, adjoint)


def test_inference_call_equals_the_training_forward(kernels: None) -> None:
    content, position, _ = _operands(9, 4, torch.float32)
    mask = causal_memory_mask(9, 4)
    with torch.no_grad():
        inference = relative_softmax(content, position, mask, 0.2)
    training = relative_softmax(content.requires_grad_(), position, mask, 0.2)
    assert torch.equal(inference, training)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_special_rows(kernels: None, dtype: torch.dtype) -> None:
    """Huge scores neither overflow nor lose the maximum; a row masked entirely is NaN, as the
    eager softmax of -inf everywhere; its gradient, masked, is 0."""
    qlen, mlen = 4, 4
    content, position, probe = _operands(qlen, mlen, dtype)
    content[0, 0, 1, 2] = 3e4  # one score far above the rest: a one-hot row
    content[0, 1, 2, :3] = -3e4  # far below the rest: probabilities that underflow to 0
    mask = causal_memory_mask(qlen, mlen)
    mask[3] = True
    ours = _run(relative_softmax, content, position, mask, probe)
    eager = _run(relative_softmax_reference, content, position, mask, probe)
    assert torch.isnan(ours[0][..., 3, :]).all() and torch.isnan(eager[0][..., 3, :]).all()
    assert torch.all(ours[1][..., 3, :] == 0)
    finite = ~torch.isnan(eager[0])
    assert torch.equal(ours[0][0, 0, 1], eager[0][0, 0, 1])  # the one-hot row, exactly
    assert ours[0][0, 0, 1, 2] == 1
    assert_within_ulps(ours[0][finite], eager[0][finite], 4 if dtype == torch.float32 else 1, dtype)
    assert torch.all(ours[0][0, 1, 2, :3] == 0)


def test_result_does_not_depend_on_the_thread_count(kernels: None) -> None:
    content, position, probe = _operands(33, 40, torch.float32)
    mask = causal_memory_mask(33, 40)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run(relative_softmax, content, position, mask, probe)
        torch.set_num_threads(max(2, threads))
        many = _run(relative_softmax, content, position, mask, probe)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one[:3], many[:3], strict=True))


@pytest.mark.parametrize(
    "case", ["float64", "broadcast_mask", "position_dtype", "keys_fewer_than_queries"]
)
def test_eager_ops_run_where_the_kernel_does_not_apply(kernels: None, case: str) -> None:
    content, position, probe = _operands(4, 3, torch.float32)
    mask = causal_memory_mask(4, 3)
    if case == "float64":
        content, position, probe = content.double(), position.double(), probe.double()
    elif case == "broadcast_mask":
        mask = mask[None, None]
    elif case == "position_dtype":
        position = position.bfloat16()
    else:
        content, position, probe = (t[..., :3] for t in (content, position, probe))
        mask = None
    if case == "keys_fewer_than_queries":
        with pytest.raises(ValueError, match="klen >= qlen"):
            relative_softmax(content, position, mask, 0.5)
        return
    ours = _run(relative_softmax, content, position, mask, probe)
    eager = _run(relative_softmax_reference, content, position, mask, probe)
    assert ours[3] != KERNEL
    assert all(torch.equal(a, b) for a, b in zip(ours[:3], eager[:3], strict=True))


def test_eager_ops_run_without_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(src.kernels.relative_softmax, "cpu_kernels_loaded", lambda: False)
    content, position, probe = _operands(4, 3, torch.float32)
    ours = _run(relative_softmax, content, position, causal_memory_mask(4, 3), probe)
    assert ours[3] == "SoftmaxBackward0"


def test_attention_trains_through_the_kernel(
    kernels: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transformer-XL's and Group-Transformer's attention (:func:`relative_attention`, eager path)
    computes its probabilities by the kernel on the CPU, and matches the eager ops. With attention
    dropout in training, where the one-node CPU attention (``test_relative_attention_cpu.py``)
    leaves the eager path to run."""
    gen = torch.Generator().manual_seed(1)
    B, H, T, M, d = 2, 2, 5, 3, 4
    q = torch.randn(B, H, T, d, generator=gen, requires_grad=True)
    k, v = (torch.randn(B, H, T + M, d, generator=gen, requires_grad=True) for _ in range(2))
    rk = torch.randn(H, T + M, d, generator=gen, requires_grad=True)
    u, w = (torch.randn(H, d, generator=gen, requires_grad=True) for _ in range(2))
    inputs = (q, k, v, rk, u, w)
    seen: list[str] = []

    def attend(softmax) -> tuple[Tensor, ...]:
        def spy(*args, impl: str) -> Tensor:
            assert impl == "auto"
            prob = softmax(*args)
            seen.append(type(prob.grad_fn).__name__)
            return prob

        monkeypatch.setattr(src.kernels.relative_attention, "relative_softmax", spy)
        torch.manual_seed(0)  # the same dropout draws for both
        out = relative_attention(
            *inputs, mask=causal_memory_mask(T, M), path="eager", dropatt=0.2, training=True
        )
        return (out, *torch.autograd.grad(out.square().sum(), inputs))

    ours, eager = attend(relative_softmax), attend(relative_softmax_reference)
    assert seen == [KERNEL, "SoftmaxBackward0"]
    for got, want in zip(ours, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# each kernel's score operands (the in-place ones' outputs too): name -> argument index, the one
# checked first (whose dtype the others must share) first
OPERANDS = {
    "relative_softmax_forward": {"content": 0, "position": 1},
    "relative_softmax_backward": {"prob": 1, "grad_prob": 0},
    "relative_softmax_forward_out": {"content": 0, "position": 1, "prob": 4},
    "relative_softmax_backward_out": {"grad_prob": 0, "prob": 1, "grad_content": 4,
                                      "grad_position": 5},
}  # fmt: skip


def _kernel_args(kernel: str) -> list:
    """Valid arguments of ``kernel``: two (2, 3, 5) score operands, the causal mask, a scale and,
    for the in-place kernels, their outputs."""
    torch.manual_seed(0)
    args = [torch.randn(2, 3, 5), torch.randn(2, 3, 5), causal_memory_mask(3, 2), 0.5]
    outputs = {"relative_softmax_forward_out": 1, "relative_softmax_backward_out": 2}
    return args + [torch.empty(2, 3, 5) for _ in range(outputs.get(kernel, 0))]


@pytest.mark.parametrize(
    ("kernel", "name", "fault"),
    [(k, n, f) for k, names in OPERANDS.items() for n in names
     for f in (*SHAPE_FAULTS, *KIND_FAULTS)
     # the first-checked operand may be 16-bit (the other must then follow it)
     if (n, f) not in (("content", "bfloat16"), ("prob", "bfloat16"))],
)  # fmt: skip
def test_kernel_rejects_a_faulty_score_operand(
    kernels: None, kernel: str, name: str, fault: str
) -> None:
    # the score operands fix each other's every size
    assert_rejected(kernel, _kernel_args(kernel), name, OPERANDS[kernel][name], fault, (0, 1, 2))


@pytest.mark.parametrize("kernel", ["relative_softmax_forward", "relative_softmax_backward"])
@pytest.mark.parametrize("fault", [*SHAPE_FAULTS, "non_contiguous", "sparse", "meta"])
def test_kernel_rejects_a_faulty_mask(kernels: None, kernel: str, fault: str) -> None:
    assert_rejected(kernel, _kernel_args(kernel), "mask", 2, fault, (0, 1))


@pytest.mark.parametrize("kernel", ["relative_softmax_forward", "relative_softmax_backward"])
def test_kernel_rejects_a_mask_of_another_dtype(kernels: None, kernel: str) -> None:
    args = _kernel_args(kernel)
    args[2] = args[2].float()
    with pytest.raises(RuntimeError, match=f"{kernel}: mask must be bool, got Float"):
        getattr(torch.ops.lightnets_cpu, kernel)(*args)


@pytest.mark.parametrize(
    ("kernel", "out", "operand"),
    [("relative_softmax_forward_out", 4, 0), ("relative_softmax_forward_out", 4, 1),
     ("relative_softmax_backward_out", 4, 0), ("relative_softmax_backward_out", 4, 1),
     ("relative_softmax_backward_out", 4, 5), ("relative_softmax_backward_out", 5, 0),
     ("relative_softmax_backward_out", 5, 1)],
)  # fmt: skip
def test_in_place_kernels_reject_an_output_sharing_memory(
    kernels: None, kernel: str, out: int, operand: int
) -> None:
    args = _kernel_args(kernel)
    names = {i: n for n, i in OPERANDS[kernel].items()}
    # an overlapping view: the operand's storage, shifted by one element
    wide = torch.randn(args[operand].numel() + 1)
    args[operand] = wide[: args[operand].numel()].view(2, 3, 5)
    args[out] = wide[1:].view(2, 3, 5)
    with pytest.raises(
        RuntimeError, match=f"{kernel}: {names[out]} shares memory with {names[operand]}"
    ):
        getattr(torch.ops.lightnets_cpu, kernel)(*args)


def test_in_place_kernels_equal_the_allocating_ones(kernels: None) -> None:
    content, position = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    mask = causal_memory_mask(3, 2)
    prob = torch.empty(2, 3, 5)
    torch.ops.lightnets_cpu.relative_softmax_forward_out(content, position, mask, 0.5, prob)
    assert torch.equal(
        prob, torch.ops.lightnets_cpu.relative_softmax_forward(content, position, mask, 0.5)
    )
    grad = torch.randn(2, 3, 5)
    grads = torch.full((2, 2, 3, 5), float("nan"))
    torch.ops.lightnets_cpu.relative_softmax_backward_out(grad, prob, mask, 0.5, grads[0], grads[1])
    want = torch.ops.lightnets_cpu.relative_softmax_backward(grad, prob, mask, 0.5)
    assert torch.equal(grads[0], want[0]) and torch.equal(grads[1], want[1])


def test_compiled_step_traces_the_kernels_and_matches_eager_bitwise(kernels: None) -> None:
    backend, graphs = recording_backend()
    torch._dynamo.reset()
    content, position, probe = _operands(6, 4, torch.float32)
    mask = causal_memory_mask(6, 4)
    eager = _run(relative_softmax, content, position, mask, probe)
    compiled_fn = torch.compile(relative_softmax, backend=backend, fullgraph=True)
    compiled = _run(compiled_fn, content, position, mask, probe)
    torch._dynamo.reset()
    assert len(graphs["forward"]) == len(graphs["backward"]) == 1
    assert "lightnets.relative_softmax_forward" in graphs["forward"][0]
    assert "lightnets.relative_softmax_backward" in graphs["backward"][0]
    assert all(torch.equal(a, b) for a, b in zip(eager[:3], compiled[:3], strict=True))
