"""The AWD word language models' recurrent state across batches (thesis Sec. 4.4; AWD-LSTM's
``repackage_hidden``).

Row b of consecutive batches continues one stream, so the state a batch ends with is where the
next one starts; it is detached, so back-propagation stops at the batch boundary (truncated
BPTT). Training and dynamic evaluation carry it alike.
"""

from __future__ import annotations

from torch import nn

from src.models.awd_lm import Hidden


def detach_hidden(hidden: Hidden) -> Hidden:
    """The state without its history, so the next batch back-propagates no further."""
    return [tuple(t.detach() for t in layer) for layer in hidden]  # type: ignore[misc]


def carried_hidden(net: nn.Module, hidden: Hidden | None, batch_size: int) -> Hidden:
    """``hidden`` when it has ``batch_size`` rows, else zeros (``net.init_hidden``): the first
    batch of a pass, or a last batch with fewer rows.

    Shape:
        hidden: per layer (h, c), each (1, B, M_l)
    """
    if hidden is None or hidden[0][0].shape[1] != batch_size:
        return net.init_hidden(batch_size)
    return hidden
