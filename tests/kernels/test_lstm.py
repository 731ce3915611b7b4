"""``src.kernels.lstm.LSTM``: ``nn.LSTM`` with a float32 fallback under CPU autocast where the CPU
has no 16-bit LSTM kernel."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from src.kernels import lstm as lstm_module
from src.kernels.lstm import LSTM


def _pair() -> tuple[nn.LSTM, LSTM]:
    torch.manual_seed(0)
    plain = nn.LSTM(6, 5, batch_first=True)
    ours = LSTM(6, 5, batch_first=True)
    ours.load_state_dict(plain.state_dict())
    return plain, ours


def test_same_parameters_and_outputs_as_nn_lstm() -> None:
    plain, ours = _pair()
    assert list(plain.state_dict()) == list(ours.state_dict())
    x = torch.randn(3, 4, 6)
    for a, b in zip(plain(x), ours(x), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_falls_back_to_float32_where_the_cpu_has_no_16_bit_kernel(monkeypatch) -> None:
    plain, ours = _pair()
    monkeypatch.setattr(lstm_module, "cpu_has_low_precision_lstm", lambda dtype: False)
    x = torch.randn(3, 4, 6, requires_grad=True)
    hx = (torch.zeros(1, 3, 5), torch.zeros(1, 3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, c) = ours(x, hx)
    want, (want_h, want_c) = plain(x, hx)
    assert out.dtype == h.dtype == c.dtype == torch.float32
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    out.sum().backward()
    assert x.grad is not None and ours.weight_hh_l0.grad is not None


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_the_probe_answers_and_the_layer_runs_either_way(dtype: torch.dtype) -> None:
    lstm_module.cpu_has_low_precision_lstm.cache_clear()
    with pytest.warns(UserWarning) if not _native(dtype) else _nothing():
        supported = lstm_module.cpu_has_low_precision_lstm(dtype)
    assert supported == _native(dtype)
    _, ours = _pair()
    with torch.autocast("cpu", dtype=dtype):
        out, _ = ours(torch.randn(2, 3, 6))
    assert out.dtype == (dtype if supported else torch.float32) and torch.isfinite(out).all()


def _native(dtype: torch.dtype) -> bool:
    """Whether plain nn.LSTM runs under CPU autocast here (what the probe must find)."""
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            nn.LSTM(2, 2)(torch.zeros(1, 1, 2))
    except RuntimeError:
        return False
    return True


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


def test_traced_with_dropconnect_one_graph_that_equals_eager() -> None:
    """Traced (Dynamo's RNN tracing), the layer reads its weights by name: DropConnect's weight,
    a new tensor each call, does not retrace (nn.LSTM's cached weights would), and the outputs and
    gradients are eager's with the same dropped weight."""
    from src.ops.awd_dropout import call_with_weight_drop

    _, ours = _pair()
    x = torch.randn(3, 4, 6, requires_grad=True)
    hx = (torch.zeros(1, 3, 5), torch.zeros(1, 3, 5))

    def step(x: torch.Tensor) -> torch.Tensor:
        out, (h, c) = call_with_weight_drop(ours, ["weight_hh_l0"], 0.5, x, hx)
        return out.sum() + h.sum() + c.sum()

    def run(f: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        torch.manual_seed(1)  # the same DropConnect mask
        ours.zero_grad()
        x.grad = None
        loss = f(x)
        loss.backward()
        return [loss, x.grad, *(p.grad for p in ours.parameters())]

    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        traced = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)
        results = [run(step), run(traced)]
        with torch._dynamo.config.patch(error_on_recompile=True):
            results.append(run(traced))
    torch._dynamo.reset()
    for got in results[1:]:
        for a, b in zip(got, results[0], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
