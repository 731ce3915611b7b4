"""A text corpus that is not under ``data.root`` is a user's mistake: a :class:`UserError` (one
``error: ...`` line from the tools) that names the path, the layout expected there and where the
data comes from."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from src.utils.errors import UserError
from tests.conftest import compose_config

# data config -> what the message names besides the path: the source of the files
SOURCES = {
    "enwik8": "http://mattmahoney.net/dc/enwik8.zip",
    "text8": "http://mattmahoney.net/dc/text8.zip",
    "ptb": "simple-examples.tgz",
    "wikitext2": "wikitext-2-v1.zip",
    "wikitext103": "wikitext-103-v1.zip",
    "wikitext103_segments": "wikitext-103-v1.zip",
    "iwslt14_de_en": "prepare-*.sh",
    "wmt14_en_de": "prepare-*.sh",
    "wmt16_en_ro": "prepare-*.sh",
    "imdb": "aclImdb_v1.tar.gz",
    "sst2": "SST-2.zip",
}


@pytest.mark.parametrize("data", sorted(SOURCES))
def test_a_missing_corpus_names_its_path_layout_and_source(data: str, tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    datamodule = instantiate(compose_config("train", [f"data={data}", f"data.root={root}"]).data)
    with pytest.raises(UserError) as error:
        datamodule.prepare_data()
        datamodule.setup("fit")
    message = str(error.value)
    assert str(root) in message and SOURCES[data] in message, message
    assert "xpected" in message, message  # "Expected <layout>" / "expected the raw file ..."
