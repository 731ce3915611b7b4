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

Each op's paths sit together in its folder, ``<op>/``: the entry with its PyTorch reference
(``__init__.py``), the Triton kernels (``triton_kernel.py``), the C++ kernels (``<op>.cpp``, built
by :mod:`.cpu`) and the contract they share (``contract.py``). A contract defines, once, the schema
of each custom op and its fake function (its outputs' metadata while ``torch.compile`` or
``torch.export`` traces), the operand rules the paths share, and for a differentiable op the
``setup_context`` its back-ends' backward rules read; it imports no path. The paths register their
implementations under it: with :func:`src.kernels.custom_ops.autograd_op` a differentiable forward
(its backward kernel as the autograd rule), with :func:`opaque_op` a kernel that an autograd rule
or an autograd Function calls. docs/ops.md lists the folders.
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
    static_size,
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
    "static_size",
    "timings",
    "triton_available",
    "use_triton",
]
