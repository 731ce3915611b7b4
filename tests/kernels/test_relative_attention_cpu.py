"""Relative attention on the CPU as one autograd node
(``src/kernels/relative_attention/one_node_cpu.py``) and its score buffers
(``src/kernels/cpu/scratch.py``); the in-place softmax kernels it calls are tested with the others
in ``test_relative_softmax.py``.

The node runs the eager path's ops (:func:`eager_relative_attention` with the softmax kernel) in
the same order and dtype, so the output and all six gradients must equal that path's bit for bit.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import Tensor

import src.kernels.relative_attention.one_node_cpu
from src.kernels.cpu.scratch import release_scratch, scratch
from src.kernels.relative_attention import eager_relative_attention
from src.ops.relative_position import causal_memory_mask, relative_attention
from tests.helpers import require_cpu_kernels

NODE = "RelativeAttentionCpuFunctionBackward"
# (B, H, T queries, M memory, d_head)
SHAPES = [(1, 2, 5, 3, 4), (3, 2, 7, 0, 8), (2, 3, 1, 6, 4), (2, 8, 40, 24, 32)]


@pytest.fixture
def kernels() -> None:
    require_cpu_kernels()


def _inputs(batch: int, heads: int, qlen: int, mlen: int, d: int, seed: int = 0) -> list[Tensor]:
    """q, k, v, rk, r_w_bias, r_r_bias, float32, requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    klen = qlen + mlen
    shapes = [(batch, heads, qlen, d), (batch, heads, klen, d), (batch, heads, klen, d),
              (heads, klen, d), (heads, d), (heads, d)]  # fmt: skip
    return [torch.randn(s, generator=gen).requires_grad_() for s in shapes]


def _eager(q, k, v, rk, u, w, *, mask, dropatt=0.0, training=False) -> Tensor:
    scale = q.shape[-1] ** -0.5
    return eager_relative_attention(
        q + u.unsqueeze(-2), q + w.unsqueeze(-2), k, v, rk, mask, scale,
        dropatt=dropatt, training=training,
    )  # fmt: skip


def _run(fn, inputs: list[Tensor], mask: Tensor | None, dtype: torch.dtype | None, **kw):
    """(output, six gradients, the output's node); ``dtype``: the inputs' dtype, or None for
    float32 inputs under bfloat16 autocast."""
    if dtype is not None:
        inputs = [t.detach().to(dtype).requires_grad_() for t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is None):
        out = fn(*inputs, mask=mask, **kw)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out.dtype)
    return out, *torch.autograd.grad(out, inputs, probe), type(out.grad_fn).__name__


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("masked", [True, False], ids=["causal", "unmasked"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, None], ids=str
)  # None: bfloat16 autocast
def test_equals_the_eager_path(
    kernels: None, shape: tuple, masked: bool, dtype: torch.dtype | None
) -> None:
    inputs = _inputs(*shape)
    batch, heads, qlen, mlen, d = shape
    mask = causal_memory_mask(qlen, mlen) if masked else None
    ours = _run(relative_attention, inputs, mask, dtype)
    eager = _run(_eager, inputs, mask, dtype)
    assert ours[-1] == NODE and eager[-1] != NODE
    assert ours[0].shape == (batch, heads, qlen, d)
    computed_in = dtype or torch.bfloat16  # None: float32 inputs, bf16 autocast
    for got, want in zip(ours[:-1], eager[:-1], strict=True):
        assert got.dtype == want.dtype
        if computed_in == torch.float32:
            assert torch.equal(got, want)
        else:
            # 16-bit: ATen and oneDNN pick their 16-bit matmul kernels by the CPU's instruction set,
            # and the node's products into its scratch buffers may get another than eager's (an
            # AVX2 AMD EPYC put them a last bit apart): the same to two units in the last place
            eps = torch.finfo(computed_in).eps
            torch.testing.assert_close(
                got, want, rtol=2 * eps, atol=2 * eps * float(want.abs().max())
            )


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_inference_call_equals_the_training_forward(kernels: None, context) -> None:
    inputs = _inputs(2, 2, 6, 4, 8)
    mask = causal_memory_mask(6, 4)
    trained = relative_attention(*inputs, mask=mask)
    with context():
        inferred = relative_attention(*inputs, mask=mask)
    assert trained.grad_fn is not None and inferred.grad_fn is None
    assert torch.equal(trained, inferred)


def test_interleaved_steps_keep_their_own_probabilities(kernels: None) -> None:
    """Scratch holds only what dies within a call: two forwards, then their backwards in reverse
    order (as the layers of a model run), give each its own gradients."""
    mask = causal_memory_mask(5, 3)
    first, second = _inputs(2, 2, 5, 3, 4, seed=1), _inputs(2, 2, 5, 3, 4, seed=2)
    alone = [
        torch.autograd.grad(relative_attention(*x, mask=mask).sum(), x) for x in (first, second)
    ]
    out_first = relative_attention(*first, mask=mask)
    out_second = relative_attention(*second, mask=mask)
    grads_second = torch.autograd.grad(out_second.sum(), second)
    grads_first = torch.autograd.grad(out_first.sum(), first)
    for got, want in zip((*grads_first, *grads_second), (*alone[0], *alone[1]), strict=True):
        assert torch.equal(got, want)


