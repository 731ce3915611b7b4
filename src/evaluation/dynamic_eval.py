"""Dynamic evaluation (Krause et al. 2018, "Dynamic Evaluation of Neural Sequence Models", RMS
variant; reference ``benkrause/dynamic-evaluation`` ``dynamiceval.py``): the network keeps
adapting to the text it scores, as the thesis does for its PTB test numbers (Sec. 4.4.2).

1. Gradient statistics on training data, in short segments over many rows, state carried:
   ``MS_p = sqrt(mean over segments of grad_p ** 2)`` (element-wise), and decay rates
   ``decrate_p = MS_p / mean over parameters of mean(MS_p)``, clipped at ``1 / lamb``.
2. Over the evaluated stream (one row), segment by segment: score the segment (its loss counts
   before the update), back-propagate its token-mean loss, then
   ``theta <- theta + lamb * decrate * (theta0 - theta) - lr * grad / (MS_p + epsilon)``.

Both passes run the network in eval mode (no dropout), as the reference does; cuDNN is off
meanwhile, since its recurrent kernels back-propagate in training mode only. The network's
weights are restored afterwards.

The defaults are the reference's current ("new scaling") ones, ``lr = 5e-5, lamb = 2e-3,
epsilon = 2e-5`` with segments of 5 tokens and statistics over 100 rows; the paper's AWD-LSTM
setting is ``lr = 2e-3, lamb = 2e-2, epsilon = 1e-3`` with ``old_hyper=True``, which divides
``lamb`` by the number of parameter tensors and ``lr`` and ``epsilon`` by the square root of the
number of statistics segments (the reference's ``--oldhyper``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.models.awd_lm import Hidden
from src.models.awd_state import carried_hidden, detach_hidden
from src.utils.progress import Progress


@dataclass(frozen=True)
class DynamicEvalResult:
    """Token-mean NLL (nats) of the evaluated stream, its perplexity, and how many tokens."""

    loss: float
    ppl: float
    tokens: int


def segments(
    batches: Iterable[tuple[Tensor, Tensor]], seq_len: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """Cut a stream of batches whose rows continue across batches into windows of ``seq_len``
    steps (the last one shorter), in stream order.

    Shape:
        batches: ((B, T_i) inputs, (B, T_i) targets) -> ((B, seq_len) inputs, (B, seq_len) targets)
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    inputs: Tensor | None = None
    targets: Tensor | None = None
    for new_inputs, new_targets in batches:
        if inputs is None or targets is None:
            inputs, targets = new_inputs, new_targets
        else:
            inputs = torch.cat([inputs, new_inputs], 1)
            targets = torch.cat([targets, new_targets], 1)
        while inputs.shape[1] >= seq_len:
            yield inputs[:, :seq_len], targets[:, :seq_len]
            inputs, targets = inputs[:, seq_len:], targets[:, seq_len:]
    if inputs is not None and targets is not None and inputs.shape[1] > 0:
        yield inputs, targets


def _segment_loss(
    net: nn.Module, inputs: Tensor, targets: Tensor, hidden: Hidden | None
) -> tuple[Tensor, Hidden]:
    """Summed NLL of a segment and the detached state after it."""
    out = net(inputs, carried_hidden(net, hidden, inputs.shape[0]))
    nll = F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
    return nll, detach_hidden(out.hidden)


def gradient_statistics(
    net: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    max_batches: int | None = None,
) -> tuple[list[Tensor], int]:
    """Root mean square of each parameter's gradient of the token-mean loss over ``batches``
    (at most ``max_batches``), the state carried; returns ``(MS per parameter, batches used)``.

    The network is used as it is (call it in eval mode); gradients are left set.

    Shape:
        batches: ((B, T) inputs, (B, T) targets)
    """
    params = [p for p in net.parameters() if p.requires_grad]
    device = params[0].device
    squares = [torch.zeros_like(p) for p in params]
    hidden: Hidden | None = None
    used = 0
    count = len(batches) if isinstance(batches, Sized) else None
    if max_batches is not None:
        count = max_batches if count is None else min(count, max_batches)
    progress = Progress("dynamic evaluation: gradient statistics, training segments", count)
    for inputs, targets in batches:
        if max_batches is not None and used >= max_batches:
            break
        inputs, targets = inputs.to(device), targets.to(device)
        net.zero_grad(set_to_none=True)
        nll, hidden = _segment_loss(net, inputs, targets, hidden)
        (nll / targets.numel()).backward()
        for square, p in zip(squares, params):
            if p.grad is not None:
                square.add_(p.grad.detach().square())
        used += 1
        progress.step()
    progress.done()
    if used == 0:
        raise ValueError("no training batches for the gradient statistics")
    return [torch.sqrt(square / used) for square in squares], used


