"""What the fairseq-family text models share (DeLighT, and the Transformer baselines beside it):
fairseq's padding index and the official DeLighT initialisation.
"""

from __future__ import annotations

import torch
from torch import nn

from src.ops.group_linear import GroupLinear
from src.ops.shared_group_layer_norm import SharedGroupLayerNorm

PADDING_IDX = 1  # fairseq's dictionary: <s>=0, <pad>=1, </s>=2, <unk>=3


def init_official(root: nn.Module, skip: nn.Module | None = None) -> None:
    """The official DeLighT initialisation (sacmehta/delight ``nn_functions.py``) of every module
    under ``root`` but those under ``skip``: lookup tables N(0, embedding_dim^-0.5) with a zero pad
    row; every Linear and GLT weight xavier-uniform (a GLT's (g, d_in/g, d_out/g) tensor as one
    3-d tensor, as the official ``GroupLinear`` does) and zero biases; LayerNorms at weight 1 and
    bias 0."""
    skipped = {id(m) for m in skip.modules()} if skip is not None else set()
    for module in root.modules():
        if id(module) in skipped:
            continue
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=module.embedding_dim**-0.5)
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, GroupLinear):
            # one group is the official dense Linear: xavier over its (d_in, d_out) matrix
            nn.init.xavier_uniform_(module.weight[0] if module.groups == 1 else module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, SharedGroupLayerNorm)):
            module.reset_parameters()
