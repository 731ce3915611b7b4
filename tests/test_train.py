"""The training entry point end to end: smoke run, exact resume, failure modes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from src.callbacks.finite_loss import NonFiniteLossError
from src.commands.train import train
from src.datamodules.image_folder import DatasetLayoutError

# a short real run: 3 epochs of 4 batches, full validation
SHORT = [
    "trainer.max_epochs=3",
    "trainer.limit_train_batches=4",
    "trainer.num_sanity_val_steps=2",
    "data.batch_size=32",
    "logger=csv",
]


def test_default_job_fast_dev_run(make_cfg) -> None:
    cfg = make_cfg("debug=fdr")
    summary = train(cfg)
    written = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())
    assert written == json.loads(json.dumps(summary))
    assert written["params"] == 195_698  # DiCENet s=0.5, stem_stride 2, built for 32x32, 10 classes
    assert written["macs"] == 1_407_232  # one 1x32x32 digit
    for key in ["test/acc", "test/loss", "val/acc", "val/loss"]:
        assert 0.0 <= written["metrics"][key] < 10.0
    assert written["wall_time_s"] > 0


def test_compiled_network_trains_and_checkpoints_like_eager(make_cfg) -> None:
    """compile.enabled=true: the network runs through torch.compile (aot_eager here: traced
    forward and backward graphs, eager kernels), the checkpoint keeps the eager key names, and a
    short run's weights equal the eager run's."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    runs = {}
    for compiled in (False, True):
        counters.clear()
        cfg = make_cfg(*SHORT, "trainer.max_epochs=1", "test=false", f"compile.enabled={compiled}",
                       "compile.backend=aot_eager", "compile.dynamic=false")  # fmt: skip
        summary = train(cfg)
        assert summary["status"] == "finished" and 0.0 <= summary["metrics"]["val/acc"] <= 1.0
        runs[compiled] = final_weights(Path(cfg.paths.output_dir))
        # the compiled run traced the network (train and eval mode: a graph each), the eager none
        assert (counters["stats"]["unique_graphs"] >= 2) == compiled
    torch._dynamo.reset()
    assert runs[True].keys() == runs[False].keys()
    assert not [k for k in runs[True] if "_orig_mod" in k]
    for key, value in runs[False].items():
        torch.testing.assert_close(runs[True][key], value, rtol=1e-5, atol=1e-6)


