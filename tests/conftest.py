"""Composing the project's Hydra configs inside tests, as the entry points do, and the device the
Triton kernel tests run on."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# the entry points (train.py, eval.py, complexity.py) live at the root
sys.path.insert(0, str(ROOT))
# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors. The variable is read
# when a kernel is defined, so it is set before any test module imports one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The CPU ops take the project's paths without timing them against ATen's (src.kernels.choose):
# the tests' numbers then hold on every machine, and no test writes measured choices to the home
# folder. The tests of the measured choice set their own mode.
os.environ.setdefault("LIGHTNETS_CPU_KERNELS", "1")
# Under pytest-xdist (the README's ``pytest -n auto``) each worker runs PyTorch on one thread, and
# so do the entry points it starts as subprocesses: on a machine with as many cores as workers,
# OpenMP threads of one process spin against the others' and slow every test down. Each worker also
# has its own project root (``paths.root_dir``: data caches and runs), so two workers never build
# the same cache at the same time.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    os.environ["PROJECT_ROOT"] = str(ROOT / ".test_roots" / WORKER)


def compose_config(
    config_name: str = "train",
    overrides: Sequence[str] = (),
    output_dir: Path | None = None,
    *,
    keep_hydra: bool = False,
) -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` with ``overrides``, runtime paths under
    ``output_dir``."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name, overrides=list(overrides), return_hydra_config=True)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(output_dir)
            cfg.hydra.runtime.cwd = str(ROOT)
            cfg.paths.log_dir = str(output_dir / "logs")
    HydraConfig.instance().set_config(cfg)
    if not keep_hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


@pytest.fixture
def make_cfg(tmp_path: Path) -> Callable[..., DictConfig]:
    """``make_cfg(*overrides, config_name="train", accelerator="cpu")``: a composed config writing
    under tmp_path, its Trainer on ``accelerator``. Tests run on the CPU unless they say otherwise:
    the configs' ``accelerator: auto`` would take a GPU where there is one, and the tests' exact
    numbers (resumed weights, metrics) hold on the CPU."""

    def make(
        *overrides: str, config_name: str = "train", subdir: str = "run", accelerator: str = "cpu"
    ) -> DictConfig:
        # a value override: it holds whichever trainer option the overrides pick
        overrides = (f"trainer.accelerator={accelerator}", *overrides)
        return compose_config(config_name, overrides, tmp_path / subdir)

    return make


@pytest.fixture
def kernel_device() -> Iterator[torch.device]:
    """Where the Triton kernel tests run: CUDA tensors on a machine with a GPU, else CPU tensors in
    Triton's interpreter. Each test compares a kernel with its reference computed on this device.

    On CUDA, TF32 is turned off for PyTorch's matmuls and cuDNN's convolutions: the float32
    references are then computed in float32, and so are the kernels' products (the GLT kernel
    follows ``torch.backends.cuda.matmul.allow_tf32`` and uses ``tl.dot(..., input_precision=
    "ieee")`` without it; the DimConv kernel multiplies element-wise). Kernel and reference then
    differ by summation order only, as in the interpreter, so the float32 tolerances hold on both.
    """
    if not torch.cuda.is_available():
        yield torch.device("cpu")
        return
    from tests.helpers import tf32

    with tf32(False):
        yield torch.device("cuda")


@pytest.fixture
def fresh_choices() -> Iterator[None]:
    """The process's path choices and measurement count forgotten before and after the test
    (:func:`src.kernels.forget`), so that what it times is its own."""
    from src.kernels import forget

    forget()
    yield
    forget()
