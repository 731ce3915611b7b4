"""Runs never silently do something else: checkpoints carry their run, a checkpoint that does not
fit says what it was trained with, mistakes in the command line are refused with the fix, and
an interrupt keeps a checkpoint that the same run directory resumes from."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from src.build import check_config
from src.commands.eval import evaluate
from src.commands.generate import generate
from src.commands.predict import predict
from src.commands.train import train
from src.models.dicenet import DiCENet
from src.models.hub import timm_model
from src.tasks.finetune import load_network_weights
from src.utils.config_checks import MODEL_TASKS, ConfigError, check_config_values, check_pairing
from src.utils.run_record import CheckpointError, check_resume, project_version, read_checkpoint
from tests.conftest import CONF, ROOT, compose_config

# one short real run: 2 epochs of 2 batches of a timm ResNet on digits
TINY = [
    "model=timm",
    "trainer.accelerator=cpu",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.num_sanity_val_steps=0",
    "data.batch_size=16",
    "data.num_workers=0",
    "logger=csv",
    "callbacks.progress_bar=null",
]
TIMM_PARAMS = 4_927_186  # resnet10t, 10 classes, 1 input channel


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of a finished TINY run."""
    run_dir = tmp_path_factory.mktemp("digits") / "run"
    train(compose_config("train", TINY, run_dir))
    return run_dir


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("not a checkpoint\n")
    return path


def test_checkpoint_carries_its_run(digits_run: Path) -> None:
    checkpoint = read_checkpoint(digits_run / "checkpoints" / "last.ckpt")
    record = checkpoint["lightnets"]
    assert record["version"] == project_version()
    assert record["choices"]["model"] == "timm" and record["choices"]["data"] == "digits"
    config = record["config"]
    assert config["model"]["name"] == "resnet10t" and config["model"]["num_classes"] == 10
    assert config["data"]["batch_size"] == 16 and config["task"]["optimizer"]["lr"] == 0.05
    assert record["wall_time_s"] > 0


def test_eval_needs_only_the_checkpoint(digits_run: Path, tmp_path: Path, caplog) -> None:
    trained = json.loads((digits_run / "metrics.json").read_text())
    # eval.yaml's own defaults (model=dicenet) are replaced by the checkpoint's record
    overrides = [
        f"ckpt_path={trained['best_checkpoint']}",
        "trainer.accelerator=cpu",
        "trainer.limit_test_batches=2",
    ]
    with caplog.at_level(logging.INFO):
        summary = evaluate(compose_config("eval", overrides, tmp_path / "eval"))
    assert summary["params"] == TIMM_PARAMS
    assert summary["metrics"]["test/acc"] == pytest.approx(trained["metrics"]["test/acc"], abs=1e-6)
    assert "model: from the checkpoint" in caplog.text


def test_a_given_override_still_wins_and_is_reported(
    digits_run: Path, tmp_path: Path, caplog
) -> None:
    overrides = [
        f"ckpt_path={digits_run / 'checkpoints' / 'last.ckpt'}", "trainer.accelerator=cpu",
        "trainer.limit_test_batches=1", "data.batch_size=8",
    ]  # fmt: skip
    cfg = compose_config("eval", overrides, tmp_path / "eval")
    with caplog.at_level(logging.INFO):
        evaluate(cfg)
    assert cfg.data.batch_size == 8 and cfg.model.name == "resnet10t"
    assert "data: from the checkpoint, with data.batch_size=8 from the command line" in caplog.text


def test_checkpoint_into_another_network_says_what_it_was_trained_with(
    digits_run: Path, tmp_path: Path
) -> None:
    overrides = [
        f"ckpt_path={digits_run / 'checkpoints' / 'last.ckpt'}",
        "model=dicenet",
        "trainer.accelerator=cpu",
    ]
    with pytest.raises(CheckpointError) as error:
        evaluate(compose_config("eval", overrides, tmp_path / "eval"))
    message = str(error.value)
    assert (
        "trained with: model=timm (timm_model, name=resnet10t, num_classes=10, in_chans=1)"
        in message
    )
    assert "asked for:    model=dicenet (DiCENet" in message
    assert "tensors differ in shape" in message
    assert len(message.splitlines()) == 5 and len(message) < 1200  # a few lines, never every key


