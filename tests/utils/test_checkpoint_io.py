from __future__ import annotations

import pytest
import torch

from src.utils.checkpoint_io import AtomicCheckpointIO


def test_interrupted_save_keeps_previous_checkpoint(tmp_path, monkeypatch) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    real_save = torch.save

    def crash_midway(obj, file, *args, **kwargs):
        file.write(b"partial bytes of a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.setattr(torch, "save", real_save)

    restored = io.load_checkpoint(path)
    assert restored["step"] == 1 and torch.equal(restored["w"], torch.ones(3))
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary left behind


def test_loading_refuses_pickled_objects(tmp_path) -> None:
    path = tmp_path / "unsafe.ckpt"
    torch.save({"obj": object()}, path)
    with pytest.raises(Exception, match="[Ww]eights only"):
        AtomicCheckpointIO().load_checkpoint(path)
