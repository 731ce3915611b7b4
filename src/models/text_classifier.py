"""Self-attention sentence classifiers: DeLighT blocks or standard Transformer layers.

Both networks share the stem and the head: a token lookup table of width d_m scaled by sqrt(d_m),
fairseq's sinusoidal positions (:func:`src.ops.sinusoidal_positions.sinusoidal_positions`),
dropout; then the encoder; then masked mean pooling over the non-pad positions and a linear layer
to the class logits. Only the encoder differs:

- :class:`DeLighTClassifier`: B :class:`~src.models.delight_block.DeLighTEncoderBlock` (thesis
  Sec. 5.3.2), with block-wise scaling (Eq. 5.4,
  :func:`~src.models.delight_block.block_wise_scaling`) or every block at (N_min, w_m), and the GLT
  feature shuffle on or off. These are the four DeLighT
  variants of the student report "DeLighT: deep and light-weight Transformer" (Danesi, Bône, Abid):
  "Scale" = block-wise scaling, "Shift" = GLT shuffle (``/work/shared/specs/delight_sentiment.md``
  Sec. 2).
- :class:`TransformerClassifier`: ``nn.TransformerEncoder`` (Vaswani et al., 2017), the report's
  "standard Transformer" baseline of about the same size.
"""

from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.models.delight_block import DeLighTEncoderBlock, block_wise_scaling
from src.models.fairseq_init import PADDING_IDX, init_official
from src.ops.dextra import dextra_max_groups
from src.ops.sinusoidal_positions import sinusoidal_positions


def masked_mean_pool(x: Tensor, padding_mask: Tensor) -> Tensor:
    """The mean of each sequence's non-pad vectors (a sequence of pads only gives zeros).

    Shape:
        x (B, T, D); padding_mask (B, T) bool, True = pad -> (B, D)
    """
    keep = (~padding_mask).unsqueeze(-1).to(x.dtype)  # (B, T, 1)
    count = keep.sum(dim=1).clamp(min=1.0)  # (B, 1)
    return (x * keep).sum(dim=1) / count


class _PooledClassifier(nn.Module, metaclass=ABCMeta):
    """Lookup * sqrt(d_m) + sinusoidal positions -> encoder -> masked mean pool -> Linear.

    Subclasses build ``self.encoder_layers`` and define :meth:`encode`.

    Shape:
        tokens (B, T) int64, padded with ``padding_idx`` -> logits (B, num_classes)
    """

    def __init__(
        self,
        num_embeddings: int,
        num_classes: int,
        d_model: int,
        *,
        padding_idx: int,
        embedding_dropout: float,
    ) -> None:
        super().__init__()
        if not 0 <= padding_idx < num_embeddings or num_classes < 2 or d_model < 4:
            raise ValueError(
                f"need 0 <= padding_idx < num_embeddings, num_classes >= 2 and d_model >= 4, got "
                f"padding_idx={padding_idx}, num_embeddings={num_embeddings}, "
                f"num_classes={num_classes}, d_model={d_model}"
            )
        if not 0.0 <= embedding_dropout < 1.0:
            raise ValueError(f"embedding_dropout must be in [0, 1), got {embedding_dropout}")
        self.d_model = d_model
        self.num_classes = num_classes
        self.padding_idx = padding_idx
        self.embedding_dropout = embedding_dropout
        self.embed_scale = math.sqrt(d_model)
        self.lookup = nn.Embedding(num_embeddings, d_model, padding_idx=padding_idx)
        self.head = nn.Linear(d_model, num_classes)

    @abstractmethod
    def encode(self, x: Tensor, padding_mask: Tensor) -> Tensor:
        """The encoder on embedded tokens.

        Shape:
            x (B, T, d_m); padding_mask (B, T) bool -> (B, T, d_m)
        """

    def forward_features(self, tokens: Tensor) -> Tensor:
        """The pooled sentence vector.

        Shape:
            tokens (B, T) int64 -> (B, d_m)
        """
        padding_mask = tokens.eq(self.padding_idx)
        x = self.lookup(tokens) * self.embed_scale  # (B, T, d_m)
        x = x + sinusoidal_positions(padding_mask, self.d_model, self.padding_idx).to(x.dtype)
        x = F.dropout(x, self.embedding_dropout, self.training)
        x = self.encode(x, padding_mask)  # (B, T, d_m)
        return masked_mean_pool(x, padding_mask)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.forward_features(tokens))

    def _init_stem_and_head(self) -> None:
        # fairseq's embedding init: N(0, d^-0.5), so lookup * sqrt(d) has unit variance
        nn.init.normal_(self.lookup.weight, std=self.d_model**-0.5)
        with torch.no_grad():
            self.lookup.weight[self.padding_idx].zero_()
        nn.init.xavier_uniform_(self.head.weight)
        nn.init.zeros_(self.head.bias)