def test_a_text_file_is_not_a_checkpoint(text_file: Path, tmp_path: Path) -> None:
    expected = f"={text_file} is not a weights file or checkpoint"
    with pytest.raises(CheckpointError, match="ckpt_path" + expected):
        evaluate(compose_config("eval", [f"ckpt_path={text_file}"], tmp_path / "eval"))
    with pytest.raises(CheckpointError, match="ckpt_path" + expected):
        train(compose_config("train", [*TINY, f"ckpt_path={text_file}"], tmp_path / "train"))
    with pytest.raises(ValueError, match="init_checkpoint" + expected):
        load_network_weights(
            DiCENet(scale=0.2, num_classes=10, in_chans=1, input_size=32), text_file
        )
    with pytest.raises(ValueError, match="weights" + expected):
        timm_model("resnet10t", 10, 1, weights=str(text_file))


def test_init_checkpoint_takes_a_checkpoint_of_this_project(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = DiCENet(scale=0.2, num_classes=10, in_chans=1, input_size=32)
    path = tmp_path / "run.ckpt"
    torch.save({"state_dict": {f"net.{k}": v for k, v in source.state_dict().items()}}, path)
    loaded = DiCENet(scale=0.2, num_classes=10, in_chans=1, input_size=32)
    load_network_weights(loaded, path)
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    timm_source = timm_model("resnet10t", 10, 1)
    torch.save({"state_dict": {f"net.{k}": v for k, v in timm_source.state_dict().items()}}, path)
    timm_loaded = timm_model("resnet10t", 10, 1, weights=str(path))
    assert all(
        torch.equal(timm_loaded.state_dict()[k], v) for k, v in timm_source.state_dict().items()
    )


def test_resume_with_a_new_learning_rate_is_refused(digits_run: Path, tmp_path: Path) -> None:
    last = digits_run / "checkpoints" / "last.ckpt"
    checkpoint = read_checkpoint(last)
    changed = compose_config(
        "train", [*TINY, f"ckpt_path={last}", "task.optimizer.lr=1e6"], tmp_path / "a"
    )
    with pytest.raises(CheckpointError) as error:
        check_resume(changed, checkpoint, last)
    assert "task.optimizer.lr: trained with 0.05, now 1000000.0" in str(error.value)
    assert f"task.init_checkpoint={last}" in str(error.value)
    # a longer schedule is not a change of the network or task: resuming to more epochs is allowed
    longer = compose_config(
        "train", [*TINY, f"ckpt_path={last}", "trainer.max_epochs=3"], tmp_path / "b"
    )
    check_resume(longer, checkpoint, last)


@pytest.fixture
def digit_png(tmp_path: Path) -> Path:
    path = tmp_path / "digit.png"
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4).save(path)
    return path


def test_predict_refuses_a_network_without_weights(
    digit_png: Path, digits_run: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="no weights: pass ckpt_path="):
        predict(compose_config("predict", [f"image={digit_png}", "model=timm"], tmp_path / "a"))
    random = predict(
        compose_config(
            "predict", [f"image={digit_png}", "model=timm", "allow_random=true"], tmp_path / "b"
        )
    )
    assert len(random["top_k"]) == 5
    ckpt = digits_run / "checkpoints" / "last.ckpt"
    trained = predict(
        compose_config("predict", [f"image={digit_png}", f"ckpt_path={ckpt}"], tmp_path / "c")
    )
    assert len(trained["top_k"]) == 5
    assert sum(p for _, p in trained["top_k"]) <= 1.0 + 1e-6


def test_predict_names_an_unreadable_image(text_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"image={text_file} cannot be read as an image"):
        predict(
            compose_config("predict", [f"image={text_file}", "allow_random=true"], tmp_path / "a")
        )


def test_generate_refuses_without_weights_and_names_a_non_language_model(
    digits_run: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="no weights: pass ckpt_path="):
        generate(compose_config("generate", ["prompt=def"], tmp_path / "a"))
    ckpt = digits_run / "checkpoints" / "last.ckpt"
    with pytest.raises(TypeError, match="is a DigitsDataModule run"):
        generate(compose_config("generate", ["prompt=def", f"ckpt_path={ckpt}"], tmp_path / "b"))


def test_unknown_top_level_key_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "train.py", "+modle=dicenet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "error: unknown top-level config key 'modle' (did you mean 'model'?)"
    )
    assert "Traceback" not in done.stderr
    assert "Known keys and config groups: callbacks, ckpt_path, compile, data," in done.stderr


