"""DeLighT's per-group LayerNorm's kernels: the contract (``contract.py``) and the Triton kernels
of the norm, swish and dropout after each GLT, one launch each way (``triton_kernel.py``). The op,
its
reference and its choice of path are :mod:`src.ops.shared_group_layer_norm`.
"""
