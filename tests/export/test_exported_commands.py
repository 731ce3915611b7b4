"""``export.py`` on every text system and a vision network, then ``generate.py``,
``translate.py`` and ``predict.py`` with ``onnx=<the file>``: the same output as with the
checkpoint, the config coming from the run record inside the file (the checkpoint's, as
``train.py`` writes it) and a text system's vocabulary from the file too (the data folder empty).
Small untrained networks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.build import build_from_checkpoint, build_task, hydra_choices
from src.commands.export import export, record_of_run
from src.commands.generate import generate
from src.commands.predict import predict
from src.commands.translate import translate
from src.datamodules.digits import DIGITS_MEAN, DIGITS_STD
from src.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD
from src.datamodules.voc_seg import VOC_CLASSES
from src.decoding.beam_search import beam_search
from src.export.metadata import read_metadata
from src.export.translate_onnx import OnnxTranslator
from src.export.vocabulary import use_exported_vocabulary
from src.utils.errors import UsageError, WrongRunError
from src.utils.run_record import RECORD_KEY, make_record
from tests.conftest import ROOT, compose_config
from tests.datamodules.test_text_classification import tweets_file
from tests.datamodules.test_voc_seg import make_voc
from tests.tasks.test_translation_task import reversal_corpus

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TOL = 1e-4
SYSTEMS = {
    "group_transformer": [
        "experiment=char_lm/demo", "model.n_layer=1", "model.d_model=32", "model.n_head=2",
        "model.d_inner=64", "model.mem_len=16", "data.tgt_len=16",
    ],
    "pru": ["experiment=pru_lm/demo", "model.embedding_dim=16", "model.hidden_size=32"],
    "delight_lm": [
        "experiment=delight_lm/demo", "data.tokens_per_sample=16", "data.eval_context_window=8",
        "model.d_model=32", "model.n_min=2", "model.n_max=3",
    ],
}  # fmt: skip


def checkpoint_of(overrides: list[str], tmp: Path) -> Path:
    """A checkpoint of the untrained network ``overrides`` compose, with the run record
    ``train.py`` writes into it (the choices and sections of that composition)."""
    torch.manual_seed(0)
    cfg = compose_config("train", overrides, tmp / "train")
    _, task = build_task(cfg)
    path = tmp / "model.ckpt"
    record = make_record(cfg, hydra_choices())
    torch.save({"state_dict": task.state_dict(), RECORD_KEY: record}, path)
    return path


def export_checkpoint(ckpt: Path, out: Path, *extra: str) -> dict:
    """``python export.py ckpt_path=<ckpt> out=<out>``: the network, data and task from the
    checkpoint's run record alone."""
    return export(compose_config("export", [f"ckpt_path={ckpt}", f"out={out}", *extra], out.parent))


def assert_record_is_the_checkpoints(path: Path, ckpt: Path) -> None:
    """The run record in the exported file's metadata is the checkpoint's: its choices and its
    ``model`` and ``task`` sections."""
    saved = torch.load(ckpt, weights_only=True)[RECORD_KEY]
    record = read_metadata(path)["record"]
    assert record["choices"] == saved["choices"]
    assert record["config"]["model"] == saved["config"]["model"]
    assert record["config"]["task"] == saved["config"]["task"]


def untouched(folder: Path) -> list[Path]:
    """The files under ``folder`` (a data folder that must stay empty)."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module", params=sorted(SYSTEMS))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One system's checkpoint, its export and the card."""
    tmp = tmp_path_factory.mktemp(request.param)
    overrides = [*SYSTEMS[request.param], f"data.root={tmp / 'data'}"]
    ckpt = checkpoint_of(overrides, tmp)
    card = export_checkpoint(ckpt, tmp / "net")
    return {"name": request.param, "overrides": overrides, "ckpt": ckpt, "card": card, "tmp": tmp}


