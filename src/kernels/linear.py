"""An ``nn.Linear`` of the text systems run on the GLT kernel where that takes fewer launches.

A dense linear layer is a GLT of one group (:mod:`src.ops.group_linear`): ``W`` (n, k) seen as a
(1, k, n) weight. Run that way on CUDA, the layer

- takes autocast's float32 weight and bias as they are, rounding them to 16 bits as the kernel loads
  them: ``nn.Linear`` under autocast launches a cast of each forward and one of each gradient
  backward, four launches a layer;
- reads its input in two parts in place: DExTra's output layer on ``concat(x0, y)`` needs no
  concatenation;
- computes the bias gradient in the weight gradient's launch.

DeLighT's training steps are launch-bound on a GPU (docs/gpu.md), so those launches are most of a
layer's cost there. Where the GEMM itself dominates, cuBLAS may be faster than the kernel, so
``impl="auto"`` times both on the first call of each shape (a training step where autograd wants
the backward) and keeps the faster (the kernel without casts against ``F.linear`` with them).
Elsewhere (the CPU, export) the layer runs as ``nn.Linear``; ``torch.compile`` traces the path the
eager steps chose (or the default), the kernel as a custom op. Both compute the same
products in float32 accumulation: the results differ by rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels import (
    Timer,
    autocast_dtype,
    candidate_steps,
    choose,
    declare,
    needs_backward,
    size_bucket,
    use_triton,
)
from src.kernels.group_linear import interleaved_group_linear


def linear(parts: Sequence[Tensor], layer: nn.Linear, *, impl: str = "auto") -> Tensor:
    """``layer`` on the concatenation of ``parts`` along the features.

    ``impl``: "reference" runs ``layer`` itself (after ``torch.cat`` for two parts); "triton" the
    GLT kernel; "auto" the kernel or ``layer``, whichever :func:`linear_path` measured faster on
    CUDA (traced by ``torch.compile``, that choice untimed), and ``layer`` elsewhere.

    Shape:
        parts (..., d_j), one or two with the same leading dimensions, sum_j d_j =
        layer.in_features -> (..., layer.out_features)
    """
    if not _kernel_wanted(parts, layer.weight, layer.bias, impl):
        return layer(parts[0] if len(parts) == 1 else torch.cat(tuple(parts), dim=-1))
    return _on_kernel(parts, layer.weight, layer.bias)


def linear_weights(
    parts: Sequence[Tensor], weight: Tensor, bias: Tensor | None, *, impl: str = "auto"
) -> Tensor:
    """:func:`linear` with a weight and bias that belong to no one layer (e.g. several layers'
    stacked): ``F.linear`` where :func:`linear` runs the layer.

    Shape:
        parts (..., d_j), weight (n, sum_j d_j), bias (n,) or None -> (..., n)
    """
    if not _kernel_wanted(parts, weight, bias, impl):
        x = parts[0] if len(parts) == 1 else torch.cat(tuple(parts), dim=-1)
        return F.linear(x, weight, bias)
    return _on_kernel(parts, weight, bias)


def _kernel_wanted(parts: Sequence[Tensor], weight: Tensor, bias: Tensor | None, impl: str) -> bool:
    return (
        len(parts) <= 2
        and use_triton(impl, parts[0])
        and (impl == "triton" or linear_path(parts, weight, bias) == "triton")
    )


def _on_kernel(parts: Sequence[Tensor], weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` with ``weight`` and ``bias`` as a GLT of one group on its kernel.

    Shape:
        parts (..., d_j), weight (n, k), bias (n,) or None -> (..., n)
    """
    lead = parts[0].shape[:-1]
    flat = tuple(p.reshape(-1, p.shape[-1]) for p in parts)  # (M, d_j)
    grouped = weight.t().unsqueeze(0)  # (n, k) -> (1, k, n), a view
    bias = None if bias is None else bias.unsqueeze(0)  # (1, n)
    y = interleaved_group_linear(flat, grouped, bias, shuffle=False, impl="triton")
    return y.view(*lead, weight.shape[0])


CHOICE = declare("linear", ("triton", "reference"))


def linear_path(
    parts: Sequence[Tensor], weight: Tensor, bias: Tensor | None, timer: Timer | None = None
) -> str:
    """``impl="auto"`` on CUDA: "triton" or "reference", whichever call (a training step when
    autograd wants the backward) ran faster on the first call with these shapes (rows by
    :func:`~src.kernels.size_bucket`), dtypes and mode (:func:`~src.kernels.choose`). Both are
    timed as they would run, under the caller's autocast: ``F.linear`` with its casts.

    Shape:
        parts (..., d_j), weight (n, sum_j d_j), bias (n,) or None
    """
    device = parts[0].device
    rows = parts[0].numel() // max(parts[0].shape[-1], 1)
    key = (
        size_bucket(rows), tuple(p.shape[-1] for p in parts), weight.shape[0],
        bias is not None, parts[0].dtype, autocast_dtype(device.type), str(device),
        needs_backward(weight, bias, *parts),
    )  # fmt: skip

    def run(path: str, weight: Tensor, bias: Tensor | None, *xs: Tensor) -> Tensor:
        if path == "triton":
            return _on_kernel(xs, weight, bias)
        x = xs[0] if len(xs) == 1 else torch.cat(xs, dim=-1)
        return F.linear(x, weight, bias)

    def candidates() -> dict:
        names = ("triton", "reference")
        return candidate_steps(run, names, weight, bias, *parts)

    # both sum in a fixed order; the kernel takes fewer launches
    return choose(CHOICE, key, candidates, default="triton", timer=timer)
