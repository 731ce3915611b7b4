"""Every op under ``torch.autocast`` against its float32 run (tolerances in ``tests/amp.py``).

The GLT and DimConv, whose Triton kernels need their own cases, are in ``test_kernel_autocast.py``.
PReLUs start with slope 1 here: with a kink, the few elements whose pre-activation lies within
rounding of zero take different slopes in the two runs, and the comparison would measure which side
they fell on rather than the arithmetic (the slopes still get their gradients checked).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from src.kernels.inference_folding import ConvBNPReLU
from src.ops.dice import DiCE, DiCEShuffleUnit, StridedDiCE
from src.ops.dim_fuse import DimFuse
from src.ops.eesp import EESP, DepthwiseDilatedSeparableConv, EESPDownsampler
from src.ops.group_attention import GroupAttention
from src.ops.group_embedding import GroupEmbedding
from src.ops.group_feedforward import GroupFeedForward
from src.ops.per_group_layer_norm import PerGroupLayerNorm
from src.ops.pru import PRU, GroupedContextTransform, PRUCell
from src.ops.pyramidal import PyramidalTransform
from src.ops.relative_position import RelativePositionTable
from src.ops.shared_group_layer_norm import SharedGroupLayerNorm
from tests.amp import OP_TOLERANCE, autocast_errors, device_dtypes, straighten_prelus


class AttentionWithPositions(nn.Module):
    """GroupAttention fed by its own position table and biases, as a Group-Transformer layer is.

    Shape:
        h (B, T, D), memory (B, M, D) -> (B, T, D)
    """

    def __init__(self, d_model: int, n_head: int, groups: int, max_len: int) -> None:
        super().__init__()
        self.attention = GroupAttention(d_model, n_head, groups)
        self.positions = RelativePositionTable(max_len, d_model)
        self.r_w_bias = nn.Parameter(torch.randn(n_head, d_model // n_head) * 0.1)
        self.r_r_bias = nn.Parameter(torch.randn(n_head, d_model // n_head) * 0.1)

    def forward(self, h: Tensor, memory: Tensor) -> Tensor:
        r = self.positions(h.shape[1] + memory.shape[1])
        return self.attention(h, r, self.r_w_bias, self.r_r_bias, memory)


def lift_relu(ffn: GroupFeedForward) -> GroupFeedForward:
    """Move the hidden pre-activations well above zero, in place: the ReLU's kink would otherwise
    flip a few near-zero units between the float32 and the 16-bit run, and each flip is a large
    error in the gradients before it (on an H200, 8% in bf16) that says nothing of the rounding
    (``straighten_prelus`` does the same for PReLU)."""
    with torch.no_grad():
        ffn.intra_linear_1.bias.fill_(8.0)  # the normalised inputs put |pre-activation| < ~3
    return ffn


def image(channels: int, size: int = 8) -> torch.Tensor:
    return torch.randn(2, channels, size, size)


CASES = {
    "SharedGroupLayerNorm": (lambda: SharedGroupLayerNorm(32, 4), lambda: [torch.randn(3, 5, 32)]),
    "SharedGroupLayerNorm, bf16 input": (
        lambda: SharedGroupLayerNorm(32, 4),
        lambda: [torch.randn(3, 5, 32).bfloat16()],
    ),
    "PerGroupLayerNorm": (lambda: PerGroupLayerNorm(32, 4), lambda: [torch.randn(3, 5, 32)]),
    "PerGroupLayerNorm, bf16 input": (
        lambda: PerGroupLayerNorm(32, 4),
        lambda: [torch.randn(3, 5, 32).bfloat16()],
    ),
    "GroupEmbedding": (lambda: GroupEmbedding(20, 32), lambda: [torch.randint(20, (2, 7))]),
    "GroupFeedForward": (
        lambda: lift_relu(GroupFeedForward(32, 64, 2)),
        lambda: [torch.randn(2, 7, 32)],
    ),
    "GroupAttention": (
        lambda: AttentionWithPositions(32, 4, 2, 16),
        lambda: [torch.randn(2, 5, 32), torch.randn(2, 6, 32)],
    ),
    "PyramidalTransform": (
        lambda: PyramidalTransform(24, 48, levels=3),
        lambda: [torch.randn(4, 24)],
    ),
    "GroupedContextTransform": (
        lambda: GroupedContextTransform(32, groups=4),
        lambda: [torch.randn(4, 32)],
    ),
    "PRUCell": (lambda: PRUCell(24, 32, groups=2, levels=2), lambda: [torch.randn(4, 24)]),
    "PRU": (lambda: PRU(24, 32, 2, groups=2, levels=2), lambda: [torch.randn(6, 3, 24)]),
    "DimFuse": (lambda: DimFuse(8, 12), lambda: [image(24)]),
    "DiCE": (lambda: DiCE(8, 12, 8, 8), lambda: [image(8)]),
    "DiCE off its build size": (lambda: DiCE(8, 12, 8, 8), lambda: [image(8, 12)]),
    "StridedDiCE": (lambda: StridedDiCE(8, 8, 8), lambda: [image(8, 16)]),
    "DiCEShuffleUnit": (lambda: DiCEShuffleUnit(16, 16, 8, 8), lambda: [image(16)]),
    "DepthwiseDilatedSeparableConv": (
        lambda: DepthwiseDilatedSeparableConv(8, 16, dilation=2),
        lambda: [image(8)],
    ),
    "EESP": (lambda: EESP(16, 16, branches=4, r_lim=7), lambda: [image(16)]),
    "EESP stride 2": (lambda: EESP(16, 32, stride=2, branches=4), lambda: [image(16)]),
    "EESPDownsampler": (
        lambda: EESPDownsampler(16, 32, branches=4),
        lambda: [image(16, 16), torch.randn(2, 3, 32, 32)],
    ),
    "ConvBNPReLU": (lambda: ConvBNPReLU(8, 16, 3, groups=2), lambda: [image(8)]),
}


@pytest.mark.parametrize(("device", "dtype"), device_dtypes(), ids=str)
@pytest.mark.parametrize("name", CASES)
def test_op_under_autocast_matches_float32(name: str, device: str, dtype: torch.dtype) -> None:
    make, make_inputs = CASES[name]
    errors = autocast_errors(lambda: straighten_prelus(make()), make_inputs, dtype, device)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= OP_TOLERANCE, f"{name}: {worst} off by {errors[worst]:.2e}; {errors}"
