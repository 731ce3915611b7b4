"""A user's mistake on a root script's command line ends in one ``error: ...`` line on stderr and
exit status 2: an unknown config-group option or key (refused by Hydra's composition, before the
script's own code runs), a GPU Trainer on a machine without one, a checkpoint of a system the
tool does not serve. ``HYDRA_FULL_ERROR=1`` keeps Hydra's own error."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.errors import MissingConfigException
from PIL import Image

from src.build import build_task, check_served, hydra_choices
from src.commands.eval import evaluate
from src.commands.generate import generate
from src.commands.predict import predict
from src.utils.config_checks import ConfigError, check_accelerator, unknown_key, unknown_option
from src.utils.errors import WrongRunError
from src.utils.run_record import RECORD_KEY, make_record
from tests.conftest import ROOT, compose_config
from tests.tasks.test_translation_task import reversal_corpus


def run_script(
    script: str, *args: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> tuple[int, str]:
    """The exit status and stderr of ``python <script> *args``, run in this process (the errors
    under test stop it during Hydra's composition, before any job is set up)."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / script), *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [("train.py", ["model=dicnet"],
      "model=dicnet: no such option (did you mean model=dicenet?). The options of model, closest "
      "first: dicenet, dice_resnet, dicenet_seg, dice_mobilenet, espnetv2, "),
     ("train.py", ["data.batchsize=64"],
      "data.batchsize (did you mean data.batch_size?): no such key; data has data.augment, "
      "data.batch_size, data.image_size, "),
     ("train.py", ["experiment=char_lm/demoo"],
      "experiment=char_lm/demoo: no such option (did you mean experiment=char_lm/demo?). The "
      "options of experiment, closest first: char_lm/demo, "),
     ("train.py", ["modle=dicenet"],
      "modle (did you mean model?): no such key or config group; the config has callbacks, "
      "ckpt_path, "),
     ("eval.py", ["data=enwik9"], "data=enwik9: no such option (did you mean data=enwik8?)"),
     ("translate.py", ["ckpt_pat=x.ckpt", "Ein Satz."], "ckpt_pat (did you mean ckpt_path?)"),
     ("complexity.py", ["--cfg", "job", "model=espnet"],
      "model=espnet: no such option (did you mean model=espnetv2?)")],
)  # fmt: skip
def test_a_composition_error_is_one_line_with_the_closest_choice(
    script: str, args: list[str], message: str, monkeypatch, capsys
) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    status, err = run_script(script, *args, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_the_debug_switch_keeps_hydras_own_error(monkeypatch) -> None:
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "train.py"), "model=dicnet"])
    with pytest.raises(MissingConfigException, match="Could not find 'model/dicnet'"):
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")


def test_the_process_exits_with_status_2_and_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "train.py", "model=dicnet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "error: model=dicnet: no such option (did you mean model=dicenet?)"
    )
    assert done.stderr.count("\n") == 1, done.stderr