class DeLighTClassifier(_PooledClassifier):
    """B DeLighT encoder blocks between the shared stem and head (see the module docstring).

    Block b has DExTra depth and width multiplier ``(N^b, w^b)``: with ``block_scaling`` those of
    :func:`block_wise_scaling` (Eq. 5.4, here with B = ``num_blocks``, not N_max), without it
    ``(N_min, w_m)`` in every block (the official ``--delight-enc-scaling uniform``). The shuffle
    is a permutation, so ``glt_shuffle`` changes the function but not the parameter count.

    Args:
        num_embeddings: V, the vocabulary size.
        num_classes: C.
        d_model: d_m.
        n_min: N_min, the first block's DExTra depth.
        n_max: N_max, the last block's with ``block_scaling``.
        width_multiplier: w_m, the first block's width multiplier.
        num_blocks: B (the report uses 3).
        block_scaling: Eq. 5.4 across blocks ("Scale"); False puts every block at (N_min, w_m).
        glt_shuffle: the GLT feature shuffle ("Shift").
        max_groups: g_max; ``dextra_max_groups(d_model)`` when None.
        padding_idx: the pad token.
        dropout: on each block's attention branch before its residual sum.
        attention_dropout: on the attention probabilities.
        activation_dropout: after the FFN's swish.
        ffn_dropout: on the FFN branch before its residual sum.
        dextra_dropout: inside DExTra.
        embedding_dropout: after adding the positions.
        scaling_rule: :func:`block_wise_scaling`'s ``"official"`` or ``"paper"`` rounding.

    Submodules: ``lookup`` (V x d_m), ``blocks`` (B :class:`DeLighTEncoderBlock`), ``head``
    (Linear(d_m -> C)).

    Shape:
        tokens (B, T) int64, padded with ``padding_idx`` -> logits (B, C)
    """

    def __init__(
        self,
        num_embeddings: int,
        num_classes: int,
        d_model: int = 64,
        n_min: int = 4,
        n_max: int = 7,
        width_multiplier: float = 2.0,
        *,
        num_blocks: int = 3,
        block_scaling: bool = True,
        glt_shuffle: bool = True,
        max_groups: int | None = None,
        padding_idx: int = PADDING_IDX,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.0,
        ffn_dropout: float = 0.1,
        dextra_dropout: float = 0.0,
        embedding_dropout: float = 0.1,
        scaling_rule: str = "official",
    ) -> None:
        super().__init__(
            num_embeddings,
            num_classes,
            d_model,
            padding_idx=padding_idx,
            embedding_dropout=embedding_dropout,
        )
        scaled = block_wise_scaling(
            n_min, n_max, width_multiplier, num_blocks=num_blocks, rule=scaling_rule
        )
        self.scaling = scaled if block_scaling else ((n_min, float(width_multiplier)),) * num_blocks
        self.block_scaling = block_scaling
        self.glt_shuffle = glt_shuffle
        self.max_groups = dextra_max_groups(d_model) if max_groups is None else max_groups
        self.blocks = nn.ModuleList(
            DeLighTEncoderBlock(
                d_model,
                width_multiplier=w,
                depth=n,
                max_groups=self.max_groups,
                dropout=dropout,
                attention_dropout=attention_dropout,
                activation_dropout=activation_dropout,
                ffn_dropout=ffn_dropout,
                dextra_dropout=dextra_dropout,
                glt_shuffle=glt_shuffle,
            )
            for n, w in self.scaling
        )
        self.init_weights()

    def init_weights(self) -> None:
        """The official DeLighT initialisation (sacmehta/delight ``nn_functions.py``, as
        :meth:`src.models.delight_mt.DeLighTEncoderDecoder.init_weights`): every Linear and GLT
        weight xavier-uniform with zero biases, LayerNorms at 1 and 0; the lookup
        N(0, d_m^-0.5)."""
        init_official(self)
        self._init_stem_and_head()

    def encode(self, x: Tensor, padding_mask: Tensor) -> Tensor:
        x = x.transpose(0, 1)  # (T, B, d_m): the blocks are time-major
        for block in self.blocks:
            x = block(x, padding_mask)
        return x.transpose(0, 1)  # (B, T, d_m)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, scaling={self.scaling}, block_scaling={self.block_scaling}, "
            f"glt_shuffle={self.glt_shuffle}, max_groups={self.max_groups}"
        )


class TransformerClassifier(_PooledClassifier):
    """``nn.TransformerEncoder`` layers between the shared stem and head (the report's baseline).

    Args:
        num_embeddings: V, the vocabulary size.
        num_classes: C.
        d_model: d_m.
        num_layers: the number of encoder layers (3, as the DeLighT blocks).
        num_heads: attention heads.
        dim_feedforward: the FFN's inner width (sizes the network to the DeLighT one).
        padding_idx: the pad token.
        dropout: ``nn.TransformerEncoderLayer``'s (residual branches and FFN).
        embedding_dropout: after adding the positions.
        norm_first: pre-norm; False is the post-norm of Vaswani et al. and of the DeLighT blocks.

    Submodules: ``lookup`` (V x d_m), ``encoder`` (``nn.TransformerEncoder``), ``head``.

    Shape:
        tokens (B, T) int64, padded with ``padding_idx`` -> logits (B, C)
    """

    def __init__(
        self,
        num_embeddings: int,
        num_classes: int,
        d_model: int = 64,
        num_layers: int = 3,
        num_heads: int = 4,
        dim_feedforward: int = 256,
        *,
        padding_idx: int = PADDING_IDX,
        dropout: float = 0.1,
        embedding_dropout: float = 0.1,
        norm_first: bool = False,
    ) -> None:
        super().__init__(
            num_embeddings,
            num_classes,
            d_model,
            padding_idx=padding_idx,
            embedding_dropout=embedding_dropout,
        )
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        layer = nn.TransformerEncoderLayer(
            d_model,
            num_heads,
            dim_feedforward,
            dropout,
            batch_first=True,
            norm_first=norm_first,
        )
        # nested tensors would drop the padded positions the pooling then masks anyway
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.init_weights()

    def init_weights(self) -> None:
        """PyTorch's own initialisation of the encoder layers (as ``nn.Transformer`` users get
        it), the shared stem and head as :class:`DeLighTClassifier`'s."""
        self._init_stem_and_head()

    def encode(self, x: Tensor, padding_mask: Tensor) -> Tensor:
        return self.encoder(x, src_key_padding_mask=padding_mask)  # (B, T, d_m)
