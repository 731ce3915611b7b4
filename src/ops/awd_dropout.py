"""The AWD-LSTM regularisers of recurrent language models (Merity et al., 2018, Sec. 4).

* :func:`locked_dropout`: variational dropout, one mask per sequence shared by all its time steps
  (Gal & Ghahramani, 2016; AWD-LSTM ``LockedDropout``).
* :func:`embedding_dropout`: dropout of whole rows of an embedding matrix, the survivors scaled by
  1 / (1 - p), so a dropped word is dropped at every position it occurs (AWD-LSTM
  ``embedded_dropout``).
* :func:`call_with_weight_drop`: DropConnect on named weights of a module (AWD-LSTM
  ``WeightDrop``) through :func:`torch.func.functional_call`: the module keeps its parameters
  (names, ``flatten_parameters``) and sees the dropped copies for one call, so the
  parameter-deleting hack of the original ``WeightDrop`` is not needed.

All three are the identity outside training and for p = 0, and never change their inputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

# cuDNN compacts an LSTM's weights into one buffer when they are not already; a dropped weight is a
# fresh tensor on every call, so the compaction it warns about is the expected cost of DropConnect
_NON_CONTIGUOUS_RNN_WEIGHTS = "RNN module weights are not part of single contiguous chunk"


def _check_probability(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")


def locked_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout with one mask per sequence, shared over the time axis (dim -2), scaled 1 / (1 - p).

    Shape:
        (..., T, C) -> (..., T, C); the mask is (..., 1, C).
    """
    _check_probability(p)
    if not training or p == 0.0:
        return x
    keep = 1.0 - p
    mask = x.new_empty(*x.shape[:-2], 1, x.shape[-1]).bernoulli_(keep).div_(keep)  # (..., 1, C)
    return x * mask


def embedding_dropout(weight: Tensor, p: float, training: bool) -> Tensor:
    """The embedding matrix with whole rows (words) zeroed with probability p, the others scaled.

    Look tokens up in the result (``F.embedding(tokens, embedding_dropout(w, p, training))``); a
    fresh mask per call, as AWD-LSTM draws one per batch.

    Shape:
        (V, D) -> (V, D)
    """
    _check_probability(p)
    if not training or p == 0.0:
        return weight
    keep = 1.0 - p
    mask = weight.new_empty(weight.shape[0], 1).bernoulli_(keep).div_(keep)  # (V, 1)
    return weight * mask


def call_with_weight_drop(module: nn.Module, names: Sequence[str], p: float, *args: Any) -> Any:
    """``module(*args)`` with DropConnect of probability p on the parameters ``names``.

    In training each named weight is replaced, for this call only, by ``F.dropout(weight, p)``:
    its entries zeroed independently with probability p, the rest scaled by 1 / (1 - p), a fresh
    mask per call. Gradients reach the module's own parameters through the mask. In eval mode
    (``module.training`` False) or for p = 0 this is ``module(*args)``.

    Args:
        module: the layer, e.g. an ``nn.LSTM`` (``"weight_hh_l0"``).
        names: dotted parameter names inside ``module``.
        p: the drop probability.
        args: the module's positional arguments.
    """
    _check_probability(p)
    if not module.training or p == 0.0 or not names:
        return module(*args)
    dropped = {name: F.dropout(module.get_parameter(name), p, training=True) for name in names}
    if torch.compiler.is_compiling():  # traced, an LSTM is unrolled: no cuDNN weight buffer
        return functional_call(module, dropped, args)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NON_CONTIGUOUS_RNN_WEIGHTS)
        return functional_call(module, dropped, args)
