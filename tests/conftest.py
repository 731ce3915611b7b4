"""Composing the project's Hydra configs inside tests, as the entry points do."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
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


def compose_config(
    config_name: str = "train",
    overrides: Sequence[str] = (),
    output_dir: Path | None = None,
    *,
    keep_hydra: bool = False,
) -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` with ``overrides``, runtime paths under ``output_dir``."""
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
    """``make_cfg(*overrides, config_name="train")``: a composed config writing under tmp_path."""

    def make(*overrides: str, config_name: str = "train", subdir: str = "run") -> DictConfig:
        return compose_config(config_name, overrides, tmp_path / subdir)

    return make
