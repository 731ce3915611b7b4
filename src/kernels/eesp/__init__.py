"""The EESP pyramid's kernels: its contract (``contract.py``), the Triton kernel of the K dilated
branches, the hierarchical sum, BN and PReLU in registers (``triton_kernel.py``) and the C++ kernel
of
the same for folded inference (``eesp.cpp``). The unit is :class:`src.ops.eesp.EESP`.
"""
