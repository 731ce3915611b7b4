"""The launch rules the Triton kernels share: grids and per-device launch (:mod:`.launch`), the
tiles of the stencil kernels (:mod:`.stencil`), the norms' row programs (:mod:`.norm_rows`) and
their column sums (:mod:`.norm_columns`).

The kernels themselves sit beside their ops, ``src/kernels/<op>/triton_kernel.py``. Each imports
``triton``, which is optional: an op imports its kernel module only where it launches it
(``impl="triton"``, or ``"auto"`` on CUDA with Triton importable; the rule is
:func:`src.kernels.dispatch.use_triton`). A kernel module imports its op's contract
(``src/kernels/<op>/contract.py``), the dispatch rules (:mod:`src.kernels.dispatch`) and these
launch rules, never the op's concept or its other back-ends.
"""
