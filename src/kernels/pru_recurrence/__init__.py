"""The PRU recurrence's kernels: the contract (``contract.py``), the C++ time loop
(``pru_recurrence.cpp``), the Triton time loop (``triton_time_loop.py``) and the per-step Triton
kernels (``triton_kernel.py``). The recurrence, its reference and its choice of path are
:mod:`src.ops.pru_recurrence`.
"""