@pytest.mark.parametrize(
    ("data", "model"),
    [("digits", "dicenet"), ("imagenet", "dicenet"), ("enwik8", "group_transformer"),
     ("text8", "group_transformer"), ("pydoc_chars", "group_transformer"),
     ("voc_seg", "espnetv2_seg"), ("cityscapes", "espnetv2_seg"),
     ("coco_multilabel", "dicenet"), ("image_folder", "dicenet"),
     ("wikitext103", "delight_lm"), ("pydoc_words", "delight_lm"), ("gettext_de_en", "delight_mt"),
     ("iwslt14_de_en", "delight_mt"), ("wmt16_en_ro", "delight_mt"), ("wmt14_en_de", "delight_mt"),
     ("wmt14_en_fr", "delight_mt"),
     ("sentiment_tweets", "delight_classifier"), ("imdb", "delight_classifier"),
     ("sst2", "delight_classifier"),
     ("ptb", "awd_lm"), ("wikitext2", "awd_lm"), ("pydoc_ptb", "awd_lm"),
     ("voc_det", "ssd"), ("coco_det", "ssd"), ("coins_det", "ssd"),
     ("wikitext103_segments", "group_transformer_lm"),
     ("pydoc_words_segments", "group_transformer_lm")],
)  # fmt: skip
def test_each_data_picks_a_model_that_fits(data: str, model: str) -> None:
    needs = (
        ["data.num_classes=5"] if data == "image_folder" else []
    )  # the folders give it at run time
    cfg = compose_config("train", [f"data={data}", *needs], keep_hydra=True)
    choices = cfg.hydra.runtime.choices
    assert choices.model == model
    assert choices.task in MODEL_TASKS[model]
    check_pairing(choices)
    check_config_values(cfg)  # every key is an argument of its target, every size positive
    # the model's interpolations (${data.num_classes}, ${data.vocab_size}) resolve against this data
    OmegaConf.to_container(cfg.model, resolve=True)


def test_every_data_config_is_covered() -> None:
    covered = {p.stem for p in (CONF / "data").glob("*.yaml")}
    assert covered == {"digits", "imagenet", "enwik8", "text8", "pydoc_chars", "voc_seg",
                       "cityscapes", "coco_multilabel", "image_folder", "wikitext103",
                       "pydoc_words", "gettext_de_en",
                       "iwslt14_de_en", "wmt16_en_ro", "wmt14_en_de", "wmt14_en_fr",
                       "sentiment_tweets", "imdb", "sst2", "ptb", "wikitext2", "pydoc_ptb",
                       "voc_det", "coco_det", "coins_det", "wikitext103_segments",
                       "pydoc_words_segments"}  # fmt: skip


def test_an_explicit_model_still_wins() -> None:
    cfg = compose_config("train", ["data=enwik8", "model=transformer_xl"], keep_hydra=True)
    assert cfg.hydra.runtime.choices.model == "transformer_xl"
    assert cfg.model._target_ == "src.models.transformer_xl.TransformerXL"


def test_every_model_config_says_which_tasks_it_serves() -> None:
    assert {p.stem for p in (CONF / "model").glob("*.yaml")} == set(MODEL_TASKS)


def test_a_pair_that_cannot_work_fails_in_one_line() -> None:
    cfg = compose_config("train", ["data=enwik8", "model=dicenet"])
    with pytest.raises(ConfigError) as error:
        check_config(cfg, "train")
    message = str(error.value)
    assert message.startswith(
        "model=dicenet does not fit data=enwik8: dicenet serves classification/multilabel"
    )
    assert "choose one of model=group_transformer|transformer_xl" in message and "\n" not in message


