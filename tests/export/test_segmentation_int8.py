"""The official EdgeNets PASCAL segmentation networks as int8 ONNX keep their fp32 masks.

Each ``edgenets/seg_pascal/<family>_s_<s>_pascal_<W>x<H>.npz`` under ``$REFERENCE_DIR`` names the
network (family, width s) and its input size; the network is built with the official weights of
the same name. The fixture's images (``images/``) are read and preprocessed as ``predict.py`` does
at that size. The fp32 ONNX file must match eager PyTorch within 1e-4 on every image, and the int8
file (:func:`src.export.quantize.quantize_int8`, calibrated on the same images and their
horizontal flips) should give the fp32 file's argmax mask on >= 99% of each image's pixels: with
8-bit activations no network reaches it, with 16-bit ones (W8A16) three of the seven do
(docs/deploy.md has the figures); the known misses are reported as xfail with the measured
agreement.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.seg_int8_analysis import FIXTURE_NAME, official_segmentation
from src.commands.predict import preprocess, read_image
from src.datamodules.voc_seg import VOCSegmentationDataModule
from src.export.onnx import export_onnx, parity, run_session, session
from src.export.quantize import quantize_int8
from src.export.vision import vision_spec
from tests.parity.reference import fixtures, reference_dir

pytest.importorskip("onnxruntime")
# an ONNX export of a DiCE network takes minutes on 2 cores: run with -m heavy
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

MIN_AGREEMENT = 0.99
# measured below MIN_AGREEMENT on these images (docs/deploy.md): 8-bit activations on every
# network; 16-bit ones on these (the lowest image 0.96-0.99)
KNOWN_MISSES = {
    "uint8": None,  # every fixture
    "uint16": {
        "dicenet_s_0.2_pascal_256x256", "dicenet_s_0.2_pascal_384x384",
        "dicenet_s_0.75_pascal_256x256", "espnetv2_s_1.0_pascal_256x256",
    },
}  # fmt: skip


def official_network(fixture: Path) -> tuple[torch.nn.Module, tuple[int, int]]:
    """The network the fixture's name points to, with its official weights, and its (W, H)."""
    try:
        return official_segmentation(fixture, reference_dir())
    except FileNotFoundError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """fp32 files by fixture, exported once for both activation types."""
    return {"folder": tmp_path_factory.mktemp("seg_int8")}


@pytest.mark.parametrize("activations", ["uint8", "uint16"])
@pytest.mark.parametrize(
    "fixture",
    # the fixtures run at the weights' own size (the demo-style ones are named otherwise)
    [
        p
        for p in fixtures("edgenets", "seg_pascal/*_pascal_*.npz")
        if p.values[0] is None or FIXTURE_NAME.fullmatch(p.values[0].stem)
    ],
)
def test_int8_masks_agree_with_fp32(
    fixture: Path, activations: str, exported: dict, record_property
) -> None:
    net, size = official_network(fixture)
    folder = reference_dir() / "edgenets" / "images"
    names = [str(n) for n in np.load(fixture)["images"]]
    work = exported["folder"] / fixture.stem
    datamodule = VOCSegmentationDataModule(root=str(work / "voc"))  # its normalisation only
    images = [preprocess(read_image(folder / name), datamodule, size) for name in names]

    spec = vision_spec(net, images[0])  # (1, 3, H, W), the side fixed at the weights' size
    fp32_path = work / "fp32.onnx"
    if not fp32_path.is_file():
        export_onnx(spec, fp32_path)
    fp32 = session(fp32_path)
    errors = [parity(fp32, spec, [image])["max_abs"] for image in images]
    record_property("fp32_max_abs", errors)
    assert max(errors) <= 1e-4, dict(zip(names, errors))

    feeds = [{"image": x.numpy()} for x in images + [image.flip(-1) for image in images]]
    int8_path = quantize_int8(fp32_path, work / f"int8_{activations}.onnx", feeds,
                              activations=activations)  # fmt: skip
    int8 = session(int8_path)
    agreement = {}
    for name, image in zip(names, images):
        (reference,) = run_session(fp32, spec.input_names, [image])  # (1, 21, H, W)
        (quantized,) = run_session(int8, spec.input_names, [image])
        agreement[name] = (quantized.argmax(1) == reference.argmax(1)).double().mean().item()
    record_property("int8_agreement", agreement)
    misses = KNOWN_MISSES[activations]
    known = misses is None or fixture.stem in misses
    if known and min(agreement.values()) < MIN_AGREEMENT:
        pytest.xfail(f"{activations} activations: pixel agreement {agreement}")
    assert min(agreement.values()) >= MIN_AGREEMENT, agreement
