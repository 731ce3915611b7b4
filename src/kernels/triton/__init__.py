"""Fused Triton kernels of the ops: ``<op>.py`` holds the kernels of :mod:`src.ops.<op>`.

Each kernel module imports ``triton``, which is optional: the ops import a kernel module only
where they launch it (``impl="triton"``, or ``"auto"`` on CUDA with Triton importable; the rule is
:func:`src.kernels.dispatch.use_triton`). A kernel module imports its op's contract
(:mod:`src.kernels.contracts`), the dispatch rules (:mod:`src.kernels.dispatch`) and the launch
configuration (:mod:`src.kernels.triton.launch`, :mod:`src.kernels.triton.stencil`), never the op
module or the other back-ends.
"""
