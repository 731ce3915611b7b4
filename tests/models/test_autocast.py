"""Every network of the project under ``torch.autocast`` against its float32 run.

Forward and backward in the autocast dtype must keep float32 parameters and gradients and stay
within ``NETWORK_TOLERANCE`` of float32 in eval mode (``tests/amp.py`` says how it is measured and
why). PReLUs start with slope 1 there, as in the op tests, so that kinks do not decide the
comparison. Training mode in bf16 is covered by the task runs
(``tests/tasks/test_mixed_precision_training.py``); DiCE off its build size by the op tests.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from src.models.awd_lm import AWDLanguageModel
from src.models.delight_lm import DeLighTLanguageModel
from src.models.delight_mt import DeLighTEncoderDecoder
from src.models.dice_variants import dice_mobilenet, dice_resnet
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.models.group_transformer import GroupTransformer
from src.models.segmentation import dicenet_segmentation, espnetv2_segmentation
from src.models.ssd import SSD
from src.models.text_classifier import DeLighTClassifier, TransformerClassifier
from src.models.transformer_mt import TransformerEncoderDecoder
from src.models.transformer_xl import TransformerXL
from tests.amp import NETWORK_TOLERANCE, autocast_errors, device_dtypes, straighten_prelus


class TwoSegments(nn.Module):
    """A memory language model run over two consecutive segments, the second reading the memory
    the first left (so the memory path runs under autocast too).

    Shape:
        tokens (B, 2T) -> logits of the second segment (B, T, V)
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, tokens: Tensor) -> Tensor:
        first, second = tokens.chunk(2, dim=1)
        _, memories = self.net(first)
        logits, _ = self.net(second, memories)
        return logits


class Translate(nn.Module):
    """An encoder-decoder reading a source and a target prefix cut from one token tensor.

    Shape:
        tokens (B, S + T) -> logits (B, T, V), S = ``source_len``
    """

    def __init__(self, net: nn.Module, source_len: int) -> None:
        super().__init__()
        self.net = net
        self.source_len = source_len

    def forward(self, tokens: Tensor) -> Tensor:
        return self.net(tokens[:, : self.source_len], None, tokens[:, self.source_len :])


class Detections(nn.Module):
    """An SSD's two outputs as one tensor.

    Shape:
        (B, 3, S, S) -> (B, P, 4 + C), box offsets then class scores per prior
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, images: Tensor) -> Tensor:
        return torch.cat(self.net(images), dim=-1)


class Logits(nn.Module):
    """The logits of an AWD language model's output tuple.

    Shape:
        tokens (B, T) -> (B, T, V)
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, tokens: Tensor) -> Tensor:
        return self.net(tokens).logits


NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0}
AWD_SMALL = {
    "embedding_dim": 16, "hidden_size": 32, "num_layers": 2,
    **{p: 0.0 for p in ("dropout", "dropout_hidden", "dropout_input", "dropout_embedding",
                        "weight_drop")},
}  # fmt: skip


def images(size: tuple[int, int] = (64, 64)) -> list[Tensor]:
    return [torch.randn(2, 3, *size)]


CASES = {
    "DiCENet": (lambda: DiCENet(0.5, num_classes=10, input_size=64), images),
    "ESPNetv2": (lambda: ESPNetv2(0.5, num_classes=10), images),
    "dice_mobilenet": (lambda: dice_mobilenet(0.5, num_classes=10, input_size=64), images),
    "dice_resnet": (lambda: dice_resnet(0.5, num_classes=10, input_size=64), images),
    "dicenet_segmentation": (
        lambda: dicenet_segmentation(0.5, num_classes=5, input_size=64),
        images,
    ),
    "espnetv2_segmentation": (lambda: espnetv2_segmentation(0.5, num_classes=5), images),
    "GroupTransformer": (
        lambda: TwoSegments(
            GroupTransformer(30, 2, 32, 4, 64, 2, tgt_len=8, mem_len=8, dropout=0.0)
        ),
        lambda: [torch.randint(30, (2, 16))],
    ),
    "TransformerXL": (
        lambda: TwoSegments(TransformerXL(30, 2, 32, 4, 64, mem_len=8, dropout=0.0)),
        lambda: [torch.randint(30, (2, 16))],
    ),
    "DeLighTEncoderDecoder": (
        lambda: Translate(
            DeLighTEncoderDecoder(
                30,
                30,
                64,
                2,
                3,
                2.0,
                ffn_dropout=0.0,
                embedding_dropout=0.0,
                position_dropout=0.0,
                **NO_DROPOUT,
            ),
            source_len=7,
        ),
        lambda: [torch.randint(4, 30, (2, 12))],
    ),
    "TransformerEncoderDecoder": (
        lambda: Translate(
            TransformerEncoderDecoder(30, 30, 32, 64, 4, 2, **NO_DROPOUT), source_len=7
        ),
        lambda: [torch.randint(4, 30, (2, 12))],
    ),
    "DeLighTLanguageModel": (
        lambda: DeLighTLanguageModel(40, 64, 2, 3, 2.0, cutoffs=(10, 20), dropout=0.0),
        lambda: [torch.randint(4, 40, (2, 10))],
    ),
    "AWDLanguageModel_pru": (
        lambda: Logits(AWDLanguageModel(40, groups=2, **AWD_SMALL)),
        lambda: [torch.randint(40, (2, 12))],
    ),
    "AWDLanguageModel_lstm": (
        lambda: Logits(AWDLanguageModel(40, rnn="lstm", **AWD_SMALL)),
        lambda: [torch.randint(40, (2, 12))],
    ),
    "DeLighTClassifier": (
        lambda: DeLighTClassifier(
            40, 3, 32, num_blocks=2, embedding_dropout=0.0, ffn_dropout=0.0, **NO_DROPOUT
        ),
        lambda: [torch.randint(2, 40, (2, 10))],
    ),
    "TransformerClassifier": (
        lambda: TransformerClassifier(40, 3, 32, 2, embedding_dropout=0.0, dropout=0.0),
        lambda: [torch.randint(2, 40, (2, 10))],
    ),
    "SSD": (lambda: Detections(SSD(3, scale=0.5)), lambda: [torch.randn(1, 3, 300, 300)]),
}


