"""Gradient clipping for fused optimisers under mixed precision.

Every task builds its optimiser with ``fused=True`` (one multi-tensor kernel a step). A fused
optimiser unscales fp16 gradients inside its own step, so Lightning's mixed-precision plugin
refuses to clip for it ("does not allow for gradient clipping because it performs unscaling of
gradients internally"), in ``bf16-mixed`` too, where nothing is scaled at all. The recipes of the
character and word language models clip (``trainer.gradient_clip_val``), so they could not train
on a GPU. :class:`FusedOptimizerClipping` clips such an optimiser's gradients itself: it unscales
them first where a gradient scaler is at work (``16-mixed``; the fused step then uses them as they
are, ``torch.amp.GradScaler`` records that they are unscaled), then clips by norm or value as
Lightning would.
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer


def handles_unscaling(optimizer: Optimizer) -> bool:
    """Whether ``optimizer`` unscales gradients in its step (a fused one), as Lightning checks."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


class FusedOptimizerClipping:
    """LightningModule mixin (first in the bases): ``trainer.gradient_clip_val`` for fused
    optimisers in every precision."""

    def configure_gradient_clipping(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        if not gradient_clip_val or not handles_unscaling(optimizer):
            super().configure_gradient_clipping(  # type: ignore[misc]
                optimizer, gradient_clip_val, gradient_clip_algorithm
            )
            return
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)  # type: ignore[attr-defined]
        if scaler is not None:
            scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        # Lightning passes "norm" | "value" or its enum of them (a str subclass); None means norm
        if str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)) == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
