"""Where each op's fast path is chosen, and the rules every back-end of the ops follows.

An op with more than one path (a Triton kernel and PyTorch's on CUDA, a C++ kernel and ATen's on
the CPU) asks :func:`choose` which to take for the call at hand::

    path = choose("group_linear", key, candidates, default="triton")

with ``key`` its shapes, dtypes and mode, and ``candidates()`` building each path as a whole call
to be timed. :func:`choose` answers from, in order: the export rule (:func:`exporting`: the
reference), a forcing environment variable (:mod:`.environment`), deterministic mode (the
default), the process's choices, the committed table of the GPU's architecture, the choices kept
on this machine (:mod:`.choices`), the capture rule (:func:`capturing`: the default, nothing
timed), and only then a measurement (:mod:`.timing`), which it keeps.

The committed tables, ``committed/<arch>.json`` (``sm_90``: the H100 and H200), map an op's name
to a list of entries ``{"key": repr(key), "choice": name, "source": where it was measured}``; an
entry without ``key`` holds for every key of the op that no other entry names. Only what a visit
to such a GPU measured goes in (docs/gpu.md), so ``impl="auto"`` times only what they lack.

:mod:`.dispatch` also holds the rules of ``impl`` (:func:`use_triton`), of export, of autocast for
the ops' own autograd Functions, and of the custom ops ``torch.compile`` sees as one node. The ops
import this package; it imports only PyTorch and :mod:`src.utils`.
"""

from src.kernels.dispatch import (
    ATEN,
    IMPLS,
    OURS,
    autocast_dtype,
    autocast_known,
    autocast_off,
    autocast_operands,
    capture_for_export,
    capturing,
    check_impl,
    check_same_dtype,
    choose,
    chosen,
    declare,
    declared,
    exporting,
    forget,
    opaque_op,
    size_bucket,
    timings,
    triton_available,
    use_triton,
)
from src.kernels.timing import (
    Timer,
    call_with_backward,
    candidate_steps,
    detached,
    needs_backward,
)

__all__ = [
    "ATEN",
    "IMPLS",
    "OURS",
    "Timer",
    "autocast_dtype",
    "autocast_known",
    "autocast_off",
    "autocast_operands",
    "call_with_backward",
    "candidate_steps",
    "capture_for_export",
    "capturing",
    "check_impl",
    "check_same_dtype",
    "choose",
    "chosen",
    "declare",
    "declared",
    "detached",
    "exporting",
    "forget",
    "needs_backward",
    "opaque_op",
    "size_bucket",
    "timings",
    "triton_available",
    "use_triton",
]