def test_the_messages_rank_options_and_keys_by_likeness() -> None:
    assert str(unknown_option("model", "dicnet", ["ssd", "espnetv2", "dicenet"])) == (
        "model=dicnet: no such option (did you mean model=dicenet?). The options of model, closest "
        "first: dicenet, espnetv2, ssd"
    )
    assert str(unknown_option("data", "zzz", ["b", "a"])).startswith("data=zzz: no such option. ")
    assert str(unknown_key("task.optimizer.lrr", ["_target_", "lr", "betas"])) == (
        "task.optimizer.lrr (did you mean task.optimizer.lr?): no such key; task.optimizer has "
        "task.optimizer.betas, task.optimizer.lr (+task.optimizer.lrr=... adds a new key)"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU: trainer=gpu works")
def test_a_gpu_trainer_without_a_gpu_names_the_cpu_trainer() -> None:
    with pytest.raises(
        ConfigError, match=r"trainer.accelerator=gpu \(trainer=ddp\): this machine has no GPU"
    ):
        check_accelerator({"accelerator": "gpu"}, "ddp")
    check_accelerator({"accelerator": "cpu"}, "cpu")
    done = subprocess.run(
        [sys.executable, "train.py", "trainer=gpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == (
        "error: trainer.accelerator=gpu (trainer=gpu): this machine has no GPU that PyTorch can "
        "use; train on the CPU with trainer=cpu (trainer=ddp_cpu for data-parallel CPU processes)"
    )
    assert "Traceback" not in done.stderr


TRANSLATION = ["data=iwslt14_de_en", "data.source_lang=xx", "data.target_lang=yy",
               "data.src_vocab_size=null", "data.tgt_vocab_size=null", "model.d_model=32",
               "model.n_min=2", "model.n_max=3"]  # fmt: skip


@pytest.fixture(scope="module")
def translation_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained small DeLighT translation checkpoint with its run record."""
    tmp = tmp_path_factory.mktemp("translation")
    corpus = reversal_corpus(tmp / "corpus", n_train=200)
    cfg = compose_config("train", [*TRANSLATION, f"data.root={corpus}"], tmp / "run")
    _, task = build_task(cfg)
    path = tmp / "model.ckpt"
    torch.save(
        {"state_dict": task.state_dict(), RECORD_KEY: make_record(cfg, hydra_choices())}, path
    )
    return path


def served_by_translate(path: Path, tool: str) -> str:
    return (
        f"{tool} does not serve DeLighTEncoderDecoder networks: ckpt_path={path} is a "
        "TranslationDataModule run (translation, TranslationTask); use python translate.py "
        f"ckpt_path={path} (eval.py and export.py serve it too)"
    )


def test_predict_names_the_tool_of_a_translation_checkpoint(
    translation_checkpoint: Path, tmp_path: Path
) -> None:
    image = tmp_path / "digit.png"
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(image)
    cfg = compose_config(
        "predict", [f"image={image}", f"ckpt_path={translation_checkpoint}"], tmp_path / "run"
    )
    with pytest.raises(WrongRunError) as error:
        predict(cfg)
    assert str(error.value) == served_by_translate(translation_checkpoint, "predict.py")
    done = subprocess.run(
        [sys.executable, "predict.py", f"image={image}", f"ckpt_path={translation_checkpoint}",
         f"paths.log_dir={tmp_path / 'logs'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == "error: " + served_by_translate(
        translation_checkpoint, "predict.py"
    )
    assert "Traceback" not in done.stderr


def test_generate_and_eval_name_what_serves_a_translation_checkpoint(
    translation_checkpoint: Path, tmp_path: Path
) -> None:
    cfg = compose_config(
        "generate", ["prompt=abc", f"ckpt_path={translation_checkpoint}"], tmp_path / "g"
    )
    with pytest.raises(WrongRunError) as error:
        generate(cfg)
    assert str(error.value) == served_by_translate(translation_checkpoint, "generate.py")
    cfg = compose_config(
        "eval",
        [f"ckpt_path={translation_checkpoint}", "dynamic_eval=true", "trainer.accelerator=cpu"],
        tmp_path / "e",
    )  # fmt: skip
    with pytest.raises(
        WrongRunError, match="dynamic_eval needs a task=awd_lm checkpoint, got TranslationTask"
    ):
        evaluate(cfg)


def test_export_refuses_a_network_it_has_no_graph_for(tmp_path: Path) -> None:
    corpus = reversal_corpus(tmp_path / "corpus", n_train=50)
    overrides = [*TRANSLATION[:5], f"data.root={corpus}", "model=transformer_mt",
                 "model.d_model=16", "model.ffn_dim=32", "model.num_heads=2",
                 "model.num_layers=1"]  # fmt: skip
    cfg = compose_config("train", overrides, tmp_path / "run")
    datamodule, task = build_task(cfg)
    check_served("translate.py", cfg, datamodule, task)
    with pytest.raises(WrongRunError) as error:
        check_served("export.py", cfg, datamodule, task)
    assert str(error.value) == (
        "export.py does not serve TransformerEncoderDecoder networks: the config is a "
        "TranslationDataModule run (translation, TranslationTask); use python translate.py "
        "(eval.py serves it too)"
    )
