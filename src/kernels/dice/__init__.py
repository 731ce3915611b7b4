"""The DiCE unit's C++ kernel (``dice.cpp``): DimConv, DimFuse and the unit's BN + PReLU in one pass
over a channels-last map, for folded inference on the CPU. The unit is
:class:`src.ops.dice.DiCE`; it calls the kernel through :func:`src.kernels.cpu.cpu_kernels`.
"""
