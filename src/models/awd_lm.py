"""The AWD-LSTM-style word language model of the PRU (Mehta's thesis, Ch. 4, Sec. 4.4; "AWD-PRU").

tokens -> embedding (E, with embedding dropout) -> input dropout -> L one-layer recurrent layers
(PRU or LSTM; dropout between them) -> output dropout -> decoder tied to the embedding (with a
bias). Layer sizes follow the official ``RNNModel`` (github.com/sacmehta/PRU, ``model.py``):
E -> M, M -> M, ..., M -> E, the last layer sized to the embedding so the decoder can be tied.
Parameter counts equal the official ones, e.g. PRU g = 4, K = 2, M = 1400 with PTB's
V = 10,000: 18,895,600; LSTM M = 1000: 19,869,200 (thesis Table 4.1: 19 M and 20 M).

Regularisers (AWD-LSTM, Merity et al., 2018; the thesis uses "the same dropout techniques with
the same dropout values as AWD-LSTM" and names no more): embedding dropout of whole rows,
dropout on the embedding output, between layers and on the last layer's output (locked, one
mask per sequence, when ``variational``; else plain element-wise dropout, the official PRU
repo's ``nn.Dropout`` at the same places, the thesis's "standard dropout" rows), and DropConnect
on the recurrent hidden-to-hidden weight (``weight_hh_l0`` of an LSTM). Where the sources are
silent or differ:

* The thesis does not say which PRU weight is weight-dropped. Here it is the context GLT's weight
  (``cells.0.context.glt.weight``, the h_{t-1} -> gates path, the analogue of ``weight_hh``);
  the pyramid (the input path) is not dropped.
* The official PRU repo has one dropout probability for every position (``--dropout 0.4``; the
  thesis says 0.5) and no embedding dropout or weight drop; with ``variational=False``,
  ``dropout_embedding=0`` and ``weight_drop=0`` and one probability everywhere this model is that
  standard-dropout model.
* Initialisation is the official one: embedding U(-0.1, 0.1), decoder bias 0, PRU weights
  orthogonal and biases 0 (``PRUTransforms.py``), LSTMs PyTorch's default.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.lstm import LSTM
from src.ops.awd_dropout import call_with_weight_drop, embedding_dropout, locked_dropout
from src.ops.pru import PRU, GroupedContextTransform
from src.ops.pyramidal import PyramidalTransform

RNN_TYPES = ("pru", "lstm")
# the recurrent (hidden-to-hidden) weight that DropConnect drops, per layer type
WEIGHT_DROP_TARGETS = {"lstm": ("weight_hh_l0",), "pru": ("cells.0.context.glt.weight",)}
EMBEDDING_INIT_RANGE = 0.1  # official RNNModel.init_weights

Hidden = list[tuple[Tensor, Tensor]]


class AWDOutput(NamedTuple):
    """What :meth:`AWDLanguageModel.forward` returns.

    Shape:
        logits (B, T, V); hidden: per layer (h, c), each (1, B, M_l); raw_output (B, T, E), the
        last layer's output before the output dropout; dropped_output (B, T, E), after it (E is
        the hidden size instead when the weights are not tied).
    """

    logits: Tensor
    hidden: Hidden
    raw_output: Tensor
    dropped_output: Tensor


class AWDLanguageModel(nn.Module):
    """Word language model with PRU or LSTM layers and the AWD-LSTM regularisers.

    Args:
        num_embeddings: V, the vocabulary size.
        rnn: ``"pru"`` (this project's :class:`src.ops.pru.PRU`, one layer each) or ``"lstm"``
            (``nn.LSTM``, one layer each, cuDNN on GPU; ``groups``, ``levels`` and
            ``subsampling`` are unused, as the official code forces g = K = 1).
        embedding_dim: E.
        hidden_size: M of every layer but the last (whose output is E when tied).
        num_layers: L.
        groups: g of each PRU context GLT.
        levels: K of each PRU pyramidal transformation.
        subsampling: the pyramids' sub-sampling (see :class:`PyramidalTransform`).
        pyramid_split: the pyramids' output split, ``"official"`` (code: 3M/4 + M/4 at K = 2) or
            ``"paper"`` (thesis Eq. 4.2: M/K per level).
        residual: the pyramids' residual; None (official) in the layers where N == M, False in
            none (thesis Table 4.2 R6).
        dropout: on the last layer's output (AWD ``dropout``).
        dropout_hidden: on the outputs of the other layers (AWD ``dropouth``).
        dropout_input: on the embedding output (AWD ``dropouti``).
        dropout_embedding: of whole embedding rows (AWD ``dropoute``).
        weight_drop: DropConnect on each layer's hidden-to-hidden weight (AWD ``wdrop``).
        variational: locked dropout masks (one per sequence); False: element-wise dropout.
        tie_weights: the decoder shares the embedding matrix (and the last layer outputs E).

    Shape:
        tokens (B, T) int64; hidden as :meth:`init_hidden` or None (zeros) -> :class:`AWDOutput`.
    """

    def __init__(
        self,
        num_embeddings: int,
        *,
        rnn: str = "pru",
        embedding_dim: int = 400,
        hidden_size: int = 1150,
        num_layers: int = 3,
        groups: int = 1,
        levels: int = 2,
        subsampling: str = "avg",
        pyramid_split: str = "official",
        residual: bool | None = None,
        dropout: float = 0.4,
        dropout_hidden: float = 0.3,
        dropout_input: float = 0.65,
        dropout_embedding: float = 0.1,
        weight_drop: float = 0.5,
        variational: bool = True,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        if rnn not in RNN_TYPES:
            raise ValueError(f"rnn must be one of {RNN_TYPES}, got {rnn!r}")
        if num_embeddings < 1 or embedding_dim < 1 or hidden_size < 1 or num_layers < 1:
            raise ValueError(
                f"num_embeddings ({num_embeddings}), embedding_dim ({embedding_dim}), hidden_size "
                f"({hidden_size}) and num_layers ({num_layers}) must be positive"
            )
        for name, p in (
            ("dropout", dropout),
            ("dropout_hidden", dropout_hidden),
            ("dropout_input", dropout_input),
            ("dropout_embedding", dropout_embedding),
            ("weight_drop", weight_drop),
        ):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        self.rnn = rnn
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.dropout = dropout
        self.dropout_hidden = dropout_hidden
        self.dropout_input = dropout_input
        self.dropout_embedding = dropout_embedding
        self.weight_drop = weight_drop
        self.variational = variational
        self.tie_weights = tie_weights
        last = embedding_dim if tie_weights else hidden_size
        # layer l: (input width, output width) = (E or M, M), the last one's output E when tied
        self.layer_sizes = tuple(
            (
                embedding_dim if layer == 0 else hidden_size,
                last if layer == num_layers - 1 else hidden_size,
            )
            for layer in range(num_layers)
        )
        self.embedding = nn.Embedding(num_embeddings, embedding_dim)
        if rnn == "lstm":
            # nn.LSTM that runs in float32 under CPU autocast where the CPU lacks a 16-bit kernel
            layers = [LSTM(n, m, 1, batch_first=True) for n, m in self.layer_sizes]
        else:
            layers = [
                PRU(
                    n,
                    m,
                    groups=groups,
                    levels=levels,
                    subsampling=subsampling,
                    batch_first=True,
                    split=pyramid_split,
                    residual=None if residual is None or n != m else residual,
                )
                for n, m in self.layer_sizes
            ]
        self.rnns = nn.ModuleList(layers)
        self.decoder = nn.Linear(last, num_embeddings)
        if tie_weights:
            self.decoder.weight = self.embedding.weight
        self.init_weights()

    def init_weights(self) -> None:
        """The official initialisation: ``RNNModel.init_weights`` (embedding and decoder
        U(-0.1, 0.1), decoder bias 0) and ``PRUTransforms.reset_parameters`` (orthogonal weights,
        zero biases in every pyramid level and context GLT, the 3-D GLT weight flattened to
        (g, M/g * 4M/g) as ``init.orthogonal`` does); LSTMs keep PyTorch's default."""
        nn.init.uniform_(self.embedding.weight, -EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE)
        if not self.tie_weights:
            nn.init.uniform_(self.decoder.weight, -EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE)
        nn.init.zeros_(self.decoder.bias)
        for module in self.rnns.modules():
            if isinstance(module, PyramidalTransform):
                linears = list(module.transforms)
            elif isinstance(module, GroupedContextTransform):
                linears = [module.glt]
            else:
                continue
            for linear in linears:
                nn.init.orthogonal_(linear.weight)
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)

    def init_hidden(self, batch_size: int) -> Hidden:
        """Zero states, one (h, c) per layer, each (1, B, M_l), on the model's device and dtype."""
        weight = self.embedding.weight
        return [
            (weight.new_zeros(1, batch_size, m), weight.new_zeros(1, batch_size, m))
            for _, m in self.layer_sizes
        ]

    def _drop(self, x: Tensor, p: float) -> Tensor:
        """Dropout on a (B, T, C) activation: locked over time when variational."""
        if self.variational:
            return locked_dropout(x, p, self.training)
        return F.dropout(x, p, self.training)

    def forward(self, tokens: Tensor, hidden: Hidden | None = None) -> AWDOutput:
        if tokens.dim() != 2:
            raise ValueError(f"expected tokens (B, T), got shape {tuple(tokens.shape)}")
        if hidden is None:
            hidden = self.init_hidden(tokens.shape[0])
        elif len(hidden) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} (h, c) pairs, got {len(hidden)}")
        weight = embedding_dropout(self.embedding.weight, self.dropout_embedding, self.training)
        x = self._drop(F.embedding(tokens, weight), self.dropout_input)  # (B, T, E)
        targets = WEIGHT_DROP_TARGETS[self.rnn]
        new_hidden = []
        for layer, rnn in enumerate(self.rnns):
            # (B, T, N) -> (B, T, M_l); (h, c) each (1, B, M_l)
            hx = tuple(hidden[layer])
            x, state = call_with_weight_drop(rnn, targets, self.weight_drop, x, hx)
            new_hidden.append(state)
            if layer < self.num_layers - 1:
                x = self._drop(x, self.dropout_hidden)
        dropped = self._drop(x, self.dropout)
        return AWDOutput(self.decoder(dropped), new_hidden, x, dropped)  # logits (B, T, V)

    def extra_repr(self) -> str:
        return (
            f"rnn={self.rnn!r}, layer_sizes={self.layer_sizes}, dropout={self.dropout}, "
            f"dropout_hidden={self.dropout_hidden}, dropout_input={self.dropout_input}, "
            f"dropout_embedding={self.dropout_embedding}, weight_drop={self.weight_drop}, "
            f"variational={self.variational}, tie_weights={self.tie_weights}"
        )