def test_export_card_and_parity(exported: dict) -> None:
    card = exported["card"]
    (graph,) = card["graphs"]
    path = Path(graph["file"])
    assert path.suffix == ".onnx" and path.is_file()
    assert json.loads(path.with_suffix(".json").read_text())["graphs"][0]["file"] == str(path)
    assert card["exporter"] == "torch.onnx.export(dynamo=True)"
    assert card["parity"]["checks"]
    for check in card["parity"]["checks"]:
        assert check["max_abs"] <= TOL, check
    metadata = read_metadata(path)
    assert metadata["record"]["config"]["model"]["_target_"] == card["model"]["target"]
    assert_record_is_the_checkpoints(path, exported["ckpt"])
    assert card["model"]["choice"] == metadata["record"]["choices"]["model"]
    assert card["params"] > 0


def generated(overrides: list[str], tmp: Path, capsys: pytest.CaptureFixture, *extra: str) -> str:
    capsys.readouterr()
    generate(compose_config("generate", [*overrides, *extra], tmp / "generate"))
    return capsys.readouterr().out


def test_generate_from_the_exported_file(exported: dict, capsys) -> None:
    # only the file: the config and the vocabulary are in it; no corpus is read or built
    empty = exported["tmp"] / "empty"
    empty.mkdir(exist_ok=True)
    from_file = [
        f"onnx={exported['tmp'] / 'net.onnx'}",
        f"data.root={empty}",
        f"paths.data_dir={empty}",
    ]
    from_ckpt = [*exported["overrides"], f"ckpt_path={exported['ckpt']}"]
    greedy = ["prompt='The default value of the'", "top_k=1"]
    greedy.append(
        "max_new_chars=24" if exported["name"] == "group_transformer" else "max_new_words=8"
    )
    eager = generated(from_ckpt, exported["tmp"], capsys, *greedy)
    assert generated(from_file, exported["tmp"], capsys, *greedy) == eager
    if exported["name"] == "group_transformer":  # word completion ranks the same words
        words = ["prompt='The default val'", "mode=words", "num_words=4", "max_word_len=5"]
        rows = [
            generated(o, exported["tmp"], capsys, *words).splitlines()[1:]
            for o in (from_ckpt, from_file)
        ]
        assert [r.split()[1] for r in rows[0]] == [r.split()[1] for r in rows[1]]
        scores = np.array([[float(r.split()[2]) for r in found] for found in rows])
        assert np.abs(scores[0] - scores[1]).max() <= 1e-3
    assert untouched(empty) == []


