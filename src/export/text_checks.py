"""Exported text graphs against eager PyTorch on a real batch of the data module, each through its
runtime of :mod:`src.export.runtime` (the way ``generate.py`` and ``translate.py`` drive them).

Every check returns one dict per compared step: what was compared and the max absolute error
(``max_abs``) and max relative error (max absolute error / max absolute eager output).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from src.export.runtime import OnnxAWDLM, OnnxClassifier, OnnxSegmentLM, OnnxWordLM

SEGMENTS = 3  # chained calls: the state each ends with starts the next
ROWS = 2  # sequences of the batch compared


def errors(what: str, eager: Sequence[Tensor], exported: Sequence[Tensor]) -> dict[str, Any]:
    """Max abs / rel error of ``exported`` against ``eager`` (tensors of equal shapes)."""
    for e, x in zip(eager, exported, strict=True):
        if e.shape != x.shape:
            raise AssertionError(f"{what}: shape {tuple(x.shape)}, eager {tuple(e.shape)}")
    largest = max(float(e.abs().max()) for e in eager if e.numel())
    worst = max(float((e.float() - x.float()).abs().max()) for e, x in zip(eager, exported))
    return {"compared": what, "max_abs": worst, "max_rel": worst / max(largest, 1e-12)}


def tokens_of(batch: Any) -> Tensor:
    """The token ids of a language-model or classification batch ``(tokens, targets)``."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def segment_lm_checks(network: nn.Module, runtime: OnnxSegmentLM, batch: Any) -> list[dict]:
    """``SEGMENTS`` chained segments of the batch's first rows, memories fed back."""
    tokens = tokens_of(batch)[:ROWS]
    length = max(tokens.shape[1] // SEGMENTS, 1)
    # a learnt position table (Group-Transformer) covers tgt_len + mem_len positions
    table = getattr(network, "pos_table", None)
    if table is not None:
        length = min(length, table.max_len - network.mem_len)
    memories = exported = None
    found = []
    with torch.no_grad():
        for step in range(SEGMENTS):
            segment = tokens[:, step * length : (step + 1) * length]
            logits, memories = network(segment, memories)
            onnx_logits, exported = runtime(segment, exported)
            found.append(
                errors(f"segment {step}: logits and memories", [logits, *memories],
                       [onnx_logits, *exported])
            )  # fmt: skip
    return found


def awd_lm_checks(network: nn.Module, runtime: OnnxAWDLM, batch: Any) -> list[dict]:
    """The batch's first rows read from zero state, one exported segment a call."""
    tokens = tokens_of(batch)[:ROWS]
    length = runtime.segment_length * max(tokens.shape[1] // runtime.segment_length, 1)
    tokens = tokens[:, : min(length, SEGMENTS * 4 * runtime.segment_length)]
    with torch.no_grad():
        eager, exported = network(tokens, None), runtime(tokens, None)
    flat = [t for pair in eager.hidden for t in pair]
    onnx_flat = [t for pair in exported.hidden for t in pair]
    return [
        errors(f"{tokens.shape[1]} tokens: logits", [eager.logits], [exported.logits]),
        errors("the state after them", flat, onnx_flat),
    ]


def word_lm_checks(network: nn.Module, runtime: OnnxWordLM, batch: Any) -> list[dict]:
    """Log-probabilities of the batch's first rows."""
    tokens = tokens_of(batch)[:ROWS]
    with torch.no_grad():
        eager = network.log_prob(tokens)
    return [errors(f"log-probabilities of {tuple(tokens.shape)}", [eager], [runtime(tokens)])]


def classifier_checks(network: nn.Module, runtime: OnnxClassifier, batch: Any) -> list[dict]:
    """Logits of the (padded) batch."""
    tokens = tokens_of(batch)
    with torch.no_grad():
        eager = network(tokens)
    return [errors(f"logits of {tuple(tokens.shape)}", [eager], [runtime(tokens)])]


def translation_checks(
    translate: Callable[[Tensor, str], list[Tensor]],
    use_exported: Callable[[bool], None],
    batch: dict,
) -> list[dict]:
    """Greedy and beam search on the batch's sources, eager and exported: the token ids must be
    the same; ``max_abs`` is 0 when they are, else the share of sentences that differ."""
    found = []
    for decoding in ("greedy", "beam"):
        use_exported(False)
        eager = translate(batch["src_tokens"], decoding)
        use_exported(True)
        exported = translate(batch["src_tokens"], decoding)
        use_exported(False)
        differ = sum(not torch.equal(a, b) for a, b in zip(eager, exported, strict=True))
        found.append(
            {
                "compared": f"{decoding} search token ids of {len(eager)} sentences",
                "identical": differ == 0,
                "max_abs": differ / max(len(eager), 1),
            }
        )
    return found