def test_last_checkpoint_follows_every_epoch_when_the_best_does_not(make_cfg) -> None:
    """Monitoring the epoch number for a minimum keeps epoch 0 as the best; last.ckpt must still
    hold the final epoch (Lightning 2.6 alone would leave it at the best), so a resume continues
    from there."""
    cfg = make_cfg(*SHORT, "test=false", "callbacks.model_checkpoint.monitor=epoch",
                   "callbacks.model_checkpoint.mode=min")  # fmt: skip
    summary = train(cfg)
    checkpoints = Path(cfg.paths.output_dir) / "checkpoints"
    best = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert (best["epoch"], best["global_step"]) == (0, 4)
    assert (last["epoch"], last["global_step"]) == (2, 12)  # 3 epochs of 4 batches


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(
        run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    return checkpoint["state_dict"]


@pytest.fixture
def restore_determinism_flags(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``Trainer(deterministic=True)`` sets process-wide flags; put them back after the test."""
    # set here, so that the Trainer keeps it and monkeypatch removes it afterwards
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", torch.backends.cudnn.deterministic)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


@pytest.mark.parametrize(
    "accelerator",
    [
        "cpu",
        pytest.param(
            "gpu",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
            ],
        ),
    ],
)
def test_resume_matches_uninterrupted_run(
    make_cfg, accelerator: str, restore_determinism_flags: None
) -> None:
    """Resuming from the epoch-2 checkpoint ends with the uninterrupted run's weights: exactly on
    the CPU, and on a GPU with deterministic algorithms to within a few float32 ulps.

    The EMA experiment is used so that the averaged weights' state is carried too, and one
    data-loading worker so that augmentation seeds in worker processes are covered. On a GPU the
    default algorithms (cuDNN's convolution backward among them) reduce in no fixed order, so two
    runs drift apart from the first step; ``trainer.deterministic=true`` fixes the order, and the
    tolerance (rtol 1e-5, atol 1e-6) only allows for rounding. A resume that lost state (RNG,
    optimiser, EMA) is off by far more.
    """
    every_epoch = [
        "callbacks.model_checkpoint.save_top_k=-1",
        "experiment=vision_classification/digits_ema",
        "data.num_workers=1",
    ]
    if accelerator == "gpu":
        every_epoch.append("trainer.deterministic=true")
    full = make_cfg(*SHORT, *every_epoch, subdir="full", accelerator=accelerator)
    train(full)
    full_dir = Path(full.paths.output_dir)
    mid = full_dir / "checkpoints" / "epoch001.ckpt"
    assert torch.load(mid, weights_only=True)["epoch"] == 1

    resumed = make_cfg(
        *SHORT, *every_epoch, f"ckpt_path={mid}", subdir="resumed", accelerator=accelerator
    )
    train(resumed)
    reference, result = final_weights(full_dir), final_weights(Path(resumed.paths.output_dir))
    assert reference.keys() == result.keys()
    for name in reference:
        if accelerator == "cpu":
            assert torch.equal(reference[name], result[name]), name
        else:
            torch.testing.assert_close(
                result[name],
                reference[name],
                rtol=1e-5,
                atol=1e-6,
                msg=lambda m, k=name: f"{k}: {m}",
            )
    full_ema = torch.load(full_dir / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]
    resumed_ema = torch.load(
        Path(resumed.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True
    )["callbacks"]
    ema_key = next(k for k in full_ema if "EMAWeightAveraging" in k)
    assert ema_key in resumed_ema


def test_non_finite_loss_stops_and_keeps_last_checkpoint(make_cfg) -> None:
    cfg = make_cfg(*SHORT)
    with open_dict(cfg):
        # the loss becomes NaN on the 6th training step, in the second epoch
        cfg.model = {
            "_target_": "tests.helpers.DivergingNet",
            "num_classes": 10,
            "in_chans": 1,
            "image_size": cfg.data.image_size,
            "diverge_at": 6,
        }
    with pytest.raises(NonFiniteLossError) as error:
        train(cfg)
    message = str(error.value)
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert "global step 5" in message and str(last) in message
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == 4  # the end of the first epoch, before the bad step
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values())


def test_missing_dataset_root_names_path_and_layout(make_cfg, tmp_path) -> None:
    missing = tmp_path / "no_imagenet_here"
    cfg = make_cfg("data=imagenet", "model=torchvision", f"data.root={missing}", "debug=fdr")
    with pytest.raises(DatasetLayoutError) as error:
        train(cfg)
    message = str(error.value)
    assert (
        str(missing) in message
        and "train/<class_name>/" in message
        and "val/<class_name>/" in message
    )


def test_malformed_dataset_root_names_missing_split(make_cfg, tmp_path) -> None:
    root = tmp_path / "half_imagenet"
    (root / "train" / "n01440764").mkdir(parents=True)
    cfg = make_cfg("data=imagenet", "model=torchvision", f"data.root={root}", "debug=fdr")
    with pytest.raises(DatasetLayoutError, match="has no 'val/' folder"):
        train(cfg)


def test_image_folder_dataset_trains(make_cfg, tmp_path) -> None:
    """A generated class-folder dataset (2 classes, PNG files) runs through data=image_folder."""
    from PIL import Image

    root = tmp_path / "shapes"
    generator = torch.Generator().manual_seed(0)
    for split, count in [("train", 6), ("val", 4), ("test", 4)]:
        for label in ["dark", "light"]:
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                base = 40 if label == "dark" else 200
                pixels = (base + torch.randint(0, 30, (40, 48, 3), generator=generator)).to(
                    torch.uint8
                )
                Image.fromarray(pixels.numpy()).save(folder / f"{i}.png")
    cfg = make_cfg(
        "data=image_folder",
        f"data.root={root}",
        "data.num_classes=2",
        "data.crop_size=32",
        "data.resize_size=36",
        "data.batch_size=4",
        "data.num_workers=0",
        "model=torchvision",
        "model.name=shufflenet_v2_x0_5",
        "debug=fdr",
    )
    summary = train(cfg)
    assert summary["input_shape"] == [1, 3, 32, 32]
    assert 0.0 <= summary["metrics"]["test/acc"] <= 1.0 and "test/loss" in summary["metrics"]


def test_all_loggers_write_offline(make_cfg, monkeypatch) -> None:
    """CSV, TensorBoard and W&B (offline, no account) together on a short run."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = make_cfg(
        "logger=[csv,tensorboard,wandb]",
        "debug=limit",
        "trainer.max_epochs=1",
        "data.num_workers=0",
    )
    train(cfg)
    out = Path(cfg.paths.output_dir)
    (csv,) = out.glob("csv/version_*/metrics.csv")
    header = csv.read_text().splitlines()[0].split(",")
    assert {"val/acc", "train/loss_step", "lr-SGD"} <= set(header)
    assert list(out.glob("tensorboard/version_*/events.out.tfevents.*"))
    assert list(out.glob("wandb/offline-run-*/run-*.wandb"))
