"""The papers' efficient transforms: each a plain PyTorch reference with a fused Triton kernel beside it.

Ops import nothing from models, tasks or datamodules.
"""
