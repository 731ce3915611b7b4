"""The PRU's recurrence over a sequence: the cell's steps from h_0, c_0 to h_T, c_T.

PRU (Mehta et al., 2018, Sec. 3; Mehta's thesis, Sec. 4.3). At step t each gate v of f, i, c, o
(stored in the official order f, c, i, o, the content gate being "g" in the code) reads the sum of
two transformations, each with its own bias (thesis Eq. 4.5):

    G_v(x_t, h_{t-1}) = F_P(x_t) + F_G(h_{t-1})

- F_P, the pyramidal transformation of the input (Sec. 3.1, thesis Eq. 4.2,
  :class:`src.ops.pyramidal.PyramidalTransform`), called P_t below, (B, 4, M);
- F_G, the grouped linear transformation of the context (Sec. 3.2, thesis Eq. 4.4,
  :class:`src.ops.pru.GroupedContextTransform`): h_{t-1} cut into g chunks of w = M / g, chunk j
  mapped by its own W_j (w, 4w) and b_j, whose four column blocks of w feed f, c, i, o.

The gates and the state are the LSTM's (Sec. 3.3, thesis Eq. 4.6):

    f_t = sigmoid(G_f),  i_t = sigmoid(G_i),  c^_t = tanh(G_c),  o_t = sigmoid(G_o)
    c_t = f_t * c_{t-1} + i_t * c^_t,   h_t = o_t * tanh(c_t)

P_t does not depend on h, so :meth:`src.ops.pru.PRUCell.forward_sequence` computes it for all T
steps at once (one large product over T·B rows) and hands it here. What is left is sequential: the
context's transformation F_G(h_{t-1}) and the gating, step after step. The reference computes
exactly that, one step at a time (:func:`src.kernels.pru_recurrence.pru_recurrence_reference`); the
C++ and Triton paths of :func:`src.kernels.pru_recurrence.pru_recurrence` run all T steps in one
call each way, the reference their oracle.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from src.kernels.pru_recurrence import pru_recurrence as recurrence_op


def pru_recurrence(
    pyramid: Tensor | Sequence[Tensor],
    context_weight: Tensor,
    context_bias: Tensor | None,
    h0: Tensor,
    c0: Tensor,
    impl: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    """h_1 .. h_T, h_T and c_T from P_1 .. P_T and the state before the first step (module
    docstring).

    Args:
        pyramid: P_t for every step, the pyramidal transformation's output with its bias and
            residual, or its levels as they come (:meth:`src.ops.pyramidal.PyramidalTransform.
            level_outputs`), P being their concatenation along the units.
        context_weight: the grouped context transformation's W, group j's (w, 4w) matrix in
            ``context_weight[j]``.
        context_bias: its b, group j's 4w outputs' in ``context_bias[j]``, or None.
        h0, c0: the state before the first step.
        impl: the path (:func:`src.kernels.pru_recurrence.pru_recurrence`): "auto", "reference"
            or "triton".

    Shape:
        pyramid (T, B, 4, M) or [(T, B, 4, m_l)] with sum m_l = M, context_weight (g, w, 4w) with
        M = g w, context_bias (g, 4w), h0 and c0 (B, M)
        -> output (T, B, M), h_T (B, M), c_T (B, M)
    """
    return recurrence_op(pyramid, context_weight, context_bias, h0, c0, impl=impl)
