"""Checkpoint averaging on tiny generated Lightning checkpoints: the means, float64 accumulation,
integer tensors, mismatches, tied weights, the written file and the --last selection."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from src.models.transformer_mt import TransformerEncoderDecoder
from src.utils.average_checkpoints import average_checkpoints, last_checkpoints, main
from src.utils.run_record import read_checkpoint


def _checkpoint(scale: float, step: int, **extra: Tensor) -> dict[str, Any]:
    state = {
        "net.weight": torch.full((2, 3), scale),
        "net.half": torch.full((4,), min(20000.0 * scale, 60000.0), dtype=torch.float16),
        "net.bn.num_batches_tracked": torch.tensor(7),
        **extra,
    }
    return {
        "state_dict": state,
        "epoch": step // 10,
        "global_step": step,
        "lightnets": {"version": "test", "choices": {"model": "transformer_mt"}, "step": step},
        "optimizer_states": [{"state": {0: {"exp_avg": torch.ones(6)}}}],
        "lr_schedulers": [{"last_epoch": step}],
    }


def _save(directory: Path, name: str, checkpoint: dict[str, Any], mtime: float) -> Path:
    path = directory / name
    torch.save(checkpoint, path)
    os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def three(tmp_path: Path) -> list[Path]:
    # written out of order: the newest (largest global_step) is the second file
    return [
        _save(tmp_path, "epoch001.ckpt", _checkpoint(1.0, 10), 1000),
        _save(tmp_path, "epoch003.ckpt", _checkpoint(3.0, 30), 3000),
        _save(tmp_path, "epoch002.ckpt", _checkpoint(2.0, 20), 2000),
    ]


def test_means_in_float64_cast_back(three: list[Path]) -> None:
    state = average_checkpoints(three)
    assert list(state) == ["net.weight", "net.half", "net.bn.num_batches_tracked"]
    assert state["net.weight"].dtype == torch.float32
    assert torch.equal(state["net.weight"], torch.full((2, 3), 2.0))
    # 20000 + 60000 + 40000 overflows float16 (max 65504); the float64 sum does not
    assert state["net.half"].dtype == torch.float16
    assert torch.equal(state["net.half"], torch.full((4,), 40000.0, dtype=torch.float16))
    assert state["net.bn.num_batches_tracked"].item() == 7
    one = average_checkpoints(three[:1])
    assert torch.equal(one["net.weight"], torch.ones(2, 3))


def test_unequal_integer_tensors_raise(tmp_path: Path, three: list[Path]) -> None:
    other = _checkpoint(4.0, 40)
    other["state_dict"]["net.bn.num_batches_tracked"] = torch.tensor(8)
    path = _save(tmp_path, "epoch004.ckpt", other, 4000)
    with pytest.raises(ValueError, match=r"num_batches_tracked is an integer tensor.*epoch004"):
        average_checkpoints([*three, path])


def test_mismatched_files_name_keys_and_files(tmp_path: Path, three: list[Path]) -> None:
    extra = _save(tmp_path, "extra.ckpt", _checkpoint(1.0, 5, **{"net.bias": torch.zeros(2)}), 1)
    with pytest.raises(ValueError, match=r"epoch001.ckpt and .*extra.ckpt hold different.*bias"):
        average_checkpoints([three[0], extra])
    wide = _checkpoint(1.0, 5)
    wide["state_dict"]["net.weight"] = torch.zeros(2, 4)
    path = _save(tmp_path, "wide.ckpt", wide, 1)
    with pytest.raises(ValueError, match=r"net.weight: \(2, 3\) .*epoch001.ckpt but \(2, 4\)"):
        average_checkpoints([three[0], path])
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="notes.ckpt is not a weights file"):
        average_checkpoints([three[0], text])
    torch.save({"weight": torch.ones(1)}, tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="bare.pt is not a Lightning checkpoint"):
        average_checkpoints([tmp_path / "bare.pt"])
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])


def test_cli_writes_the_newest_with_the_average(tmp_path: Path, three: list[Path]) -> None:
    out = tmp_path / "averaged" / "avg.ckpt"
    assert main([str(out), *map(str, three)]) == 0
    checkpoint = read_checkpoint(out)
    # the newest input is the one with the largest global_step, whatever the order given
    assert checkpoint["global_step"] == 30 and checkpoint["epoch"] == 3
    assert checkpoint["lightnets"]["step"] == 30
    assert "optimizer_states" not in checkpoint and "lr_schedulers" not in checkpoint
    assert torch.equal(checkpoint["state_dict"]["net.weight"], torch.full((2, 3), 2.0))
    assert checkpoint["averaged_from"] == ["epoch001.ckpt", "epoch003.ckpt", "epoch002.ckpt"]
    assert [p.name for p in out.parent.iterdir()] == ["avg.ckpt"]  # no temporary left
    assert main([str(tmp_path / "x.ckpt"), str(three[0]), str(tmp_path / "missing.ckpt")]) == 1
    assert not (tmp_path / "x.ckpt").exists()


def test_last_n_by_mtime_or_epoch(tmp_path: Path, three: list[Path]) -> None:
    # Lightning's last.ckpt repeats an epoch's weights and is newest on disk
    _save(tmp_path, "last.ckpt", _checkpoint(3.0, 30), 5000)
    _save(tmp_path, "epoch010.ckpt", _checkpoint(10.0, 100), 500)  # an old file, a late epoch
    by_time = last_checkpoints(tmp_path, 2)
    assert [p.name for p in by_time] == ["epoch002.ckpt", "epoch003.ckpt"]
    by_epoch = last_checkpoints(tmp_path, 3, by="epoch")
    assert [p.name for p in by_epoch] == ["epoch002.ckpt", "epoch003.ckpt", "epoch010.ckpt"]
    out = tmp_path / "avg.ckpt"
    assert main([str(out), "--last", "3", "--by", "epoch", str(tmp_path)]) == 0
    checkpoint = read_checkpoint(out)
    assert torch.equal(checkpoint["state_dict"]["net.weight"], torch.full((2, 3), 5.0))
    assert checkpoint["global_step"] == 100
    # the output in the same folder is not picked up by a later run
    os.utime(out, (9000, 9000))
    assert [p.name for p in last_checkpoints(tmp_path, 1, exclude=out)] == ["epoch003.ckpt"]
    with pytest.raises(ValueError, match="has 4 checkpoints to choose from by mtime"):
        last_checkpoints(tmp_path, 6, exclude=out)
    assert main([str(out), "--last", "2", str(three[0]), str(three[1])]) == 1


def test_averaged_transformer_loads_with_its_tie(tmp_path: Path) -> None:
    torch.manual_seed(0)
    nets = [
        TransformerEncoderDecoder(
            10, 10, d_model=8, ffn_dim=16, num_heads=2, num_layers=1, share_all_embeddings=True
        )
        for _ in range(2)
    ]
    paths = []
    for i, net in enumerate(nets):
        state = {f"net.{k}": v for k, v in net.state_dict().items()}
        paths.append(tmp_path / f"epoch{i}.ckpt")
        torch.save({"state_dict": state, "global_step": i}, paths[-1])
    state = average_checkpoints(paths)
    table = state["net.encoder_embedding.weight"]
    assert state["net.decoder_embedding.weight"] is table  # tied weights stay one tensor
    expected = (nets[0].encoder_embedding.weight + nets[1].encoder_embedding.weight) / 2
    torch.testing.assert_close(table, expected.detach(), atol=1e-7, rtol=0)
    model = TransformerEncoderDecoder(
        10, 10, d_model=8, ffn_dim=16, num_heads=2, num_layers=1, share_all_embeddings=True
    )
    model.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
    fc = "encoder_layers.0.linear1.weight"
    mean = (nets[0].state_dict()[fc] + nets[1].state_dict()[fc]) / 2
    torch.testing.assert_close(model.state_dict()[fc], mean, atol=1e-7, rtol=0)
