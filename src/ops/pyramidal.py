"""Pyramidal transformation (PT): the input path of the Pyramidal Recurrent Unit.

PRU (Mehta et al., 2018, Sec. 3.1; Mehta's thesis, Sec. 4.2): the input x of width N is
sub-sampled into K levels, x^0 = x and x^k = S(x^{k-1}) of width ceil(N / 2^k), a cascade in which
each level sub-samples the previous one. Level k has its own (scale-specific) linear map to the four
gate pre-activations, each m_k wide; a gate's pre-activation is the concatenation of its chunks over
the levels (k = 0 first). When N == M, x is added to all four gate pre-activations (the residual).

The official code (github.com/sacmehta/PRU) sub-samples by average pooling along the feature axis
with stride 2, kernel 2(K - k) + 1 and padding K - k at level k, counting the zero padding in the
average. The thesis also names skipping (strided sub-sampling), max pooling and a learned strided
convolution; they are the other ``subsampling`` options, with the same kernels and padding.

Where the official code and the thesis differ:

* Output split across levels: the thesis gives each level M / K outputs per gate; the code gives
  level k (0-based) m_k = ceil(M / 2^(k+1)) and level 0 the remainder as well, so K = 2 splits M as
  (3M/4, M/4) and K = 4, M = 64 as (36, 16, 8, 4). This module follows the code. With the
  thesis split, thesis Table 4.2's "PT input" unit (600 -> 600, K = 2, g = 1) has 2.5 M
  parameters; with the code's it has 2,704,800 (Table 4.1 matches the code).
  ``split="paper"`` gives the thesis's equal split, for the ablations of thesis Table 4.2.
* The code requires N and M to be divisible by 2^K, so the thesis example N = M = 600, K = 4 cannot
  be built there; this module accepts any sizes for which every level gets at least one output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

GATES = 4  # the LSTM gates, in the official order (f, g, i, o)
SUBSAMPLINGS = ("avg", "max", "skip", "learned")


SPLITS = ("official", "paper")


def level_out_features(out_features: int, levels: int, split: str = "official") -> tuple[int, ...]:
    """Outputs per gate of each level: ``"official"`` m_k = ceil(M / 2^(k+1)), ``"paper"`` (thesis
    Eq. 4.2) m_k = floor(M / K); the remainder goes to level 0 in both."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "official":
        widths = [math.ceil(out_features / 2 ** (k + 1)) for k in range(levels)]
    else:
        widths = [out_features // levels] * levels
    widths[0] += out_features - sum(widths)
    return tuple(widths)


class PyramidalTransform(nn.Module):
    """The four gate pre-activations of an input vector from K sub-sampled levels.

    Args:
        in_features: N, the input width.
        out_features: M, the width of each gate pre-activation (the PRU's hidden size).
        levels: K, the number of pyramid levels (K = 1 is one linear layer).
        subsampling: how level k is made from level k - 1, halving the width:
            ``"avg"`` (official) average pooling with the padding counted, ``"max"`` max pooling,
            ``"skip"`` every second feature, ``"learned"`` a strided one-channel convolution
            initialised to the average pooling.
        bias: learn a bias in each level's linear map.
        split: how M is shared by the levels, ``"official"`` (code) or ``"paper"`` (M / K each).
        residual: add x to the gates; None (official) when N == M, False never (thesis Table
            4.2 row R6, "PT without residual").

    Parameters: ``transforms.{k}`` is level k's ``nn.Linear(ceil(N / 2^k), 4 * m_k)``, its output
    read as four consecutive chunks (f, g, i, o); ``subsamplers.{k-1}`` is level k's convolution
    (``"learned"`` only).

    Shape:
        (..., N) -> (..., 4, M), the gates in the order (f, g, i, o) on dim -2.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        levels: int = 2,
        subsampling: str = "avg",
        bias: bool = True,
        split: str = "official",
        residual: bool | None = None,
    ) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1 or levels < 1:
            raise ValueError(
                f"in_features ({in_features}), out_features ({out_features}) and levels ({levels}) "
                "must be positive"
            )
        if subsampling not in SUBSAMPLINGS:
            raise ValueError(f"subsampling must be one of {SUBSAMPLINGS}, got {subsampling!r}")
        widths = level_out_features(out_features, levels, split)
        if min(widths) < 1:
            raise ValueError(
                f"out_features ({out_features}) is too small for {levels} levels: the levels "
                f"would get {widths} outputs per gate"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.levels = levels
        self.subsampling = subsampling
        self.level_in_features = tuple(math.ceil(in_features / 2**k) for k in range(levels))
        self.level_out_features = widths
        if residual and in_features != out_features:
            raise ValueError(
                f"the residual needs in_features == out_features, got {in_features} and "
                f"{out_features}"
            )
        self.split = split
        self.residual = in_features == out_features if residual is None else residual
        self.transforms = nn.ModuleList(
            nn.Linear(n_k, GATES * m_k, bias=bias)
            for n_k, m_k in zip(self.level_in_features, widths)
        )
        self.subsamplers = (
            nn.ModuleList(
                nn.Conv1d(1, 1, self.kernel_size(k), stride=2, padding=self.levels - k, bias=False)
                for k in range(1, levels)
            )
            if subsampling == "learned"
            else None
        )
        self.reset_parameters()

    def kernel_size(self, level: int) -> int:
        """The kernel that sub-samples into level ``level`` >= 1: 2(K - k) + 1, padding K - k."""
        return 2 * (self.levels - level) + 1

    def reset_parameters(self) -> None:
        for transform in self.transforms:
            transform.reset_parameters()
        if self.subsamplers is not None:
            for k, conv in enumerate(self.subsamplers, start=1):
                nn.init.constant_(conv.weight, 1.0 / self.kernel_size(k))

    def subsample(self, x: Tensor, level: int) -> Tensor:
        """Level ``level`` from level ``level - 1``.

        Shape:
            (..., n) -> (..., ceil(n / 2))
        """
        if self.subsampling == "skip":
            return x[..., ::2]
        kernel, padding = self.kernel_size(level), self.levels - level
        # (..., n) -> (R, 1, n): pool the feature axis as a one-channel signal
        signal = x.reshape(-1, 1, x.shape[-1])
        if self.subsampling == "avg":
            pooled = F.avg_pool1d(signal, kernel, stride=2, padding=padding, count_include_pad=True)
        elif self.subsampling == "max":
            pooled = F.max_pool1d(signal, kernel, stride=2, padding=padding)
        else:
            pooled = self.subsamplers[level - 1](signal)
        # (R, 1, ceil(n / 2)) -> (..., ceil(n / 2))
        return pooled.reshape(*x.shape[:-1], pooled.shape[-1])

    def level_outputs(self, x: Tensor) -> list[Tensor]:
        """Each level's share of the gate pre-activations, residual included, not concatenated:
        the PRU's recurrence reads them in place (at PTB sizes the concatenation and the slicing of
        its gradient copy 2 x 31 MB a window).

        Shape:
            (..., N) -> [(..., 4, m_k) for each level k], sum m_k = M
        """
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"expected {self.in_features} input features, got shape {tuple(x.shape)}"
            )
        chunks = []
        level, offset = x, 0
        for k, transform in enumerate(self.transforms):
            if k:
                level = self.subsample(level, k)
            # (..., n_k) -> (..., 4 * m_k) -> (..., 4, m_k)
            chunk = transform(level).unflatten(-1, (GATES, -1))
            if self.residual:
                # in place on the fresh product (its backward does not need it); (..., 1, m_k)
                # broadcast over the 4 gates
                width = chunk.shape[-1]
                chunk = chunk.add_(x[..., offset : offset + width].unsqueeze(-2))
                offset += width
            chunks.append(chunk)
        return chunks

    def forward(self, x: Tensor) -> Tensor:
        chunks = self.level_outputs(x)
        return torch.cat(chunks, dim=-1) if len(chunks) > 1 else chunks[0]  # (..., 4, M)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"levels={self.levels}, subsampling={self.subsampling!r}, "
            f"level_out_features={self.level_out_features}, split={self.split!r}, "
            f"residual={self.residual}"
        )
