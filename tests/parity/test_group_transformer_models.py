"""Whole Transformer-XL and Group-Transformer models against the official models' stored outputs.

Each fixture holds three consecutive segments (the last one shorter, which truncates the memory);
the fixtures are time-major ``[len, bsz, ...]`` and are turned batch-first here, at the boundary.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from src.compat.group_transformer import from_official, load_official
from src.models.group_transformer import GroupTransformer
from src.models.transformer_xl import TransformerXL
from tests.parity.reference import fixtures, load

ATOL = RTOL = 1e-5
FAMILY = "group_transformer"
PATHS = fixtures(FAMILY, "gt_tiny_model_*.pt") + fixtures(FAMILY, "txl_tiny_model_*.pt")


def batch_first(x: Tensor) -> Tensor:
    """``[len, bsz, ...]`` -> ``(bsz, len, ...)``."""
    return x.transpose(0, 1)


@pytest.mark.parametrize("path", PATHS)
def test_model_matches_official_over_segments(path: Path) -> None:
    fx = load(path)
    config = fx["config"]
    model = from_official(fx["state_dict"], config).eval()
    assert isinstance(model, GroupTransformer if path.name.startswith("gt_") else TransformerXL)
    memories = None
    with torch.no_grad():
        for segment in fx["segments"]:
            mlen = 0 if memories is None else memories[0].shape[1]
            assert mlen == segment["mlen_before"]
            tokens, target = batch_first(segment["input"]), batch_first(segment["target"])
            logits, memories = model(tokens, memories)
            loss = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")  # (B, T)
            torch.testing.assert_close(logits, batch_first(segment["logits"]), atol=ATOL, rtol=RTOL)
            torch.testing.assert_close(loss, batch_first(segment["loss"]), atol=ATOL, rtol=RTOL)
            assert (
                memories is not None
                and len(memories) == len(segment["new_mems"]) == config["n_layer"] + 1
            )
            for ours, theirs in zip(memories, segment["new_mems"]):
                torch.testing.assert_close(ours, batch_first(theirs), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("path", PATHS)
def test_memory_matters(path: Path) -> None:
    """Without the carried memory the later segments' logits differ (the recurrence is
    exercised)."""
    fx = load(path)
    model = from_official(fx["state_dict"], fx["config"]).eval()
    segment = fx["segments"][1]
    with torch.no_grad():
        logits, _ = model(batch_first(segment["input"]))
    assert (logits - batch_first(segment["logits"])).abs().max() > 1e-2


def test_converter_refuses_unconverted_entries() -> None:
    (param,) = fixtures(FAMILY, "txl_tiny_model_*.pt")[:1]
    if param.values[0] is None:
        pytest.skip("no Transformer-XL fixture")
    fx = load(param.values[0])
    state = dict(fx["state_dict"], extra=torch.zeros(1))
    with pytest.raises(ValueError, match="extra"):
        from_official(state, fx["config"])
    with pytest.raises(ValueError, match="same_length"):
        from_official(fx["state_dict"], dict(fx["config"], same_length=True))


@pytest.mark.parametrize("path", PATHS)
def test_load_official_fills_a_model_of_ours(path: Path) -> None:
    """Filling a model built from our constructor equals building it from the official config;
    another depth is refused with the tensors named."""
    fx = load(path)
    config = fx["config"]
    built = from_official(fx["state_dict"], config)
    sizes = [config[key] for key in ("n_token", "n_layer", "d_model", "n_head", "d_inner")]
    shared = {"mem_len": config["mem_len"], "tie_weight": config["tie_weight"]}
    if isinstance(built, GroupTransformer):
        ours = GroupTransformer(*sizes, config["n_group"], tgt_len=config["tgt_len"], **shared)
        deeper = GroupTransformer(
            sizes[0],
            sizes[1] + 1,
            *sizes[2:],
            config["n_group"],
            tgt_len=config["tgt_len"],
            **shared,
        )
    else:
        ours = TransformerXL(*sizes, pre_norm=config["pre_lnorm"], **shared)
        deeper = TransformerXL(sizes[0], sizes[1] + 1, *sizes[2:], **shared)
    load_official(ours, fx["state_dict"])
    for key, value in built.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    with pytest.raises(KeyError) as error:
        load_official(deeper, fx["state_dict"])
    assert f"layers.{sizes[1]}" in str(error.value) and "missing" in str(error.value)