@pytest.fixture(scope="module")
def translation(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("translation")
    corpus = reversal_corpus(tmp / "corpus", n_train=200)
    overrides = [
        "data=iwslt14_de_en", f"data.root={corpus}", "data.source_lang=xx", "data.target_lang=yy",
        "data.src_vocab_size=null", "data.tgt_vocab_size=null", "model.d_model=32", "model.n_min=2",
        "model.n_max=3", "task.max_len_a=0", "task.max_len_b=6",
    ]  # fmt: skip
    ckpt = checkpoint_of(overrides, tmp)
    card = export_checkpoint(ckpt, tmp / "mt")
    return {"overrides": overrides, "ckpt": ckpt, "card": card, "tmp": tmp}


def test_translate_from_the_exported_pair(translation: dict) -> None:
    card, tmp = translation["card"], translation["tmp"]
    assert [g["name"] for g in card["graphs"]] == ["encoder", "decoder_step"]
    assert [c["identical"] for c in card["parity"]["checks"]] == [True, True]
    sources = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"]
    with_ckpt = [*translation["overrides"], f"ckpt_path={translation['ckpt']}", "batch_size=2"]
    eager = translate(compose_config("translate", with_ckpt, tmp / "translate"), sources)
    for graph in ("encoder", "decoder_step"):
        assert_record_is_the_checkpoints(tmp / f"mt.{graph}.onnx", translation["ckpt"])
    # the vocabulary is in the files: the data folder may be empty
    empty = tmp / "empty"
    empty.mkdir()
    for name in ("mt.encoder.onnx", "mt.decoder_step.onnx", "mt"):  # either file, or the stem
        overrides = [f"onnx={tmp / name}", "batch_size=2", f"data.root={empty}"]
        cfg = compose_config("translate", overrides, tmp / "translate")
        assert translate(cfg, sources) == eager
    assert untouched(empty) == []


def test_exported_pair_steps_and_beam_scores(translation: dict) -> None:
    """The decoder step fed its own caches matches eager decoding step by step; beam search on the
    pair gives the eager hypotheses and scores."""
    _, task = build_task(
        compose_config("train", translation["overrides"], translation["tmp"] / "t")
    )
    task.load_state_dict(torch.load(translation["ckpt"], weights_only=True)["state_dict"])
    model = task.net.eval()
    translator = OnnxTranslator.from_export(translation["tmp"] / "mt")
    torch.manual_seed(1)
    src = torch.randint(4, 12, (4, 9))
    src[1, 6:] = src[3, 4:] = model.padding_idx  # right-padded rows of other lengths
    mask = src.eq(model.padding_idx)
    with torch.no_grad():
        encoder_out = model.encode(src, mask)
        assert (translator.encode(src, mask) - encoder_out).abs().max() <= TOL
        state = onnx_state = None
        tokens = torch.full((4, 1), task.eos)
        for step in range(4):
            logits, state = model.decode_step(tokens, encoder_out, mask, state)
            onnx_logits, onnx_state = translator.decode_step(tokens, encoder_out, mask, onnx_state)
            assert (onnx_logits - logits).abs().max() <= TOL, step
            assert onnx_state.keys[0].shape[0] == step + 1
            tokens = logits[:, -1].argmax(-1, keepdim=True)
        search = {"eos": task.eos, "pad": model.padding_idx, "max_len_a": 1.2, "max_len_b": 5,
                  "length_penalty": 1.0}  # fmt: skip
        eager = beam_search(model, src, beam_size=4, **search)
        onnx = beam_search(translator, src, beam_size=4, **search)
    assert [h[0].tokens.tolist() for h in onnx] == [h[0].tokens.tolist() for h in eager]
    assert [h[0].score for h in onnx] == pytest.approx([h[0].score for h in eager], abs=1e-5)


@pytest.fixture(scope="module")
def espnet(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An ESPNetv2 classifier of the digits at 64x64 (two output strides: H and W dynamic), its
    checkpoint, its export and an image."""
    tmp = tmp_path_factory.mktemp("espnet")
    overrides = ["model=espnetv2", "model.scale=0.5", "data.image_size=64"]
    ckpt = checkpoint_of(overrides, tmp)
    # the initial classifier (std 0.001) gives near-equal probabilities; spread them so that the
    # order of the top classes says something
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["state_dict"]["net.classifier.weight"] *= 100_000
    torch.save(checkpoint, ckpt)
    export_checkpoint(ckpt, tmp / "espnet")
    image = tmp / "digit.png"
    pixels = np.random.default_rng(0).random((40, 52, 3)) * 255
    Image.fromarray(pixels.astype(np.uint8)).save(image)
    return {"overrides": overrides, "ckpt": ckpt, "onnx": tmp / "espnet.onnx", "image": image,
            "tmp": tmp}  # fmt: skip


def test_predict_from_the_exported_file(espnet: dict) -> None:
    tmp_path, ckpt, onnx = espnet["tmp"], espnet["ckpt"], espnet["onnx"]
    assert_record_is_the_checkpoints(onnx, ckpt)
    common = [f"image={espnet['image']}", "top_k=3"]
    eager = predict(
        compose_config("predict", [*espnet["overrides"], f"ckpt_path={ckpt}", *common], tmp_path)
    )
    got = predict(compose_config("predict", [f"onnx={onnx}", *common], tmp_path))
    assert [name for name, _ in got["top_k"]] == [name for name, _ in eager["top_k"]]
    assert np.allclose([p for _, p in got["top_k"]], [p for _, p in eager["top_k"]], atol=1e-5)
    # a text graph is refused by predict.py; ckpt_path and onnx together are refused
    with pytest.raises(UsageError, match="not both"):
        predict(compose_config("predict", [f"onnx={onnx}", f"ckpt_path={ckpt}", *common], tmp_path))
    with pytest.raises(UsageError, match="no such file"):
        predict(compose_config("predict", [f"onnx={tmp_path / 'none.onnx'}", *common], tmp_path))
    with pytest.raises(WrongRunError) as refused:
        generate(compose_config("generate", [f"onnx={onnx}", "prompt=x"], tmp_path))
    assert str(refused.value).startswith("generate.py does not serve ESPNetv2 networks")
    assert str(refused.value).endswith(f"use python predict.py onnx={onnx}")


def test_vision_file_names_its_input_and_classes(espnet: dict) -> None:
    metadata = read_metadata(espnet["onnx"])
    assert metadata["task"] == "classification"
    assert metadata["classes"] == [str(digit) for digit in range(10)]
    assert metadata["input"] == {
        "name": "image", "layout": "NCHW", "mode": "L", "channels": 1, "size": [64, 64],
        "dynamic_size": True, "size_step": 32, "scale": 1 / 255, "mean": [DIGITS_MEAN],
        "std": [DIGITS_STD],
    }  # fmt: skip


def deploy_script() -> str:
    """The onnxruntime-only script of docs/deploy.md (the python block headed ``# classify.py``)."""
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    (script,) = [block for block in blocks if block.startswith("# classify.py")]
    return script


def test_deploy_script_names_the_classes_predict_names(espnet: dict, tmp_path: Path) -> None:
    """The docs' script, run with onnxruntime, numpy and Pillow alone (outside the project, no
    project import possible), prints predict.py's classes and probabilities."""
    script = tmp_path / "classify.py"
    script.write_text(deploy_script())
    assert "src" not in script.read_text()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-I", str(script), str(espnet["onnx"]), str(espnet["image"])],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = [line.split("\t") for line in run.stdout.splitlines()]
    common = [f"onnx={espnet['onnx']}", f"image={espnet['image']}", "top_k=5"]
    expected = predict(compose_config("predict", common, tmp_path))["top_k"]
    assert [name for name, _ in rows] == [name for name, _ in expected]
    assert np.allclose([float(p) for _, p in rows], [p for _, p in expected], atol=1e-4)


def test_ssd_with_nms_in_the_graph(tmp_path: Path) -> None:
    """``nms=true``: decoding and NMS in the graph give ``predict.py`` the checkpoint's
    detections."""
    overrides = [
        "experiment=detection/ssd_demo", f"data.root={tmp_path / 'coins'}", "data.num_train=8",
        "data.num_test=4",
    ]  # fmt: skip
    ckpt = checkpoint_of(overrides, tmp_path)
    stem = tmp_path / "ssd"
    card = export_checkpoint(ckpt, stem, "nms=true")
    assert_record_is_the_checkpoints(stem.with_suffix(".onnx"), ckpt)
    metadata = read_metadata(stem.with_suffix(".onnx"))
    assert (metadata["task"], metadata["classes"]) == ("detection", ["background", "coin"])
    assert metadata["input"]["size"] == [300, 300] and not metadata["input"]["dynamic_size"]
    (check,) = card["parity"]["checks"]
    assert check["same_detections"] and check["max_abs"] <= TOL, check
    assert card["operators"]["NonMaxSuppression"] == 1
    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(1).random((120, 160, 3)) * 255).astype(np.uint8)).save(
        image
    )
    common = [f"image={image}", "score_threshold=0.3"]
    eager = predict(compose_config("predict", [*overrides, f"ckpt_path={ckpt}", *common], tmp_path))
    got = predict(compose_config("predict", [f"onnx={stem}.onnx", *common], tmp_path))
    assert len(eager["detections"]) > 0

    def by_score(found: list) -> list:
        return sorted(found, key=lambda d: (-d[1], d[2]))

    assert by_score(got["detections"]) == by_score(eager["detections"])


@pytest.mark.slow  # an export of about a minute on 2 cores
def test_segmentation_file_names_voc_classes(tmp_path: Path) -> None:
    """A segmentation export (fixed 64x64 input: the EPP decoder bakes its size) carries the
    checkpoint's record, the ImageNet normalisation and VOC's 21 class names."""
    train_ids, val_ids = ["2007_000001", "2007_000002"], ["2007_000003", "2007_000004"]
    voc = make_voc(tmp_path / "voc", train_ids, val_ids)
    overrides = [
        "data=voc_seg", f"data.root={voc}", "data.crop_size=[64,64]", "data.batch_size=2",
        "data.num_workers=0", "model.scale=0.5",
    ]  # fmt: skip
    ckpt = checkpoint_of(overrides, tmp_path)
    export_checkpoint(ckpt, tmp_path / "seg")
    assert_record_is_the_checkpoints(tmp_path / "seg.onnx", ckpt)
    metadata = read_metadata(tmp_path / "seg.onnx")
    assert (metadata["task"], metadata["classes"]) == ("segmentation", list(VOC_CLASSES))
    spec = metadata["input"]
    assert (spec["mode"], spec["channels"], spec["size"]) == ("RGB", 3, [64, 64])
    assert (spec["dynamic_size"], spec["size_step"]) == (False, None)
    assert (spec["mean"], spec["std"]) == (list(IMAGENET_MEAN), list(IMAGENET_STD))


@pytest.mark.slow  # an export of about a minute on 2 cores
def test_sentence_classifier_file_carries_its_sentencepiece_model(tmp_path: Path) -> None:
    """A DeLighT sentence classifier's export carries the checkpoint's record, its SentencePiece
    model and label names: a datamodule built from the file's record, its data folder empty,
    encodes text as the training one did."""
    overrides = [
        "data=sentiment_tweets", f"data.root={tmp_path / 'spm'}",
        f"data.csv_path={tweets_file(tmp_path / 'tweets.csv')}", "data.vocab_size=48",
        "data.max_length=8", "data.batch_size=8", "data.eval_batch_size=8", "model.d_model=32",
    ]  # fmt: skip
    ckpt = checkpoint_of(overrides, tmp_path)
    card = export_checkpoint(ckpt, tmp_path / "sentiment")
    assert card["parity"]["checks"][0]["max_abs"] <= TOL
    path = tmp_path / "sentiment.onnx"
    assert_record_is_the_checkpoints(path, ckpt)
    metadata = read_metadata(path)
    assert (metadata["kind"], metadata["padding_idx"]) == ("classifier", 1)
    assert metadata["vocabulary"]["labels"] == ["negative", "neutral", "positive"]
    empty = tmp_path / "empty"
    cfg = compose_config("train", [*overrides, f"data.root={empty}"], tmp_path / "fresh")
    fresh, _ = build_task(cfg)
    use_exported_vocabulary(fresh, path)
    trained, _ = build_task(compose_config("train", overrides, tmp_path / "again"))
    trained.setup("fit")
    text = "good awful lovely number 7"
    assert fresh.codec.vocab_size == 48
    assert fresh.codec.encode(text) == trained.codec.encode(text)
    assert not empty.exists()


def test_record_of_a_checkpoint_and_of_allow_random(tmp_path: Path) -> None:
    """The record export.py attaches: the checkpoint's choices whatever the export config's
    defaults; a group chosen on the command line wins; without a checkpoint, the composition."""
    ckpt = checkpoint_of(["model=espnetv2", "model.scale=0.5", "data.image_size=64"], tmp_path)
    saved = torch.load(ckpt, weights_only=True)[RECORD_KEY]
    assert saved["choices"]["model"] == "espnetv2"
    cfg = compose_config("export", [f"ckpt_path={ckpt}"], tmp_path)
    build_from_checkpoint(cfg)
    record = record_of_run(cfg)
    assert record["choices"] == saved["choices"]
    assert record["config"]["data"]["image_size"] == 64
    cfg = compose_config("export", ["model=espnetv2", "allow_random=true"], tmp_path)
    assert record_of_run(cfg)["choices"] == {
        "model": "espnetv2", "data": "digits", "task": "classification", "recipe": "digits_espnetv2"
    }  # fmt: skip
