"""The devices tests and trainer configs take, checked on any machine: where there is no GPU,
Lightning is shown one it cannot reach (building a Trainer makes no CUDA call)."""

from __future__ import annotations

import os

import lightning.fabric.accelerators.cuda
import lightning.pytorch.accelerators.cuda
import pytest
import torch
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

from src.build import build_trainer
from tests.conftest import compose_config

PRETENDED_GPUS = 2


@pytest.fixture
def gpu_count(monkeypatch: pytest.MonkeyPatch) -> int:
    """How many GPUs Lightning sees: the machine's own, or without any, ``PRETENDED_GPUS``."""
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    # Lightning counts devices through these two names when it picks and parses accelerators
    for module in (lightning.fabric.accelerators.cuda, lightning.pytorch.accelerators.cuda):
        monkeypatch.setattr(module, "num_cuda_devices", lambda: PRETENDED_GPUS)
    return PRETENDED_GPUS


@pytest.mark.parametrize(
    ("trainer", "accelerator", "devices"),
    [("ddp", CUDAAccelerator, "all"), ("fsdp", CUDAAccelerator, "all"), ("gpu", CUDAAccelerator, 1),
     ("ddp_cpu", CPUAccelerator, 2), ("cpu", CPUAccelerator, 1)],
)  # fmt: skip
def test_trainer_configs_take_the_machines_devices(
    trainer: str, accelerator: type, devices: int | str, gpu_count: int, tmp_path
) -> None:
    """The GPU data-parallel configs use every GPU there is (a fixed count fails on a machine
    with fewer: "You requested gpu: [0, 1, 2, 3] But your machine only has: [0]")."""
    built = build_trainer(compose_config("train", [f"trainer={trainer}"], tmp_path))
    assert isinstance(built.accelerator, accelerator)
    assert built.num_devices == (gpu_count if devices == "all" else devices)


@pytest.mark.usefixtures("gpu_count")
def test_test_configs_pin_the_cpu_where_a_gpu_is_visible(make_cfg, tmp_path) -> None:
    for overrides in [
        ("debug=fdr",),
        ("experiment=vision_classification/digits_ema",),
        ("trainer=ddp_cpu",),
    ]:
        trainer = build_trainer(make_cfg(*overrides))
        assert isinstance(trainer.accelerator, CPUAccelerator), overrides
    # without the pin the default trainer takes the GPU
    unpinned = compose_config("train", ["debug=fdr"], tmp_path / "unpinned")
    assert isinstance(build_trainer(unpinned).accelerator, CUDAAccelerator)


def test_kernel_device_is_cuda_where_there_is_one(kernel_device: torch.device) -> None:
    if torch.cuda.is_available():
        assert kernel_device.type == "cuda"
        # float32 references in float32 (see the fixture)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    else:
        assert kernel_device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
