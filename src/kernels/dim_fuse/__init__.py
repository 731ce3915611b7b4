"""DimFuse's kernels: the contract of its fused training passes (``contract.py``) and the Triton
kernels that run DimConv and the local fusion in registers (``triton_kernel.py``). The op is
:class:`src.ops.dim_fuse.DimFuse`; DiCE chooses the fused path (:mod:`src.ops.dice`).
"""
