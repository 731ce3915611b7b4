"""Transformer-XL relative attention through ``F.scaled_dot_product_attention`` ("sdpa") against the
eager ops, and the per-shape choice between them. On a CPU the fused attention is PyTorch's own
C++ kernel; on CUDA the memory-efficient kernel, with TF32 off (the eager float32 path is the
yardstick): float32 within 1e-5 (2e-5 on CUDA) where the two differ in summation order only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor

from src.kernels.relative_attention import attention_path
from src.ops.group_attention import GroupAttention
from src.ops.relative_multihead_attention import RelativeMultiHeadAttention
from src.ops.relative_position import causal_memory_mask, relative_attention
from tests.helpers import tf32

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = 2e-5 if CUDA else 1e-5


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    with tf32(False):
        yield


def _operands(batch: int, heads: int, qlen: int, mlen: int, d_head: int) -> list[Tensor]:
    gen = torch.Generator().manual_seed(0)
    klen = qlen + mlen
    shapes = [(batch, heads, qlen, d_head), (batch, heads, klen, d_head),
              (batch, heads, klen, d_head), (heads, klen, d_head), (heads, d_head),
              (heads, d_head)]  # fmt: skip
    return [torch.randn(s, generator=gen).to(DEVICE).requires_grad_() for s in shapes]


def _run(path: str, operands: list[Tensor], mask: Tensor | None) -> list[Tensor]:
    out = relative_attention(*operands, mask=mask, path=path)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    return [out, *torch.autograd.grad(out, operands, probe)]


@pytest.mark.parametrize(("qlen", "mlen"), [(7, 5), (6, 0), (3, 9)], ids=str)
def test_sdpa_matches_eager(qlen: int, mlen: int) -> None:
    operands = _operands(2, 4, qlen, mlen, 8)
    mask = causal_memory_mask(qlen, mlen, device=DEVICE)
    got, want = _run("sdpa", operands, mask), _run("eager", operands, mask)
    names = ["out", "q", "k", "v", "rk", "r_w_bias", "r_r_bias"]
    for name, a, e in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=TOL, atol=TOL, msg=name)


def test_sdpa_under_bfloat16_autocast() -> None:
    """Both paths under bf16 autocast against the float32 eager output: the score products round
    q, k and the distance keys to bfloat16 (u = 2^-8) and the value product the probabilities and
    v, so the output is within a few u of float32 (max-norm); the bound 8u is not reached by
    either (observed: 1.6u eager, 1.3u fused)."""
    operands = _operands(2, 4, 6, 4, 16)
    mask = causal_memory_mask(6, 4, device=DEVICE)
    want = relative_attention(*operands, mask=mask, path="eager").detach()
    for path in ("eager", "sdpa"):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = relative_attention(*operands, mask=mask, path=path)
        assert out.dtype == torch.bfloat16
        error = float((out.detach().float() - want).abs().max() / want.abs().max())
        assert error < 8 * 2.0**-8, (path, error)


def test_sdpa_dropout_keeps_shape_and_scale() -> None:
    """With attention dropout the fused path draws its own mask; the output stays finite and, in
    expectation, the same map (inverted dropout): averaged over many draws it approaches eval."""
    operands = [t.detach() for t in _operands(1, 2, 5, 3, 8)]
    mask = causal_memory_mask(5, 3, device=DEVICE)
    plain = relative_attention(*operands, mask=mask, path="sdpa")
    runs = torch.stack(
        [
            relative_attention(*operands, mask=mask, dropatt=0.3, training=True, path="sdpa")
            for _ in range(400)
        ]
    )
    assert torch.isfinite(runs).all() and runs.shape[1:] == plain.shape
    assert float((runs.mean(0) - plain).abs().max()) < 0.25 * float(plain.abs().max())
    assert float((runs[0] - plain).abs().max()) > 1e-3  # it did drop something


def test_auto_is_eager_on_the_cpu_and_timed_once_per_shape(fresh_choices) -> None:
    operands = [t.detach() for t in _operands(2, 2, 4, 4, 8)]
    q, k, v, rk, u, w = operands
    biased = (q + u.unsqueeze(-2), q + w.unsqueeze(-2), k, v, rk)  # the queries with u and v
    mask = causal_memory_mask(4, 4, device=DEVICE)
    if not CUDA:
        assert attention_path(*biased, mask, 8**-0.5, 0.0, False) == "eager"
    timed: list[str] = []

    def timer(fn: Callable[[], object]) -> float:
        fn()
        timed.append("x")
        return 2.0 if len(timed) == 1 else 1.0  # "eager" first, then "sdpa" (faster)

    assert attention_path(*biased, mask, 8**-0.5, 0.0, False, timer) == "sdpa"
    assert attention_path(*biased, mask, 8**-0.5, 0.0, False, timer) == "sdpa"
    assert len(timed) == 2
    with pytest.raises(ValueError, match="path must be one of"):
        relative_attention(*operands, mask=mask, path="flash")


@pytest.mark.parametrize("kind", ["group", "txl"])
def test_attention_modules_take_either_path(kind: str) -> None:
    torch.manual_seed(0)
    if kind == "group":
        layer = GroupAttention(32, 4, 2).to(DEVICE)
    else:
        layer = RelativeMultiHeadAttention(32, 4, pre_norm=True).to(DEVICE)
    h, memory = torch.randn(2, 5, 32, device=DEVICE), torch.randn(2, 3, 32, device=DEVICE)
    r = torch.randn(8, 32, device=DEVICE)
    biases = torch.randn(4, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE)
    outs = []
    for path in ("eager", "sdpa"):
        layer.attention = path
        outs.append(layer(h, r, *biases, memory=memory))
    torch.testing.assert_close(outs[1], outs[0], rtol=TOL, atol=TOL)
