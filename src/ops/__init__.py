"""The papers' efficient transforms: each a plain PyTorch reference beside a fused Triton kernel.

Ops import nothing from models, tasks or datamodules.
"""
