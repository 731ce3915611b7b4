"""Adaptive input (Baevski & Auli, 2019) and adaptive softmax (Grave et al., 2017), tied.

The vocabulary (sorted by descending frequency) is cut into bands by ``cutoffs`` [c_1, c_2, ...]:
band 0 is [0, c_1), band i is [c_i, c_{i+1}), the last ends at V. Band i has its own embedding
table of width ``d_i = initial_dim / factor^i``, so rare words get narrow vectors.

- Adaptive input: ``E_i[token] * sqrt(d_i)`` then a bias-free ``P_i``: Linear(d_i -> output_dim).
- Adaptive softmax over ``output_dim``-wide hidden states: the head scores band 0's words against
  ``E_0`` plus one *cluster* logit per tail band (``class_proj``, Linear(output_dim -> n_tails), no
  bias), and a softmax over these c_1 + n_tails entries. Tail i scores its band's words inside the
  cluster: hidden -> ``P_i^T`` (output_dim -> d_i) -> dropout -> logits against ``E_i``.
  ``log p(w) = log p_head(cluster of w) + log p_tail(w | cluster)``.

Everything but ``class_proj`` is shared between input and output, as the DeLighT WikiText-103
model does (fairseq ``tie_adaptive_weights`` and ``tie_adaptive_proj``; sacmehta/delight
``delight_transformer_lm_wiki103``). fairseq details kept: the head of fairseq's tied softmax
uses ``E_0`` directly when output_dim equals initial_dim (band 0's input projection ``P_0`` is
input-only), the hidden states pass a dropout before the head and again inside each tail, and the
head's softmax includes the pad word (its zero row gives logit 0). Details not kept: fairseq zeroes
row ``padding_idx`` of *every* band's table and ignores tail targets equal to ``padding_idx``
after the band offset is subtracted (so the words c_i + padding_idx are never trained); here only
the pad token itself is zeroed and ignored.

With output_dim == initial_dim the structure is exactly ``torch.nn.AdaptiveLogSoftmaxWithLoss``
(``div_value = factor``, ``head_bias=False``) with its head weight ``[E_0; class_proj]`` and tail i
``(P_i^T, E_i)``, which cannot tie its weights to an input embedding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.dispatch import exporting
from src.kernels.dropout import dropout

REDUCTIONS = ("sum", "mean", "none")


def _fixed_shapes() -> bool:
    """Whether every intermediate must have a shape known before the data is seen: under
    ``torch.export`` (a dynamic batch) and in a traced step (torch.compile, CUDA graphs, where
    ``nonzero`` would read the data on the host)."""
    return exporting() or torch.compiler.is_compiling()


class AdaptiveInputSoftmax(nn.Module):
    """Adaptive input embedding and adaptive softmax sharing their band tables and projections.

    Args:
        vocab_size: V, the words sorted by descending frequency (fairseq dictionary order).
        cutoffs: band boundaries c_1 < c_2 < ... < V (WikiText-103: 20000, 60000).
        initial_dim: d_0, band 0's width (DeLighT: 128).
        output_dim: the width of the embeddings produced and of the hidden states scored (128).
        factor: band i has width ``int(initial_dim // factor**i)`` (2: 128, 64, 32).
        padding_idx: the pad token, in band 0; its vector is zero and it is never a target.
        dropout: the adaptive softmax dropout (``adaptive_softmax_dropout``, 0.1 in DeLighT).

    Submodules: ``embeddings`` (one ``nn.Embedding`` per band), ``projections`` (one bias-free
    ``nn.Linear(d_i -> output_dim)`` per band), ``class_proj`` (bias-free
    ``nn.Linear(output_dim -> n_tails)``, the only output-only weight).

    Shape:
        forward: tokens (*) int64 -> (*, output_dim); loss: hidden (*, output_dim), targets (*)
        -> scalar (or (*) for ``reduction="none"``); log_prob: hidden (*, output_dim) -> (*, V)
    """

    def __init__(
        self,
        vocab_size: int,
        cutoffs: Sequence[int] = (20000, 60000),
        *,
        initial_dim: int = 128,
        output_dim: int = 128,
        factor: float = 2.0,
        padding_idx: int = 1,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        cutoffs = [int(c) for c in cutoffs]
        if not cutoffs or any(b <= a for a, b in zip([0, *cutoffs], [*cutoffs, vocab_size])):
            raise ValueError(
                f"cutoffs must increase strictly from above 0 to below vocab_size={vocab_size}, "
                f"got {cutoffs}"
            )
        if not 0 <= padding_idx < cutoffs[0]:
            raise ValueError(f"padding_idx must lie in band 0 [0, {cutoffs[0]}), got {padding_idx}")
        if factor < 1 or int(initial_dim // factor ** len(cutoffs)) < 1:
            raise ValueError(
                f"every band needs width >= 1: initial_dim={initial_dim}, factor={factor}, "
                f"{len(cutoffs) + 1} bands"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if output_dim != initial_dim:
            # fairseq's tied head would add an untied Linear(output_dim -> initial_dim) here
            raise ValueError(
                f"the tied head scores against band 0's table directly, so output_dim must equal "
                f"initial_dim, got {output_dim} and {initial_dim}"
            )
        self.vocab_size = vocab_size
        self.cutoffs = tuple(cutoffs)
        self.bounds = (0, *cutoffs, vocab_size)  # band i is [bounds[i], bounds[i + 1])
        self.dims = tuple(int(initial_dim // factor**i) for i in range(len(cutoffs) + 1))
        self.output_dim = output_dim
        self.padding_idx = padding_idx
        self.dropout = dropout
        self.embeddings = nn.ModuleList(
            nn.Embedding(hi - lo, dim, padding_idx=padding_idx if i == 0 else None)
            for i, (lo, hi, dim) in enumerate(zip(self.bounds, self.bounds[1:], self.dims))
        )
        self.projections = nn.ModuleList(
            nn.Linear(dim, output_dim, bias=False) for dim in self.dims
        )
        self.class_proj = nn.Linear(output_dim, len(cutoffs), bias=False)
        self.register_buffer("_cutoffs", torch.tensor(cutoffs), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """fairseq's init: band tables N(0, d_i^-0.5) with the pad row zero; projections and the
        cluster logits xavier-uniform."""
        for embedding in self.embeddings:
            nn.init.normal_(embedding.weight, std=embedding.embedding_dim**-0.5)
        with torch.no_grad():
            self.embeddings[0].weight[self.padding_idx].zero_()
        for linear in (*self.projections, self.class_proj):
            nn.init.xavier_uniform_(linear.weight)

    @property
    def n_tails(self) -> int:
        return len(self.cutoffs)

    def band_of(self, tokens: Tensor) -> Tensor:
        """The band index of each token. (*) int64 -> (*) int64."""
        return torch.bucketize(tokens, self._cutoffs, right=True)

    # -- adaptive input -------------------------------------------------------------------------
    def forward(self, tokens: Tensor) -> Tensor:
        """The adaptive input embedding ``P_i(E_i[token] sqrt(d_i))``.

        Shape:
            tokens (*) int64 -> (*, output_dim)
        """
        flat = tokens.reshape(-1)  # (N,)
        band = self.band_of(flat)
        if _fixed_shapes():
            # the rows of a band are a data-dependent count (nonzero): a graph embeds every token
            # in every band and keeps its own
            out = None
            for i, (embedding, projection) in enumerate(zip(self.embeddings, self.projections)):
                local = (flat - self.bounds[i]).clamp(0, embedding.num_embeddings - 1)
                vectors = projection(embedding(local) * math.sqrt(embedding.embedding_dim))
                out = vectors if out is None else torch.where((band == i)[:, None], vectors, out)
            return out.reshape(*tokens.shape, self.output_dim)
        parts, order = [], []
        for i, (embedding, projection) in enumerate(zip(self.embeddings, self.projections)):
            index = torch.nonzero(band == i).squeeze(1)  # (n_i,)
            vectors = embedding(flat[index] - self.bounds[i]) * math.sqrt(embedding.embedding_dim)
            parts.append(projection(vectors))  # (n_i, output_dim)
            order.append(index)
        # rows grouped by band -> rows in token order (a gather, so autocast dtypes pass through)
        position = torch.cat(order)  # (N,)
        inverse = torch.empty_like(position)
        inverse[position] = torch.arange(len(position), device=position.device)
        return torch.cat(parts)[inverse].reshape(*tokens.shape, self.output_dim)

    # -- adaptive softmax -----------------------------------------------------------------------
    def _head_log_probs(self, hidden: Tensor) -> Tensor:
        """Log-probabilities of band 0's words and the tail clusters.

        Shape:
            (N, d) -> (N, c_1 + n_tails) float32
        """
        words = F.linear(hidden, self.embeddings[0].weight)  # (N, c_1)
        clusters = self.class_proj(hidden)  # (N, n_tails)
        return torch.cat((words, clusters.to(words.dtype)), dim=-1).float().log_softmax(-1)

    def _tail_log_probs(self, hidden: Tensor, i: int) -> Tensor:
        """Log-probabilities inside tail cluster i (band i + 1). (n, d) -> (n, band size)."""
        band = i + 1
        h = F.linear(hidden, self.projections[band].weight.t())  # (n, d_band): the tied P^T
        h = dropout(h, self.dropout, self.training)
        return F.linear(h, self.embeddings[band].weight).float().log_softmax(-1)

    def loss(self, hidden: Tensor, targets: Tensor, *, reduction: str = "sum") -> Tensor:
        """Negative log-likelihood of ``targets`` (fairseq's ``adaptive_loss``), pads ignored.

        Only the head (c_1 + n_tails columns) is scored for every position; a tail is scored only
        for the positions whose target lies in it, so no (N, V) tensor is formed. Traced
        (torch.compile, CUDA graphs) or exported, shapes cannot depend on the targets: every
        position scores every tail, an (N, V - c_1) tensor in all, and keeps its own.

        Args:
            hidden: the network's output states.
            targets: next-token ids; ``padding_idx`` marks positions not scored.
            reduction: ``"sum"`` (nats), ``"mean"`` over the scored positions, or ``"none"``
                (per position, 0 at pads).

        Shape:
            hidden (*, output_dim), targets (*) int64 -> scalar, or (*) float32 for "none"
        """
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if hidden.shape[:-1] != targets.shape:
            raise ValueError(
                f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} disagree"
            )
        h = dropout(hidden.reshape(-1, self.output_dim), self.dropout, self.training)  # (N, d)
        flat = targets.reshape(-1)  # (N,)
        scored = flat != self.padding_idx
        band = self.band_of(flat)
        # head target: the word in band 0, else the cluster of its band (c_1 + band - 1)
        head_target = torch.where(band == 0, flat, self.cutoffs[0] + band - 1)
        head_target = head_target.masked_fill(~scored, 0)
        nll = -self._head_log_probs(h).gather(1, head_target[:, None]).squeeze(1)  # (N,)
        for i in range(self.n_tails):
            if _fixed_shapes():
                # every position scores the tail; those whose target is elsewhere add 0
                size = self.embeddings[i + 1].num_embeddings
                inside = (flat - self.bounds[i + 1]).clamp(0, size - 1)[:, None]  # (N, 1)
                tail = -self._tail_log_probs(h, i).gather(1, inside).squeeze(1)  # (N,)
                nll = nll + torch.where(band == i + 1, tail, torch.zeros_like(tail))
                continue
            index = torch.nonzero((band == i + 1) & scored).squeeze(1)  # (n_i,)
            if index.numel() == 0:
                continue
            inside = (flat[index] - self.bounds[i + 1])[:, None]  # (n_i, 1)
            tail = -self._tail_log_probs(h[index], i).gather(1, inside).squeeze(1)  # (n_i,)
            nll = nll.index_add(0, index, tail)
        nll = nll * scored
        if reduction == "none":
            return nll.reshape(targets.shape)
        total = nll.sum()
        return total / scored.sum().clamp_min(1) if reduction == "mean" else total

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Log-probabilities of the whole vocabulary (for sampling and checks; V wide).

        Shape:
            hidden (*, output_dim) -> (*, V) float32
        """
        h = hidden.reshape(-1, self.output_dim)  # (N, d)
        head = self._head_log_probs(h)  # (N, c_1 + n_tails)
        parts = [head[:, : self.cutoffs[0]]]
        for i in range(self.n_tails):
            parts.append(self._tail_log_probs(h, i) + head[:, self.cutoffs[0] + i, None])
        return torch.cat(parts, dim=-1).reshape(*hidden.shape[:-1], self.vocab_size)

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, cutoffs={self.cutoffs}, dims={self.dims}, "
            f"output_dim={self.output_dim}, padding_idx={self.padding_idx}, dropout={self.dropout}"
        )
