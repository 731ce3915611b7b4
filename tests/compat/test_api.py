"""The converters' contract: compat imports models and ops, never the reverse; every family has
the same two entry points; ``src.compat.load_official`` picks the family by the network's type and
refuses, naming what it fills, a network no family converts to."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
from torch import nn

import src.compat
from src.compat import FAMILIES, OfficialWeightsError, family_of, load_official
from src.compat.delight import load_official as load_delight
from src.compat.edgenets import from_official as from_edgenets
from src.models.awd_lm import AWDLanguageModel
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.models.transformer_xl import TransformerXL
from src.ops.group_linear import GroupLinear
from src.ops.pyramidal import PyramidalTransform
from tests.compat.official_files import official_state
from tests.conftest import ROOT


@pytest.mark.parametrize("package", ["models", "ops"])
def test_models_and_ops_never_import_compat(package: str) -> None:
    for path in (ROOT / "src" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n.split(".")[:2] == ["src", "compat"] for n in names), path


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_has_the_two_entry_points(family: str) -> None:
    module = FAMILIES[family]
    assert list(inspect.signature(module.from_official).parameters) == ["state_dict", "config"]
    assert list(inspect.signature(module.load_official).parameters) == ["network", "weights"]
    assert module.NETWORKS and all(issubclass(t, nn.Module) for t in module.NETWORKS)
    assert module.FAMILY == family


def test_the_family_is_picked_by_the_network_type() -> None:
    assert family_of(DiCENet(0.2, num_classes=4)) == "EdgeNets"
    assert family_of(AWDLanguageModel(11, embedding_dim=8, hidden_size=8, num_layers=1)) == "PRU"
    assert family_of(TransformerXL(11, 1, 8, 2, 16, mem_len=0)) == "Group-Transformer"
    assert family_of(GroupLinear(8, 8, 2)) == "DeLighT"
    assert family_of(nn.Linear(2, 2)) is None
    with pytest.raises(TypeError, match=r"no official weights convert to Linear; .*'DiCENet'"):
        load_official(nn.Linear(2, 2), {})
    with pytest.raises(TypeError, match="no official DeLighT weights convert to Pyramidal"):
        load_delight(PyramidalTransform(4, 4), {})


def test_load_official_is_strict_and_names_the_tensors() -> None:
    glt = GroupLinear(8, 6, 2)
    weight, bias = torch.randn(2, 4, 3), torch.randn(2, 1, 3)
    load_official(glt, {"weights": weight, "bias": bias})
    assert torch.equal(glt.weight, weight) and torch.equal(glt.bias, bias[:, 0])
    with pytest.raises(OfficialWeightsError, match=r"not mapped: \['extra'\]"):
        load_official(glt, {"weights": weight, "bias": bias, "extra": bias})
    wider = {"weights": torch.randn(2, 4, 4), "bias": torch.randn(2, 1, 4)}
    with pytest.raises(OfficialWeightsError, match=r"weight: file \(2, 4, 4\) vs \(2, 4, 3\)"):
        load_official(glt, wider)
    with pytest.raises(OfficialWeightsError, match=r"bias \(2, 1, 3\) does not fit weights"):
        load_official(glt, {"weights": torch.randn(2, 4, 4), "bias": bias})


def test_a_file_is_named_in_the_error(tmp_path) -> None:
    path = tmp_path / "glt.pt"
    torch.save({"module.weights": torch.randn(2, 4, 4)}, path)
    with pytest.raises(OfficialWeightsError) as error:
        load_official(GroupLinear(8, 6, 2), path)
    message = str(error.value)
    assert message.startswith(f"official DeLighT weights {path} do not fit GroupLinear: ")
    assert len(message.splitlines()) == 1
    assert src.compat.__doc__ and "never import compat" in src.compat.__doc__


@pytest.mark.parametrize(
    ("network", "config"),
    [
        (
            lambda: DiCENet(0.5, num_classes=10, in_chans=1, input_size=(32, 48)),
            {
                "layer": "model.classification.dicenet.CNNModel",
                "s": 0.5,
                "num_classes": 10,
                "channels": 1,
                "model_height": 32,
                "model_width": 48,
            },
        ),
        (
            lambda: ESPNetv2(0.5, num_classes=7),
            {"layer": "model.classification.espnetv2.EESPNet", "s": 0.5, "num_classes": 7},
        ),
    ],
)
def test_from_official_builds_the_classifiers(network, config: dict) -> None:
    torch.manual_seed(0)
    source = network()
    built = from_edgenets(official_state(source), config)
    assert type(built) is type(source)
    for key, value in source.state_dict().items():
        assert torch.equal(built.state_dict()[key], value), key
