"""Official EdgeNets segmentation weights in our networks reproduce the official outputs.

Every ``edgenets/seg_*/<stem>.npz`` under ``$REFERENCE_DIR`` is checked with the weight file its
name points to (loaded by :func:`src.compat.load_official`): ``<family>_s_<s>_<dataset>_<W>x<H>`` (a
``demo_style_`` prefix and a ``_<image>_<w>x<h>`` suffix name the image the demo ran on). The
fixture's stored ``input`` is used as is (decoding and resizing are not under test). Masks must
agree on >= 99.9% of pixels and the stored (fp16) logits within 2e-2; the per-class logit means
within 1e-4 of the float64 run.
Each runs twice: with the EESP pyramids (and DiCE units at their build size) in the fused C++
kernels, and in eager calls.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from src.compat import load_official
from src.compat.edgenets import from_official
from src.models.segmentation import dicenet_segmentation, espnetv2_segmentation
from tests.helpers import use_inference_path
from tests.parity.reference import fixtures, reference_dir

WEIGHTS_NAME = re.compile(r"(dicenet|espnetv2)_s_(\d+(?:\.\d+)?)_([a-z]+)_(\d+)x(\d+)")
BUILDERS = {"dicenet": dicenet_segmentation, "espnetv2": espnetv2_segmentation}
# the official decoder's last 1x1 conv bias: one entry per class
LAST_BIAS = {
    "dicenet": "eff_pool_128x128.merge_layer.3.bias",
    "espnetv2": "bu_dec_l4.merge_layer.3.bias",
}
OFFICIAL_CLASSES = {
    "dicenet": "model.segmentation.dicenet.DiCENetSegmentation",
    "espnetv2": "model.segmentation.espnetv2.ESPNetv2Segmentation",
}


@pytest.fixture(autouse=True)
def _native_cpu_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN builds a primitive per new convolution shape; with the hundreds of small grouped
    convolutions of these networks that dominates CPU test time (seconds vs. tens of ms)."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def weights_for(fixture: Path) -> tuple[str, float, Path]:
    match = WEIGHTS_NAME.search(fixture.stem)
    if match is None:
        pytest.fail(f"{fixture.name} does not name its weights (<family>_s_<s>_<data>_<W>x<H>)")
    path = reference_dir() / "edgenets" / "weights" / f"{match.group(0)}.pth"
    if not path.is_file():
        pytest.fail(f"{fixture.name} needs {path}, which does not exist")
    return match.group(1), float(match.group(2)), path


@pytest.mark.parametrize("inference", ["kernel", "eager"])
@pytest.mark.parametrize("fixture", fixtures("edgenets", "seg_*/*.npz"))
def test_segmentation_matches_official(
    fixture: Path, inference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_inference_path(inference, monkeypatch)
    data = np.load(fixture)
    family, scale, weights = weights_for(fixture)
    num_classes = data["logits"].shape[1]
    net = BUILDERS[family](scale, num_classes)
    load_official(net, weights)
    net.eval()
    with torch.no_grad():
        logits = net(torch.from_numpy(data["input"]))  # (N, C, H, W)
    assert logits.shape[-2:] == data["mask"].shape[-2:]
    mask = logits.argmax(1).numpy()
    agreement = (mask == data["mask"]).mean()
    assert agreement >= 0.999, f"masks agree on {agreement:.5%} of pixels"
    k = len(data["logits_image_index"])
    reference = torch.from_numpy(data["logits"].astype(np.float32))
    error = (logits[:k] - reference).abs().max().item()
    assert error <= 2e-2, f"max logit error {error:.4g}"
    means = logits.double().mean(dim=(2, 3)).numpy()
    np.testing.assert_allclose(means, data["logits_mean_per_class_fp64"], rtol=0, atol=1e-4)


@pytest.mark.parametrize("weights", fixtures("edgenets", "weights/*.pth"))
def test_from_official_builds_the_network_of_a_weights_file(weights: Path) -> None:
    """Every official segmentation file: ``from_official`` with the official constructor arguments
    (``s``, ``classes``, ``dataset``) gives the network ``load_official`` fills, tensor for tensor;
    a file of another width is refused naming the file and the tensors."""
    match = WEIGHTS_NAME.fullmatch(weights.stem)
    assert match is not None, weights.name
    family, scale, dataset = match.group(1), float(match.group(2)), match.group(3)
    state = torch.load(weights, map_location="cpu", weights_only=True)
    classes = state[LAST_BIAS[family]].shape[0]
    config = {"layer": OFFICIAL_CLASSES[family], "s": scale, "classes": classes, "dataset": dataset}
    built = from_official(state, config)
    ours = BUILDERS[family](scale, classes)
    load_official(ours, weights)
    for key, value in ours.state_dict().items():
        assert torch.equal(built.state_dict()[key], value), key
    other = BUILDERS[family](1.0 if scale != 1.0 else 0.5, classes)
    with pytest.raises(ValueError) as error:
        load_official(other, weights)
    message = str(error.value)
    assert str(weights) in message and "do not fit" in message and len(message.splitlines()) == 1
