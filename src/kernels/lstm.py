"""``nn.LSTM`` that never fails under CPU autocast for want of a 16-bit kernel.

On the CPU, ``nn.LSTM`` under ``torch.autocast("cpu", dtype=torch.bfloat16)`` runs oneDNN's 16-bit
LSTM, which exists only on CPUs with 16-bit instructions (AVX512-BF16 and newer); elsewhere, an
AVX2-only AMD EPYC for one, it raises "could not create a primitive descriptor for the LSTM forward
propagation primitive", so ``model.rnn=lstm trainer.precision=bf16-mixed`` crashed there. Whether
this CPU has the kernel is measured once per dtype (a 2-unit LSTM's forward); where it does not,
the layer runs in float32 inside autocast, as autocast does for the ops it cannot lower, and a
warning says so once. On CUDA (cuDNN has 16-bit LSTMs) and outside autocast nothing changes.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor, nn


@functools.cache
def cpu_has_low_precision_lstm(dtype: torch.dtype) -> bool:
    """Whether ``nn.LSTM`` runs under CPU autocast to ``dtype`` on this machine."""
    probe = nn.LSTM(2, 2, batch_first=True)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            probe(torch.zeros(1, 1, 2))
    except RuntimeError as error:
        warnings.warn(
            f"this CPU has no {dtype} LSTM kernel ({str(error).splitlines()[0][:120]}); LSTM "
            "layers run in float32 inside CPU autocast",
            stacklevel=2,
        )
        return False
    return True


class LSTM(nn.LSTM):
    """``nn.LSTM`` (same arguments, parameters and state dict) whose CPU autocast falls back to
    float32 where the CPU has no 16-bit LSTM kernel (module docstring).

    Shape:
        as ``nn.LSTM``; under the fallback the output and state are float32
    """

    def forward(  # type: ignore[override]
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if torch.compiler.is_compiling() and hx is not None and self.proj_size == 0:
            return self._traced_forward(input, hx)
        if (
            isinstance(input, Tensor)
            and input.is_cpu
            and torch.is_autocast_enabled("cpu")
            and not cpu_has_low_precision_lstm(torch.get_autocast_dtype("cpu"))
        ):
            with torch.autocast("cpu", enabled=False):
                state = None if hx is None else tuple(h.float() for h in hx)
                return super().forward(input.float(), state)
        return super().forward(input, hx)

    def _traced_forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``nn.LSTM``'s computation on the weights the module holds now. Traced (Dynamo's RNN
        tracing unrolls the time loop), reading them by name keeps ``nn.LSTM``'s cache of them
        (``_flat_weights``, checked by identity on every call) out of the graph's guards: a
        weight swapped in for one call (DropConnect) would otherwise retrace every call. The
        unrolled loop needs no 16-bit oneDNN kernel, so the CPU autocast fallback is not needed."""
        weights = [getattr(self, name) for name in self._flat_weights_names]
        output, h, c = torch._VF.lstm(  # type: ignore[attr-defined]
            input, hx, weights, self.bias, self.num_layers, float(self.dropout), self.training,
            self.bidirectional, self.batch_first,
        )  # fmt: skip
        return output, (h, c)
