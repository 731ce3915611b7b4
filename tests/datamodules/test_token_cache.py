from __future__ import annotations

import numpy as np

from src.datamodules.token_cache import TokenCache, files_signature


def test_written_cache_is_current_until_its_source_or_a_file_changes(tmp_path) -> None:
    source = tmp_path / "train.txt"
    source.write_text("a b c\n")
    cache = TokenCache(tmp_path / "cache", ("train", "test"), "vocab.txt")
    signature = files_signature([source])
    assert not cache.is_current(signature)  # nothing written yet
    cache.folder.mkdir()
    cache.vocabulary_path.write_text("a\nb\nc\n")
    ids = {"train": np.arange(5, dtype=np.int32), "test": np.arange(3, dtype=np.int32)}
    assert cache.write(signature, 3, ids) == {"train": 5, "test": 3}
    assert cache.is_current(signature)
    loaded = cache.load()
    assert [loaded[s].tolist() for s in ("train", "test")] == [[0, 1, 2, 3, 4], [0, 1, 2]]
    assert not cache.is_current(signature + "x")  # other sources
    source.write_text("a b c d\n")  # the size changes the signature
    assert not cache.is_current(files_signature([source]))
    (cache.folder / "test.npy").unlink()
    assert not cache.is_current(signature)  # a split file missing
    (cache.folder / "meta.json").write_text("{not json")
    assert not cache.is_current(signature)  # a damaged meta.json
    assert not list(cache.folder.glob("*.tmp*"))  # every file was renamed into place