def test_threads_take_their_own_scratch(kernels: None) -> None:
    inputs = _inputs(2, 2, 6, 4, 8)
    mask = causal_memory_mask(6, 4)
    here = torch.autograd.grad(relative_attention(*inputs, mask=mask).sum(), inputs)
    results: dict[str, object] = {}

    def work() -> None:
        out = relative_attention(*inputs, mask=mask)
        results["grads"] = torch.autograd.grad(out.sum(), inputs)
        results["scores"] = scratch("scores", (1,), torch.float32).data_ptr()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert all(torch.equal(a, b) for a, b in zip(here, results["grads"], strict=True))
    assert results["scores"] != scratch("scores", (1,), torch.float32).data_ptr()


def test_eager_path_runs_where_the_node_does_not_apply(
    kernels: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attention dropout in training, float64, a mask of another shape, ``impl="reference"``,
    compiling: the eager ops, with the same result."""
    inputs = _inputs(2, 2, 5, 3, 4)
    mask = causal_memory_mask(5, 3)

    def node(**kw) -> str:
        return type(relative_attention(*inputs, **kw).grad_fn).__name__

    assert node(mask=mask) == NODE
    assert node(mask=mask, dropatt=0.1, training=True) != NODE
    assert node(mask=mask, dropatt=0.1, training=False) == NODE
    assert node(mask=mask, impl="reference") != NODE
    assert node(mask=mask[None, None].expand(2, 2, 5, 8)) != NODE
    inputs = [t.detach().double().requires_grad_() for t in inputs]
    assert node(mask=mask) != NODE
    inputs = [t.detach().float().requires_grad_() for t in inputs]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert node(mask=mask) != NODE


def test_dropout_path_matches_the_eager_ops(kernels: None) -> None:
    inputs = _inputs(2, 2, 5, 3, 4)
    mask = causal_memory_mask(5, 3)
    results = []
    for fn in (relative_attention, _eager):
        torch.manual_seed(3)
        results.append(_run(fn, inputs, mask, torch.float32, dropatt=0.3, training=True))
    for got, want in zip(results[0][:-1], results[1][:-1], strict=True):
        assert torch.equal(got, want)


def test_only_the_requested_gradients_are_formed(kernels: None) -> None:
    q, k, v, rk, u, w = _inputs(2, 2, 5, 3, 4)
    for t in (k, rk, w):
        t.requires_grad_(False)
    mask = causal_memory_mask(5, 3)
    out = relative_attention(q, k, v, rk, u, w, mask=mask)
    assert type(out.grad_fn).__name__ == NODE
    got = torch.autograd.grad(out.sum(), (q, v, u))
    want = torch.autograd.grad(_eager(q, k, v, rk, u, w, mask=mask).sum(), (q, v, u))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_scratch_grows_and_is_reused() -> None:
    release_scratch()
    small = scratch("test", (4, 8), torch.float32)
    assert small.shape == (4, 8) and small.dtype == torch.float32 and small.is_contiguous()
    same = scratch("test", (2, 3), torch.bfloat16)  # a smaller view of the same bytes
    assert same.data_ptr() == small.data_ptr()
    other = scratch("other", (4, 8), torch.float32)  # roles do not share
    assert other.data_ptr() != small.data_ptr()
    grown = scratch("test", (64,), torch.float32)  # larger: a new buffer, kept for what follows
    assert grown.numel() == 64
    assert scratch("test", (4, 8), torch.float32).data_ptr() == grown.data_ptr()
    grown.fill_(1.0)
    release_scratch()  # the next view is of a new buffer: the released one's views keep theirs
    scratch("test", (64,), torch.float32).fill_(2.0)
    assert torch.equal(grown, torch.ones(64))


def test_kernels_unbuilt_take_the_eager_path(monkeypatch: pytest.MonkeyPatch) -> None:
    one_node = src.kernels.relative_attention.one_node_cpu
    monkeypatch.setattr(one_node, "cpu_kernels_loaded", lambda: False)
    inputs = _inputs(1, 2, 4, 2, 4)
    out = relative_attention(*inputs, mask=causal_memory_mask(4, 2))
    assert type(out.grad_fn).__name__ != NODE


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_recomputes_into_scratch_safely(
    kernels: None, reentrant: bool
) -> None:
    """Recomputation runs the node's forward again while other nodes' backwards are pending; the
    gradients equal a plain run's."""
    mask = causal_memory_mask(5, 3)
    inputs = _inputs(2, 2, 5, 3, 4)

    def two_layers(*x: Tensor) -> Tensor:
        q, k, v, rk, u, w = x
        hidden = relative_attention(q, k, v, rk, u, w, mask=mask)
        return relative_attention(hidden.tanh(), k, v, rk, u, w, mask=mask)

    def grads(run) -> list[Tensor]:
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        run(*leaves).square().sum().backward()  # reentrant checkpointing refuses autograd.grad
        return [t.grad for t in leaves]

    plain = grads(two_layers)
    again = grads(
        lambda *x: torch.utils.checkpoint.checkpoint(two_layers, *x, use_reentrant=reentrant)
    )
    assert all(torch.equal(a, b) for a, b in zip(plain, again, strict=True))
