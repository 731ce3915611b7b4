"""Pyramidal Recurrent Unit (PRU): LSTM gating over a pyramidal input and a grouped context GLT.

PRU (Mehta et al., 2018, Sec. 3; Mehta's thesis, Ch. 4). At step t the four gate pre-activations
are the sum of the pyramidal transformation of the input x_t (:class:`PyramidalTransform`) and the
grouped linear transformation (GLT) of the context h_{t-1} (:class:`GroupedContextTransform`), each
with its own bias. In the official gate order (f, g, i, o), not ``nn.LSTM``'s (i, f, g, o):

    f = sigmoid(P_f + G_f),  i = sigmoid(P_i + G_i),  g = tanh(P_g + G_g),  o = sigmoid(P_o + G_o)
    c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)

Where the official code (github.com/sacmehta/PRU) and the thesis differ:

* The pyramid's output split across levels and the thesis Table 4.2 parameter count: see
  :mod:`src.ops.pyramidal` (this module follows the code: 2,704,800 recurrent-unit parameters for
  600 -> 600, g = 1, K = 2, where the thesis prints 2.5 M; Table 4.1 matches the code).
* The thesis calls the LSTM the PRU with g = K = 1. That holds only when N != M: with N == M the
  pyramid's residual (x added to all four gates) is still there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.dispatch import check_impl
from src.kernels.pru_recurrence import pru_recurrence
from src.ops.group_linear import GroupLinear
from src.ops.pyramidal import GATES, PyramidalTransform


def lstm_update(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """The cell equations from the summed gate pre-activations: returns (h_t, c_t).

    Shape:
        gates (..., 4, M) in the order (f, g, i, o), c (..., M) -> h (..., M), c (..., M)
    """
    forget, content, update, output = gates.unbind(-2)
    c = torch.sigmoid(forget) * c + torch.sigmoid(update) * torch.tanh(content)
    return torch.sigmoid(output) * torch.tanh(c), c


class GroupedContextTransform(nn.Module):
    """The PRU's context path: a GLT of h_{t-1} to the four gate pre-activations.

    h is cut into g contiguous chunks of M/g; chunk j gives 4M/g outputs through its own matrix
    (``h_j @ W_j + b_j``), read as four consecutive blocks (f, g, i, o) of M/g; a gate's
    pre-activation is the concatenation over the groups of that gate's block. No shuffle,
    normalisation or activation; g = 1 is a dense layer.

    Args:
        hidden_size: M, divisible by ``groups``.
        groups: g.
        bias: learn a bias per output.

    Parameters: ``glt`` is a :class:`GroupLinear` (M -> 4M, g groups): ``glt.weight`` (g, M/g, 4M/g)
    and ``glt.bias`` (g, 4M/g), the official ``W`` and ``bias`` layout.

    Shape:
        (..., M) -> (..., 4, M), the gates in the order (f, g, i, o) on dim -2.
    """

    def __init__(self, hidden_size: int, *, groups: int = 1, bias: bool = True) -> None:
        super().__init__()
        if hidden_size < 1 or groups < 1 or hidden_size % groups:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be positive and divisible by groups ({groups})"
            )
        self.hidden_size = hidden_size
        self.groups = groups
        self.glt = GroupLinear(hidden_size, GATES * hidden_size, groups, bias=bias)

    def reset_parameters(self) -> None:
        self.glt.reset_parameters()

    def gate_view(self, h: Tensor) -> Tensor:
        """The GLT output as a strided view with the gates first: no copy for the re-arrangement.

        The product is ``group_linear_reference``'s batched one, on ``glt``'s parameters, minus its
        final copy into (..., 4M): the output stays in its group-major memory layout, which the
        per-step loop of :meth:`PRUCell.forward_sequence` adds to the pyramid's output as it is.

        Shape:
            (..., M) -> (..., 4, g, M/g)
        """
        groups, width = self.groups, self.hidden_size // self.groups
        lead = h.shape[:-1]
        # (..., M) -> (R, g, M/g) -> (g, R, M/g)
        chunks = h.reshape(-1, groups, width).transpose(0, 1)
        weight, bias = self.glt.weight, self.glt.bias
        if bias is None:
            out = torch.bmm(chunks, weight)
        else:
            out = torch.baddbmm(bias.unsqueeze(1), chunks, weight)  # (g, R, 4M/g)
        # (g, R, 4M/g) -> (g, R, 4, M/g) -> (R, 4, g, M/g) -> (..., 4, g, M/g)
        return (
            out.unflatten(-1, (GATES, width))
            .permute(1, 2, 0, 3)
            .reshape(*lead, GATES, groups, width)
        )

    def forward(self, h: Tensor) -> Tensor:
        if h.shape[-1] != self.hidden_size:
            raise ValueError(
                f"expected {self.hidden_size} context features, got shape {tuple(h.shape)}"
            )
        return self.gate_view(h).flatten(-2)  # (..., 4, g, M/g) -> (..., 4, M)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, groups={self.groups}"


class PRUCell(nn.Module):
    """One PRU step: (x_t, (h_{t-1}, c_{t-1})) -> (h_t, c_t), like ``nn.LSTMCell``.

    Args:
        input_size: N.
        hidden_size: M, divisible by ``groups``.
        groups: g of the context GLT.
        levels: K of the pyramidal transformation.
        subsampling: the pyramid's sub-sampling (see :class:`PyramidalTransform`).
        bias: learn the biases of both transforms.
        split: the pyramid's output split, ``"official"`` or ``"paper"``.
        residual: the pyramid's residual; None (official) when N == M.
        impl: the recurrence's path over a sequence
            (:func:`src.kernels.pru_recurrence.pru_recurrence`): "auto", "reference" or "triton".

    Shape:
        x (B, N) or (N,); hx = (h, c) each (B, M) or (M,), zeros when omitted -> (h, c) each (B, M)
        or (M,).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        groups: int = 1,
        levels: int = 2,
        subsampling: str = "avg",
        bias: bool = True,
        split: str = "official",
        residual: bool | None = None,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.impl = check_impl(impl)
        self.pyramid = PyramidalTransform(
            input_size,
            hidden_size,
            levels=levels,
            subsampling=subsampling,
            bias=bias,
            split=split,
            residual=residual,
        )
        self.context = GroupedContextTransform(hidden_size, groups=groups, bias=bias)

    def reset_parameters(self) -> None:
        self.pyramid.reset_parameters()
        self.context.reset_parameters()

    def forward(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hx is None:
            zeros = x.new_zeros(*x.shape[:-1], self.hidden_size)
            hx = (zeros, zeros)
        h, c = hx
        return lstm_update(self.pyramid(x) + self.context(h), c)

    def forward_sequence(
        self, x: Tensor, hx: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """All steps of a time-major sequence.

        The pyramidal transformation does not depend on h, so it runs once over all steps, as one
        large product; the steps' context GLTs and cell equations are
        :func:`src.kernels.pru_recurrence.pru_recurrence` (one C++ call each way on the CPU).

        Shape:
            x (T, B, N), hx = (h_0, c_0) each (B, M) -> output (T, B, M), (h_T, c_T) each (B, M)
        """
        # (T, B, N) -> [(T, B, 4, m_k)], the levels' shares of the units
        levels = self.pyramid.level_outputs(x)
        glt = self.context.glt
        output, h, c = pru_recurrence(levels, glt.weight, glt.bias, *hx, impl=self.impl)
        return output, (h, c)

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}"


class PRU(nn.Module):
    """A stack of PRU layers, a drop-in for ``nn.LSTM``: same arguments, layouts and hidden state.

    Dropout (if any) is applied to the outputs of every layer but the last, in training only, as in
    ``nn.LSTM``. All layers have hidden size M (the official language model's last layer, sized to
    the embedding, is a separate one-layer ``PRU``).

    Args:
        input_size: N of the first layer.
        hidden_size: M of every layer, divisible by ``groups``.
        num_layers: stacked layers; layer l > 0 takes the M-wide output of layer l - 1.
        groups: g of each context GLT.
        levels: K of each pyramidal transformation.
        subsampling: the pyramids' sub-sampling (see :class:`PyramidalTransform`).
        bias: learn the biases.
        batch_first: input and output are (B, T, .) instead of (T, B, .); the hidden state is
            (num_layers, B, M) either way.
        dropout: probability of dropping the outputs of each layer but the last.
        split: the pyramids' output split, ``"official"`` or ``"paper"``.
        residual: the pyramids' residual; None (official) where N == M.
        impl: each layer's recurrence path (:class:`PRUCell`).

    Shape:
        x (T, B, N) (or (B, T, N) when ``batch_first``, or unbatched (T, N)); hx = (h_0, c_0) each
        (num_layers, B, M) (or (num_layers, M) unbatched), zeros when omitted
        -> output (T, B, M) (or (B, T, M), or (T, M)), (h_n, c_n) shaped as hx.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        *,
        groups: int = 1,
        levels: int = 2,
        subsampling: str = "avg",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        split: str = "official",
        residual: bool | None = None,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be positive, got {num_layers}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout must be in [0, 1], got {dropout}")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.dropout = dropout
        self.cells = nn.ModuleList(
            PRUCell(
                input_size if layer == 0 else hidden_size,
                hidden_size,
                groups=groups,
                levels=levels,
                subsampling=subsampling,
                bias=bias,
                split=split,
                residual=residual,
                impl=impl,
            )
            for layer in range(num_layers)
        )

    def reset_parameters(self) -> None:
        for cell in self.cells:
            cell.reset_parameters()

    def forward(
        self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if x.dim() not in (2, 3) or x.shape[-1] != self.input_size:
            raise ValueError(
                f"expected input (T, B, {self.input_size}), (B, T, {self.input_size}) or "
                f"(T, {self.input_size}), got shape {tuple(x.shape)}"
            )
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(1)  # (T, N) -> (T, 1, N)
        elif self.batch_first:
            x = x.transpose(0, 1)  # (B, T, N) -> (T, B, N)
        state_shape = (self.num_layers, x.shape[1], self.hidden_size)
        if hx is None:
            h0 = c0 = x.new_zeros(state_shape)
        else:
            h0, c0 = hx
            if unbatched:
                h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)  # (L, M) -> (L, 1, M)
            if h0.shape != state_shape or c0.shape != state_shape:
                raise ValueError(
                    f"expected h_0 and c_0 of shape {state_shape}, "
                    f"got {tuple(h0.shape)} and {tuple(c0.shape)}"
                )
        h_n, c_n = [], []
        for layer, cell in enumerate(self.cells):
            if layer and self.dropout and self.training:
                x = F.dropout(x, self.dropout, training=True)
            x, (h, c) = cell.forward_sequence(x, (h0[layer], c0[layer]))
            h_n.append(h)
            c_n.append(c)
        h_n, c_n = torch.stack(h_n), torch.stack(c_n)  # (L, B, M) each
        if unbatched:
            return x.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        if self.batch_first:
            x = x.transpose(0, 1)  # (T, B, M) -> (B, T, M)
        return x, (h_n, c_n)

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, "
            f"num_layers={self.num_layers}, batch_first={self.batch_first}, dropout={self.dropout}"
        )
