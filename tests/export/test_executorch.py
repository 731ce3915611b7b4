"""DiCENet as an XNNPACK-delegated ExecuTorch program: fp32 matches eager; int8 (PT2E, XNNPACK
quantizer) stays close to it and keeps the digits' predictions."""

from __future__ import annotations

import logging

import pytest
import torch

from src.export.executorch import export_executorch, load_program
from src.export.spec import ExportSpec
from src.models.dicenet import DiCENet

pytest.importorskip("executorch")
# lowering a network of DiCE units takes minutes on 2 cores: run with -m heavy
pytestmark = [pytest.mark.slow, pytest.mark.heavy]


@pytest.fixture(scope="module")
def network() -> DiCENet:
    torch.manual_seed(0)
    net = DiCENet(scale=0.5, num_classes=10, input_size=32, stem_stride=2).eval()
    # trained-like statistics, so that int8 is judged on a non-degenerate output
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_var.uniform_(0.5, 2.0)
            module.running_mean.normal_(0.0, 0.1)
    # channels-last weights, as a task that trains channels-last hands them over
    return net.to(memory_format=torch.channels_last)


def test_fp32_program_matches_eager(network: DiCENet, tmp_path, caplog) -> None:
    x = torch.randn(1, 3, 32, 32)
    with caplog.at_level(logging.INFO, logger="src.export.executorch"):
        path = export_executorch(
            ExportSpec("network", network, (x,), ["image"], ["logits"]), tmp_path / "dicenet.pte"
        )
    # the whole network in one XNNPACK delegate (tests/export/test_delegate_graph.py says why)
    assert "dicenet.pte: 1 XNNPACK delegate(s); outside them: nothing" in caplog.text
    program = load_program(path)
    for seed in (1, 2):
        image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            expected = network(image)
        (out,) = program([image])
        assert out.shape == (1, 10)
        assert (out - expected).abs().max() <= 1e-4


def test_int8_program_stays_close(network: DiCENet, tmp_path, record_property) -> None:
    x = torch.randn(1, 3, 32, 32)
    calibration = [(torch.randn(1, 3, 32, 32),) for _ in range(8)]
    spec = ExportSpec("network", network, (x,), ["image"], ["logits"])
    path = export_executorch(spec, tmp_path / "dicenet_int8.pte", calibration=calibration)
    images = torch.randn(6, 1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = torch.cat([network(image) for image in images])
    program = load_program(path)
    got = torch.cat([program([image])[0] for image in images])
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=1)
    fp32_size = export_executorch(spec, tmp_path / "fp32.pte").stat().st_size
    # loaded once, called again: the same outputs
    assert torch.equal(program([images[0]])[0], program([images[0]])[0])
    record_property("cosine_min", cosine.min().item())
    record_property("bytes_int8_fp32", (path.stat().st_size, fp32_size))
    assert cosine.min() > 0.95, cosine
    # the int8 weights replace the fp32 ones (convert_pt2e's originals must not ride along: with
    # them the int8 file was larger than the fp32 one); measured 0.61x, the depth-wise and grouped
    # convolutions' small kernels, biases, norms and slopes staying fp32
    assert path.stat().st_size < 0.75 * fp32_size, (path.stat().st_size, fp32_size)
