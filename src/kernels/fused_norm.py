"""Batch norm inside the fused passes (DiCE's local fusion, EESP's pyramid): the arithmetic around
the kernels that both share.

A fused pass never writes BN's input h, so BN runs as a per-channel affine map
``z = scale * h + shift`` inside the kernels. What is left to PyTorch, on (C,) vectors:

- training: mean, biased variance, 1/std, scale and shift from the per-channel sums of h and h^2
  (:func:`batch_statistics`), BN's backward from the sums of dz and dz (h - mean)
  (:func:`batch_norm_backward`), and the running statistics (:func:`update_running_statistics`,
  :func:`batch_norm_factor`);
- inference: scale and shift from the running statistics (:func:`running_affine`);
- and :func:`timed_pass`, one candidate call as ``impl="auto"`` times a pass against its eager
  counterpart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


def batch_statistics(
    sums: Tensor, count: int, gamma: Tensor, beta: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Mean, biased variance, 1/sqrt(var + eps), and BN's ``scale = gamma / std`` and
    ``shift = beta - mean scale``, from float64 per-channel sums (the E[h^2] - E[h]^2 variance
    needs their digits), all float32.

    Shape:
        sums (2, C) float64 (sum h, sum h^2), gamma and beta (C,) -> five (C,)
    """
    total, squares = sums
    mean64 = total / count
    mean = mean64.float()
    var = (squares / count - mean64 * mean64).clamp_min(0).float()
    rstd = torch.rsqrt(var + eps)
    scale = gamma * rstd
    return mean, var, rstd, scale, beta - mean * scale


def batch_norm_backward(
    sum_dz: Tensor, sum_dz_centred: Tensor, rstd: Tensor, scale: Tensor, count: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """BN's weight and bias gradients and the coefficients of its input gradient,
    ``dh = scale dz + q (h - mean) + r``, i.e. ``scale (dz - mean(dz) - x_hat mean(dz x_hat))``
    with ``x_hat = (h - mean) rstd``.

    Shape:
        sum_dz, sum_dz_centred (sum dz (h - mean)), rstd, scale (C,) -> grad_gamma, grad_beta,
        q, r, each (C,)
    """
    grad_gamma = rstd * sum_dz_centred  # sum dz x_hat
    q = -scale * rstd * grad_gamma / count
    r = -scale * sum_dz / count
    return grad_gamma, sum_dz, q, r


def check_batch(count: int, shape: Sequence[int]) -> None:
    """BN's training-mode rule: more than one value per channel."""
    if count < 2:
        raise ValueError(
            f"expected more than 1 value per channel when training, got input {tuple(shape)}"
        )


def update_running_statistics(
    running_mean: Tensor | None,
    running_var: Tensor | None,
    mean: Tensor,
    var: Tensor,
    count: int,
    momentum: float,
) -> None:
    """``F.batch_norm``'s in-place update (unbiased variance) where running statistics exist."""
    if running_mean is None or running_var is None:
        return
    with torch.no_grad():
        running_mean.lerp_(mean.to(running_mean.dtype), momentum)
        running_var.lerp_((var * (count / (count - 1))).to(running_var.dtype), momentum)


def running_affine(
    running_mean: Tensor | None, running_var: Tensor | None, gamma: Tensor, beta: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """Eval-mode BN as float32 ``(scale, shift)``.

    Shape:
        (C,) each -> two (C,)
    """
    if running_mean is None or running_var is None:
        raise ValueError("training=False needs the running statistics")
    scale = gamma * torch.rsqrt(running_var.float() + eps)
    return scale, beta - running_mean.float() * scale


def refuse_autograd(op: str, *operands: Tensor | None) -> None:
    """An inference pass has no backward: refuse it where autograd would record one."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in operands):
        raise RuntimeError(
            f"the fused {op} has no backward with running statistics: call it under "
            "torch.no_grad() or in training mode"
        )


def batch_norm_factor(norm: nn.BatchNorm2d, *, advance: bool) -> float:
    """The running-statistics factor of a training-mode ``norm`` for a fused pass that updates them
    itself (``F.batch_norm``'s ``momentum``): with ``advance``, the batch is counted in
    ``num_batches_tracked`` and ``momentum=None`` (a cumulative average) is resolved as
    ``nn.BatchNorm2d`` does."""
    momentum = 0.0 if norm.momentum is None else norm.momentum
    if advance and norm.training and norm.num_batches_tracked is not None:
        norm.num_batches_tracked.add_(1)
        if norm.momentum is None:
            momentum = 1.0 / float(norm.num_batches_tracked)
    return momentum


def timed_pass(
    unit: nn.Module, x: Tensor, forward: Callable[[Tensor, dict], Tensor], args: dict
) -> None:
    """One call of a fused pass or of its eager counterpart, as ``impl="auto"`` times them: on
    copies of the running statistics (the unit's stay as they are); in training also the backward,
    by ``torch.autograd.grad`` (no ``.grad`` is touched).

    ``forward(inputs, args)`` runs the candidate on ``x``'s detached copy with ``args``.
    """
    args = {
        **args,
        "running_mean": args["running_mean"].clone(),
        "running_var": args["running_var"].clone(),
    }
    inputs = x.detach().requires_grad_(unit.training)
    with torch.set_grad_enabled(unit.training):
        out = forward(inputs, args)
        if unit.training:
            leaves = [inputs, *(p for p in unit.parameters() if p.requires_grad)]
            torch.autograd.grad(out, leaves, torch.ones_like(out), allow_unused=True)
