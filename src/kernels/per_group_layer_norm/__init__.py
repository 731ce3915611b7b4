"""Group-Transformer's per-group layer norm's kernels: the contract (``contract.py``), the Triton
kernels (``triton_kernel.py``) and the C++ kernels (``per_group_layer_norm.cpp``), forward and
backward. The op, its reference and its choice of path are :mod:`src.ops.per_group_layer_norm`.
"""
