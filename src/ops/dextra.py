"""DExTra, the DeLighT transformation: a deep, light expand-reduce stack of GLTs with input mixing.

DeLighT (Mehta et al., 2021, Sec. 3.1; thesis Ch. 5): an input layer projects the d_in-dimensional
input (d_model inside a DeLighT block) to p features (x0); N group linear transformations (GLTs)
then first expand the width towards d_max = w_m * d_in and reduce it again, each followed by feature
shuffle, a per-group LayerNorm and swish; before every GLT the *input mixer* interleaves chunks of
x0 with chunks of the previous GLT's output; an output layer maps concat(x0, last output) to o
features.

This module follows the released code (sacmehta/delight), which differs from the thesis text:

- Groups. Thesis Eq. 5.2: g^l = min(2^(l-1), g_max) for the ceil(N/2) expansion layers, so the first
  GLT has one group. Code: g^l = min(2^l, g_max), so it **starts at 2 groups**. Both mirror the list
  for the reduction layers (the middle entry twice when N is even).
- Maximum groups. Thesis: g_max = ceil(d_model / 32). Code: 2^ceil(log2(d_model / 32)); they
  differ for d_model = 384 (12 vs 16) and 640 (20 vs 32). See :func:`dextra_max_groups`.
- Widths, the code's rule (both schedules here use it): int(linspace(p, d_max, ceil(N/2)))
  mirrored, with d_max = w_m times the unit's *input* width, not w_m * p; every width but the last
  is rounded up to a multiple of max(g^l, g^(l+1), 8), and the last GLT outputs o.
- The mixer mixes x0 (the projected input), not the raw input, and the output layer is
  Linear(o + p -> o) followed by LayerNorm and swish, like every other layer of the unit.

``schedule="official"`` (default) reproduces the code, ``schedule="paper"`` the thesis groups;
g_max is an argument either way (:func:`dextra_max_groups` gives both rules).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor, nn

from src.kernels.dispatch import check_impl
from src.kernels.dropout.contract import DropoutSeeds
from src.kernels.fan_out import fan_out
from src.kernels.group_linear import interleaved_group_linear
from src.kernels.linear import linear
from src.kernels.shared_group_layer_norm import shared_group_layer_norm_swish
from src.ops.group_linear import GroupLinear
from src.ops.shared_group_layer_norm import SharedGroupLayerNorm

SCHEDULES = ("official", "paper")


@dataclass(frozen=True)
class DExTraSchedule:
    """Per-GLT sizes of one DExTra unit: ``groups[l]``, ``in_widths[l]``, ``out_widths[l]``."""

    groups: tuple[int, ...]
    in_widths: tuple[int, ...]
    out_widths: tuple[int, ...]


def _check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return schedule


def dextra_max_groups(d_model: int, *, schedule: str = "official") -> int:
    """g_max for the model width d_model: 2^ceil(log2(d_model/32)) (code) or ceil(d_model/32)
    (thesis)."""
    if d_model < 1:
        raise ValueError(f"d_model must be positive, got {d_model}")
    if _check_schedule(schedule) == "paper":
        return math.ceil(d_model / 32)
    return 2 ** math.ceil(math.log2(d_model / 32)) if d_model > 32 else 1


def _linspace(start: float, stop: float, num: int) -> list[float]:
    # numpy.linspace's arithmetic (start + i * step, last point exactly stop), so that the
    # truncation below matches the official schedule bit for bit
    if num == 1:
        return [float(start)]
    step = (stop - start) / (num - 1)
    return [start + i * step for i in range(num - 1)] + [float(stop)]


def dextra_schedule(
    in_proj_features: int,
    d_max: float,
    out_features: int,
    *,
    depth: int,
    max_groups: int,
    schedule: str = "official",
) -> DExTraSchedule:
    """Groups and widths of the N GLTs of a DExTra unit (see the module docstring).

    Args:
        in_proj_features: p, the width of x0 and of the first GLT's input.
        d_max: the expanded width the widths widen towards, w_m * d_in (official
            ``max_features``; a float, as the code computes it).
        out_features: o, the last GLT's output width.
        depth: N, the number of GLTs.
        max_groups: g_max.
        schedule: ``"official"`` (groups 2, 4, ...) or ``"paper"`` (groups 1, 2, ..., Eq. 5.2).
    """
    if depth < 1 or max_groups < 1 or min(in_proj_features, d_max, out_features) < 1:
        raise ValueError(
            f"need depth >= 1, max_groups >= 1 and positive widths, got depth={depth}, "
            f"max_groups={max_groups}, in_proj_features={in_proj_features}, d_max={d_max}, "
            f"out_features={out_features}"
        )
    first = 0 if _check_schedule(schedule) == "paper" else 1
    n_expand = math.ceil(depth / 2)
    groups = [min(2 ** (first + layer), max_groups) for layer in range(n_expand)]
    widths = [int(w) for w in _linspace(in_proj_features, d_max, n_expand)]
    # reduction mirrors the expansion; with N even the widest layer appears twice
    keep = n_expand if depth % 2 == 0 else n_expand - 1
    groups += groups[:keep][::-1]
    widths += widths[:keep][::-1]
    out = []
    for layer, width in enumerate(widths[:-1]):
        multiple = max(groups[layer], groups[layer + 1], 8)
        out.append(math.ceil(width / multiple) * multiple)
    out.append(out_features)
    ins = [in_proj_features] + [width + in_proj_features for width in out[:-1]]
    return DExTraSchedule(groups=tuple(groups), in_widths=tuple(ins), out_widths=tuple(out))


class DExTra(nn.Module):
    """The DeLighT transformation (official semantics; README "DExTra semantics").

    Args:
        in_features: d_in (d_model inside a DeLighT block, the lookup's embedding_dim in the
            embedding unit).
        in_proj_features: p, the input layer's width (x0, mixed into every GLT input): d_o in a
            block, d_model / 2 in the embedding.
        out_features: o, the unit's output width: d_o in a block, d_model in the embedding.
        width_multiplier: w_m; the widest GLT has about d_max = w_m * in_features outputs.
        depth: N, the number of GLTs.
        max_groups: g_max (see :func:`dextra_max_groups`).
        schedule: ``"official"`` or ``"paper"`` group schedule (see :func:`dextra_schedule`).
        dropout: applied after every swish, as the official ``dextra_dropout``.
        eps: of every LayerNorm.
        impl: the GLTs' implementation, ``"auto"``, ``"reference"`` or ``"triton"``.
        glt_shuffle: shuffle each GLT's output features across groups (official
            ``--no-glt-shuffle`` turns it off); a permutation, so no parameter depends on it.

    Submodules: ``input_layer``/``input_norm`` (Linear(d_in -> p), LayerNorm(p)),
    ``glts``/``glt_norms`` (the N shuffled GLTs and their :class:`SharedGroupLayerNorm`),
    ``output_layer``/``output_norm`` (Linear(p + o -> o), LayerNorm(o)).

    Shape:
        (..., d_in) -> (..., o)
    """

    def __init__(
        self,
        in_features: int,
        in_proj_features: int,
        out_features: int,
        *,
        width_multiplier: float,
        depth: int,
        max_groups: int,
        schedule: str = "official",
        dropout: float = 0.0,
        eps: float = 1e-5,
        impl: str = "auto",
        glt_shuffle: bool = True,
    ) -> None:
        super().__init__()
        d_max = width_multiplier * in_features
        plan = dextra_schedule(
            in_proj_features, d_max, out_features, depth=depth, max_groups=max_groups,
            schedule=schedule,
        )  # fmt: skip
        mixed = plan.groups[1:] + (1,)
        bad = [
            (layer, g)
            for layer, g in enumerate(plan.groups)
            if in_proj_features % g or in_proj_features % mixed[layer]
        ]
        bad += [
            (layer, g)
            for layer, g in enumerate(plan.groups)
            if plan.out_widths[layer] % mixed[layer]
        ]
        if bad:
            raise ValueError(
                f"DExTra schedule {plan} cannot be built: in_proj_features={in_proj_features} "
                "and the GLT widths must be divisible by the groups of their GLT and the next "
                f"one; (layer, groups) {bad}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.in_features = in_features
        self.in_proj_features = in_proj_features
        self.out_features = out_features
        self.plan = plan
        self.schedule = schedule
        self.dropout = dropout
        self.eps = eps
        self.impl = check_impl(impl)
        self.glt_shuffle = glt_shuffle
        self.input_layer = nn.Linear(in_features, in_proj_features)
        self.input_norm = nn.LayerNorm(in_proj_features, eps=eps)
        self.glts = nn.ModuleList(
            GroupLinear(d_in, d_out, g, shuffle=glt_shuffle, impl=impl)
            for g, d_in, d_out in zip(plan.groups, plan.in_widths, plan.out_widths, strict=True)
        )
        self.glt_norms = nn.ModuleList(
            SharedGroupLayerNorm(d_out, g, eps=eps)
            for g, d_out in zip(plan.groups, plan.out_widths, strict=True)
        )
        self.output_layer = nn.Linear(in_proj_features + out_features, out_features)
        self.output_norm = nn.LayerNorm(out_features, eps=eps)

    def reset_parameters(self) -> None:
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def _norm_swish(self, x: Tensor, groups: int, norm: nn.Module, seeds: DropoutSeeds) -> Tensor:
        # LayerNorm, swish and dropout as one op: on CUDA one fused launch each way where it
        # times faster (src/kernels/shared_group_layer_norm/triton_kernel.py), the PyTorch ops
        # elsewhere
        p = self.dropout if self.training else 0.0
        return shared_group_layer_norm_swish(
            x, groups, norm.weight, norm.bias, norm.eps, p=p, seeds=seeds, impl=self.impl
        )

    def forward(self, x: Tensor, seeds: DropoutSeeds | None = None) -> Tensor:
        """DExTra on x; its N + 2 dropouts take their seed from ``seeds`` (those of the
        enclosing forward), else from one seed of the unit's own: one draw a call, not one a
        dropout.

        Shape:
            x (..., in_features) -> (..., out_features)
        """
        seeds = DropoutSeeds() if seeds is None else seeds
        lead = x.shape[:-1]
        # (..., d_in) -> (N, d_in)
        x = x.reshape(-1, self.in_features)
        x0 = linear((x,), self.input_layer, impl=self.impl)
        x0 = self._norm_swish(x0, 1, self.input_norm, seeds)  # (N, p)
        # x0 feeds every GLT and the output layer: its gradients summed in one launch
        mixed = fan_out(x0, len(self.glts) + 1, impl=self.impl)
        y = None
        for k, (glt, norm) in enumerate(zip(self.glts, self.glt_norms, strict=True)):
            # the input mixer as two parts: [x0_1, y_1, ..., x0_g, y_g] is never materialised
            parts = (mixed[k],) if y is None else (mixed[k], y)
            y = interleaved_group_linear(
                parts, glt.weight, glt.bias, shuffle=self.glt_shuffle, impl=self.impl
            )  # (N, out_l)
            y = self._norm_swish(y, norm.groups, norm, seeds)
        # output layer on concat(x0, y): (N, p + o) -> (N, o); on the GLT kernel it reads both in
        # place (src/kernels/linear.py)
        out = linear((mixed[-1], y), self.output_layer, impl=self.impl)
        out = self._norm_swish(out, 1, self.output_norm, seeds)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, in_proj_features={self.in_proj_features}, "
            f"out_features={self.out_features}, groups={self.plan.groups}, "
            f"widths={self.plan.out_widths}, schedule={self.schedule!r}, "
            f"dropout={self.dropout}, impl={self.impl!r}, glt_shuffle={self.glt_shuffle}"
        )