def wait_for(path: Path, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.2)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_signal_keeps_a_checkpoint_and_the_resume_continues_the_run(
    tmp_path: Path, signum: int
) -> None:
    """Ctrl-C, or SIGTERM as SLURM pre-emption sends it, during a real ``train.py``."""
    overrides = [o for o in TINY if not o.startswith("trainer.max_epochs")] + [
        "trainer.max_epochs=1000"
    ]
    command = [sys.executable, "train.py", *overrides, f"paths.log_dir={tmp_path}"]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # the first end-of-epoch checkpoint: training is under way
        wait_for(tmp_path / "train" / "runs", process, 120)
        (run_dir,) = (tmp_path / "train" / "runs").iterdir()
        wait_for(run_dir / "checkpoints" / "epoch000.ckpt", process, 120)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 128 + signum, stderr[-3000:]
    interrupted = run_dir / "checkpoints" / "interrupted.ckpt"
    summary = json.loads((run_dir / "metrics.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signum
    assert summary["interrupted_checkpoint"] == str(interrupted)
    assert f"ckpt_path={interrupted}" in stdout and "resume with:" in stdout
    # the checkpoint is saved whole on purpose, and loaded with weights_only=True: no default told
    assert "`weights_only` was not set" not in stdout + stderr
    stopped_at = read_checkpoint(interrupted)["global_step"]
    assert stopped_at == summary["global_step"] >= 2

    # resume to the end of the current epoch + 1: checkpoints and metrics.json in the same run
    epochs = read_checkpoint(interrupted)["epoch"] + 2
    cfg = compose_config(
        "train",
        [*TINY, f"trainer.max_epochs={epochs}", f"ckpt_path={interrupted}"],
        tmp_path / "resume",
    )
    resumed = train(cfg)
    assert resumed["output_dir"] == str(run_dir)
    final = json.loads((run_dir / "metrics.json").read_text())
    assert final["status"] == "finished" and final["resumed_from"] == str(interrupted)
    assert final["wall_time_s"] > summary["wall_time_s"]
    assert read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] > stopped_at
    assert (run_dir / "resumes" / "resume").is_symlink()


def test_a_finished_run_is_never_written_into(digits_run: Path, tmp_path: Path) -> None:
    before = (digits_run / "metrics.json").read_text()
    last = digits_run / "checkpoints" / "last.ckpt"
    cfg = compose_config(
        "train", [*TINY, "trainer.max_epochs=3", f"ckpt_path={last}"], tmp_path / "more"
    )
    summary = train(cfg)
    assert summary["output_dir"] == str(tmp_path / "more")
    assert (digits_run / "metrics.json").read_text() == before


def test_data_alone_trains_its_default_model(tmp_path: Path) -> None:
    """``python train.py data=pydoc_chars debug=fdr``: the data picks the Group-Transformer, and the
    smoke-test config sets nothing the character data lacks."""
    cfg = compose_config(
        "train", ["data=pydoc_chars", "debug=fdr", "trainer.accelerator=cpu"], tmp_path / "run"
    )
    summary = train(cfg)
    assert cfg.model._target_ == "src.models.group_transformer.GroupTransformer"
    assert summary["status"] == "finished"
    assert 0.0 < summary["metrics"]["test/bpc"] < 8.0  # log2 of a ~100-symbol vocabulary is 6.7


@pytest.mark.parametrize(
    ("overrides", "message"),
    [(["+model.d_modle=64"],
      "model.d_modle: DiCENet (src.models.dicenet.DiCENet) takes no such argument"),
     (["experiment=delight_mt/demo", "+model.d_modle=64"],
      "model.d_modle (did you mean model.d_model?): DeLighTEncoderDecoder"),
     (["+data.batchsize=4"], "data.batchsize (did you mean data.batch_size?): DigitsDataModule"),
     (["experiment=delight_mt/demo", "+task.optimizer.betas2=0.9"],
      "task.optimizer.betas2 (did you mean task.optimizer.betas?)"),
     (["data.batch_size=0"], "data.batch_size=0: must be a positive integer"),
     (["experiment=detection/ssd_demo", "data.batch_size=-2"],
      "data.batch_size=-2: must be a positive integer"),
     (["experiment=delight_mt/demo", "data.max_tokens=0"],
      "data.max_tokens=0: must be a positive integer"),
     (["task.optimizer.lr=0"], "task.optimizer.lr=0: must be a positive number"),
     (["trainer.max_epochs=0"],
      "trainer.max_epochs=0: must be a positive integer, or -1 for no limit")],
)  # fmt: skip
def test_keys_and_sizes_are_checked_before_anything_is_built(
    overrides: list[str], message: str
) -> None:
    cfg = compose_config("train", overrides)
    with pytest.raises(ConfigError) as error:
        check_config(cfg, "train")
    assert str(error.value).startswith(message), str(error.value)


def test_a_user_error_ends_the_run_in_one_line_and_a_debug_switch_shows_its_traceback() -> None:
    command = [sys.executable, "train.py", "data.batch_size=0"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr) == (
        2,
        "error: data.batch_size=0: must be a positive integer\n",
    )
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1 and "Traceback" in done.stderr and "ConfigError" in done.stderr
