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
``impl="auto"`` times both forwards on the first call of each shape and keeps the faster (the kernel
without casts against ``F.linear`` with them). Elsewhere (the CPU, export, ``torch.compile``, which
fuses around ``nn.Linear``'s own product) the layer runs as ``nn.Linear``. Both compute the same
products in float32 accumulation: the results differ by rounding.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.kernels.choices import ChoiceCache
from src.kernels.dispatch import Timer, autocast_dtype, fastest, size_bucket, use_triton
from src.ops.group_linear import interleaved_group_linear


def linear(parts: Sequence[Tensor], layer: nn.Linear, *, impl: str = "auto") -> Tensor:
    """``layer`` on the concatenation of ``parts`` along the features.

    ``impl``: "reference" runs ``layer`` itself (after ``torch.cat`` for two parts); "triton" the
    GLT kernel; "auto" the kernel or ``layer``, whichever :func:`linear_path` measured faster on
    CUDA, and ``layer`` elsewhere and under ``torch.compile``.

    Shape:
        parts (..., d_j), one or two with the same leading dimensions, sum_j d_j =
        layer.in_features -> (..., layer.out_features)
    """
    x = parts[0]
    # "auto" under torch.compile: nn.Linear, which inductor fuses around; "triton" is obeyed
    kernel = (
        len(parts) <= 2
        and use_triton(impl, x)
        and (
            impl == "triton"
            or (not torch.compiler.is_compiling() and linear_path(parts, layer) == "triton")
        )
    )
    if not kernel:
        return layer(x if len(parts) == 1 else torch.cat(tuple(parts), dim=-1))
    return _on_kernel(parts, layer)


def _on_kernel(parts: Sequence[Tensor], layer: nn.Linear) -> Tensor:
    """``layer`` as a GLT of one group on its kernel.

    Shape:
        parts (..., d_j) -> (..., n)
    """
    lead = parts[0].shape[:-1]
    flat = tuple(p.reshape(-1, p.shape[-1]) for p in parts)  # (M, d_j)
    weight = layer.weight.t().unsqueeze(0)  # (n, k) -> (1, k, n), a view
    bias = None if layer.bias is None else layer.bias.unsqueeze(0)  # (1, n)
    y = interleaved_group_linear(flat, weight, bias, shuffle=False, impl="triton")
    return y.view(*lead, layer.out_features)


# (row bucket, part widths, n, bias, input dtype, autocast dtype, device) -> "triton" or
# "reference"
_linear_choice: dict[tuple, str] = ChoiceCache("linear")


def linear_path(parts: Sequence[Tensor], layer: nn.Linear, timer: Timer | None = None) -> str:
    """``impl="auto"`` on CUDA: "triton" or "reference", whichever forward ran faster on the first
    call with these shapes (rows by :func:`src.kernels.dispatch.size_bucket`) and dtypes
    (:func:`src.kernels.dispatch.fastest`, kept for the process and on disk). Both are timed as they
    would run, under the caller's autocast: ``nn.Linear`` with its casts."""
    device = parts[0].device
    rows = parts[0].numel() // max(parts[0].shape[-1], 1)
    key = (
        size_bucket(rows), tuple(p.shape[-1] for p in parts), layer.out_features,
        layer.bias is not None, parts[0].dtype, autocast_dtype(device.type), str(device),
    )  # fmt: skip

    def run(path: str) -> Tensor:
        with torch.no_grad():
            if path == "triton":
                return _on_kernel(parts, layer)
            x = parts[0] if len(parts) == 1 else torch.cat(tuple(parts), dim=-1)
            return F.linear(x, layer.weight, layer.bias)

    def candidates() -> dict:
        return {path: functools.partial(run, path) for path in ("triton", "reference")}

    # both sum in a fixed order; the kernel takes fewer launches
    return fastest(_linear_choice, key, candidates, timer, deterministic="triton")
