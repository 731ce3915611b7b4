"""A model that cannot be built at the sizes asked for names the ``model.*`` keys and the nearest
``model.d_model`` values that build."""

from __future__ import annotations

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from src.build import build_task
from src.utils.errors import UserError
from src.utils.model_sizes import ModelSizeError, builds, nearest_that_build
from tests.conftest import compose_config


def test_unbuildable_sizes_name_the_keys_and_the_nearest_width_that_builds(tmp_path) -> None:
    overrides = ["experiment=delight_mt/demo", "model.d_model=100", "model.width_multiplier=3"]
    with pytest.raises(ModelSizeError) as error:
        build_task(compose_config("train", overrides, tmp_path))
    message = str(error.value)
    assert isinstance(error.value, UserError)
    # named by the model choice in a run (by the class outside one)
    assert " cannot be built with model.d_model=100, model.width_multiplier=3, " in message
    assert message.endswith(
        "With the other model.* keys as they are, model.d_model=96 or model.d_model=104 builds."
    )
    model = {**dict(compose_config("train", overrides[:1], tmp_path).model), "src_vocab": 50,
             "tgt_vocab": 50, "d_model": 100, "width_multiplier": 3}  # fmt: skip
    assert not builds(model, instantiate)
    assert builds({**model, "d_model": 96}, instantiate) and builds(
        {**model, "d_model": 104}, instantiate
    )
    assert nearest_that_build(model, instantiate) == (96, 104)


def test_a_refusal_that_no_width_cures_stays_as_it_was(tmp_path) -> None:
    overrides = ["experiment=delight_mt/demo", "model.dropout=1.5"]
    with pytest.raises(InstantiationException, match="dropout"):
        build_task(compose_config("train", overrides, tmp_path))
