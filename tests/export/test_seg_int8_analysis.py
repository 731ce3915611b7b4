"""benchmarks/seg_int8_analysis.py's simulated int8 against onnxruntime's own int8 file, on a small
convolutional network (the official segmentation networks are the benchmark's)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from benchmarks.seg_int8_analysis import Network, Simulation
from src.export.onnx import export_onnx
from src.export.quantize import quantize_int8
from src.export.spec import ExportSpec

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.fixture(scope="module")
def simulation(tmp_path_factory: pytest.TempPathFactory) -> Simulation:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(8), nn.Conv2d(8, 16, 1), nn.PReLU(16),
        nn.Conv2d(16, 5, 1),
    ).eval()  # fmt: skip
    with torch.no_grad():  # one channel 30x the others, as a folded BatchNorm leaves it
        net[2].weight[3] *= 30
    images = [torch.randn(1, 3, 16, 16) for _ in range(3)]
    spec = ExportSpec("network", net, (images[0],), ["image"], ["logits"], {"image": {0: "batch"}})
    path = export_onnx(spec, tmp_path_factory.mktemp("analysis") / "fp32.onnx")
    return Simulation(Network("small", images, ["a", "b", "c"], path), threads=1)


def test_no_item_quantised_is_the_float_graph(simulation: Simulation) -> None:
    # each convolution's input and output: the image, 4 hidden maps, the logits
    assert len(simulation.dense) == 3 and len(simulation.tensors) == 6
    outputs = simulation.run(simulation.quantised([], []))
    for out, ref in zip(outputs, simulation.reference):
        np.testing.assert_array_equal(out, ref)


def test_every_item_reproduces_onnxruntimes_int8_file(simulation: Simulation, tmp_path) -> None:
    import onnx

    simulated = simulation.run(simulation.quantised(simulation.tensors, simulation.dense))
    path = quantize_int8(
        simulation.network.onnx_path, tmp_path / "int8.onnx", simulation.calibration
    )
    real = simulation.run(onnx.load(str(path)))
    for s, r, f in zip(simulated, real, simulation.reference):
        # both differ from float by the quantisation noise; from each other by the rounding of
        # onnxruntime's int32 biases only
        assert np.abs(s - r).mean() <= 0.02 * np.abs(r - f).mean(), (s - r, r - f)


def test_weights_are_rounded_to_127_levels_per_output_channel(simulation: Simulation) -> None:
    for node in simulation.dense:
        weight = simulation.weights[simulation.nodes[node].input[1]]
        rounded = simulation.rounded(node)
        scale = np.abs(weight).reshape(weight.shape[0], -1).max(1) / 127
        levels = rounded.reshape(weight.shape[0], -1) / scale[:, None]
        np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
        assert np.abs(levels).max() == pytest.approx(127, abs=1e-3)


def test_bias_correction_removes_the_mean_shift(simulation: Simulation) -> None:
    def shift(model) -> float:  # the logits' mean error per channel, over the images
        outputs = simulation.run(model)
        errors = [(o - r).mean(axis=(0, 2, 3)) for o, r in zip(outputs, simulation.reference)]
        return float(np.abs(np.mean(errors, 0)).mean())

    plain = shift(simulation.quantised([], simulation.dense))
    corrected = shift(simulation.quantised([], simulation.dense, bias_correction=True))
    assert corrected < 0.5 * plain, (corrected, plain)