def dynamic_evaluate(
    net: nn.Module,
    train_batches: Iterable[tuple[Tensor, Tensor]],
    test_batches: Iterable[tuple[Tensor, Tensor]],
    *,
    lr: float = 5e-5,
    lamb: float = 2e-3,
    epsilon: float = 2e-5,
    max_batches: int | None = None,
    old_hyper: bool = False,
) -> DynamicEvalResult:
    """Score ``test_batches`` by dynamic evaluation (module docstring).

    Args:
        net: a recurrent LM called as ``net(tokens, hidden)`` (``logits``, ``hidden``) with
            ``init_hidden(B)`` (:class:`src.models.awd_lm.AWDLanguageModel`); its weights and
            train/eval mode are restored on return.
        train_batches: segments of the training stream for the gradient statistics (reference:
            100 rows, 5 steps; :func:`segments` cuts a data module's batches).
        test_batches: the evaluated stream in segments, in order (reference: 1 row, 5 steps).
        lr: the update's step size eta.
        lamb: decay rate lambda towards the trained weights.
        epsilon: added to the gradient RMS in the update's denominator.
        max_batches: at most this many training segments for the statistics (None: all).
        old_hyper: rescale ``lamb``, ``lr``, ``epsilon`` as the reference's ``--oldhyper``.

    Shape:
        batches: ((B, T) int64 inputs, (B, T) int64 targets); rows continue across batches
    """
    if lr < 0 or lamb < 0 or epsilon <= 0:
        raise ValueError(f"need lr >= 0, lamb >= 0, epsilon > 0; got {lr}, {lamb}, {epsilon}")
    params = [p for p in net.parameters() if p.requires_grad]
    device = params[0].device
    trained = [p.detach().clone() for p in params]
    was_training = net.training
    net.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    tokens = 0
    try:
        with torch.backends.cudnn.flags(enabled=False):
            rms, used = gradient_statistics(net, train_batches, max_batches=max_batches)
            if old_hyper:
                lamb = lamb / len(params)
                lr, epsilon = lr / math.sqrt(used), epsilon / math.sqrt(used)
            scale = torch.stack([m.mean() for m in rms]).mean()
            decay = [m / scale for m in rms]
            if lamb > 0:
                # a rate above 1/lamb would step past theta0
                decay = [d.clamp_max(1 / lamb) for d in decay]
            hidden: Hidden | None = None
            count = len(test_batches) if isinstance(test_batches, Sized) else None
            progress = Progress("dynamic evaluation: test segments", count)
            for inputs, targets in test_batches:
                inputs, targets = inputs.to(device), targets.to(device)
                net.zero_grad(set_to_none=True)
                nll, hidden = _segment_loss(net, inputs, targets, hidden)
                total += nll.detach()
                tokens += targets.numel()
                (nll / targets.numel()).backward()
                with torch.no_grad():
                    for p, p0, d, m in zip(params, trained, decay, rms):
                        step = lamb * d * (p0 - p)
                        if p.grad is not None:
                            step -= lr * p.grad / (m + epsilon)
                        p.add_(step)
                progress.step()
            progress.done()
    finally:
        with torch.no_grad():
            for p, p0 in zip(params, trained):
                p.copy_(p0)
        net.zero_grad(set_to_none=True)
        net.train(was_training)
    if tokens == 0:
        raise ValueError("no tokens to evaluate")
    loss = float(total) / tokens
    # a diverged run has an infinite perplexity, not an OverflowError
    ppl = math.exp(loss) if loss < math.log(torch.finfo(torch.float64).max) else math.inf
    return DynamicEvalResult(loss=loss, ppl=ppl, tokens=tokens)