def skip_below_float16_range(name: str, make, make_inputs) -> None:
    """Skip a network whose untrained eval-mode output lies below float16's normal range.

    Freshly built, BatchNorm's running statistics are (0, 1), so eval-mode BN passes activations as
    they are, and in a deep untrained network they shrink layer by layer: dice_mobilenet's output
    is about 1e-30, which float16 (smallest normal 6e-5) rounds to zero. That says nothing about
    mixed precision in a trained network; bfloat16, with float32's range, still tests it.
    """
    torch.manual_seed(0)
    net = straighten_prelus(make()).eval()
    with torch.no_grad():
        out = net(*make_inputs())
    out = out if isinstance(out, Tensor) else next(t for t in out if isinstance(t, Tensor))
    largest = float(out.float().abs().max())
    if largest < torch.finfo(torch.float16).tiny:
        pytest.skip(f"{name}: untrained eval-mode output {largest:.1e}, below float16's range")


def rnns_in_training_mode(net: nn.Module) -> nn.Module:
    """``net`` with its ``nn.LSTM``/``nn.GRU`` modules in training mode: cuDNN's RNN backward
    refuses eval mode, and one-layer RNNs have no dropout of their own, so nothing else changes."""
    for module in net.modules():
        if isinstance(module, nn.RNNBase):
            assert module.dropout == 0 or module.num_layers == 1
            module.train()
    return net


@pytest.mark.parametrize(("device", "dtype"), device_dtypes(), ids=str)
@pytest.mark.parametrize("name", CASES)
def test_network_under_autocast_matches_float32(name: str, device: str, dtype: torch.dtype) -> None:
    make, make_inputs = CASES[name]
    if dtype == torch.float16:
        skip_below_float16_range(name, make, make_inputs)
    errors = autocast_errors(
        lambda: rnns_in_training_mode(straighten_prelus(make()).eval()), make_inputs, dtype, device,
        input_grads=False,
    )  # fmt: skip
    assert errors["output"] <= NETWORK_TOLERANCE, f"{name}: output off by {errors['output']:.2e}"
    # Twice that for the parameter gradients together: in a segmentation network the largest are
    # BN-bias gradients, sums over every pixel whose terms cancel (6.5% for dicenet_segmentation)
    assert errors["parameters.grad"] <= 2 * NETWORK_TOLERANCE, (
        f"{name}: parameter gradients off by {errors['parameters.grad']:.2e}"
    )
    # One tensor's gradient may be a sum whose terms nearly cancel (a BN bias behind a grouped
    # conv), which magnifies rounding; a gradient that is wrong, not rounded, is off by ~100%.
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 0.25, f"{name}: {worst} off by {errors[worst]:.2e}"


@pytest.mark.parametrize("name", ["DiCENet", "ESPNetv2"])
def test_cpu_inference_under_autocast_runs_in_bfloat16(name: str) -> None:
    """Eval mode without autograd takes the folded float32 path, except under autocast, where the
    plain modules run in bf16 and agree with the folded path to bf16 accuracy."""
    make, make_inputs = CASES[name]
    torch.manual_seed(0)
    net = make().eval()
    (x,) = make_inputs()
    with torch.inference_mode():
        folded = net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = net(x)
    assert folded.dtype == torch.float32 and low.dtype == torch.bfloat16
    error = float((low.float() - folded).norm() / folded.norm())
    assert error <= NETWORK_TOLERANCE, f"{name}: bf16 inference off by {error:.2e}"
