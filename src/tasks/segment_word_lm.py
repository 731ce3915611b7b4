"""Word-level language modelling with segment-level recurrence (Transformer-XL, Group-Transformer
with the adaptive input and softmax; Group-Transformer paper, appendix D, Table 6).

The character task's training and evaluation (:class:`~src.tasks.char_lm.CharLMTask`: ordered
segments, memories carried across batches, token-weighted means over a whole split) with word-level
units: perplexity ``exp(loss)`` instead of bits per character (``train/ppl``, ``val/ppl``,
``test/ppl``). The network scores its own outputs (``net.loss``: the adaptive softmax forms no
(B, T, V) tensor).
"""

from __future__ import annotations

from torch import Tensor

from src.tasks.char_lm import CharLMTask


class SegmentWordLMTask(CharLMTask):
    """Trains ``net`` by next-word cross-entropy; logs loss (nats) and perplexity.

    Args: as :class:`~src.tasks.char_lm.CharLMTask`.

    Shape:
        batch: ((B, T) int64 inputs, (B, T) int64 targets)
    """

    def units(self, nll: Tensor) -> dict[str, Tensor]:
        """Perplexity, ``exp`` of the mean NLL in nats."""
        return {"ppl": nll.exp()}
