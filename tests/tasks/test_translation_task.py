"""The translation task: its loss over padded token batches, and a whole run end to end (train.py
on a small generated corpus, test BLEU in metrics.json, translate.py on the checkpoint)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from src.commands.train import train
from src.datamodules.dictionary import EOS_ID, PAD_ID
from src.evaluation.bleu import sacre_bleu
from src.models.delight_mt import DeLighTEncoderDecoder
from src.tasks.translation import TranslationTask
from tests.conftest import ROOT

WORDS = [f"w{i}" for i in range(12)]


def tiny_net(vocab: int = 24) -> DeLighTEncoderDecoder:
    torch.manual_seed(0)
    return DeLighTEncoderDecoder(
        vocab,
        vocab,
        64,
        2,
        3,
        1.0,
        dropout=0.0,
        attention_dropout=0.0,
        ffn_dropout=0.0,
        embedding_dropout=0.0,
        position_dropout=0.0,
    ).eval()


def test_loss_is_the_token_mean_over_non_pad_targets() -> None:
    task = TranslationTask(tiny_net(), partial(torch.optim.Adam), label_smoothing=0.1)
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, 9, EOS_ID, PAD_ID]])
    target = torch.tensor([[10, 11, EOS_ID], [12, EOS_ID, PAD_ID]])
    prev = torch.tensor([[EOS_ID, 10, 11], [EOS_ID, 12, PAD_ID]])
    batch = {"src_tokens": src, "prev_output_tokens": prev, "target": target}
    loss, nll, ntokens = task._losses(batch)
    assert ntokens == 5
    # each sentence alone, summed over its tokens, then divided by all tokens of the batch
    sums = []
    for i, n in ((0, 3), (1, 2)):
        logits = task.net(src[i : i + 1, : 4 - i], None, prev[i : i + 1, :n])[0]
        lprobs = logits.log_softmax(-1)
        smooth = -lprobs.mean(-1)  # eps / V over every class
        token_nll = -lprobs.gather(-1, target[i, :n, None])[:, 0]
        sums.append((0.9 * token_nll + 0.1 * smooth).sum())
    assert loss.item() == pytest.approx((sums[0] + sums[1]).item() / 5, rel=1e-5)
    reference = F.cross_entropy(
        task.net(src, None, prev).flatten(0, 1), target.flatten(), ignore_index=PAD_ID
    )
    assert nll.item() == pytest.approx(reference.item(), rel=1e-6)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="val_decoding"):
        TranslationTask(tiny_net(), partial(torch.optim.Adam), val_decoding="sampling")
    with pytest.raises(ValueError, match="label_smoothing"):
        TranslationTask(tiny_net(), partial(torch.optim.Adam), label_smoothing=1.0)


def reversal_corpus(root: Path, n_train: int = 600) -> Path:
    """Sources of 2-5 words; each target is its source reversed, in other 'language' words."""
    generator = random.Random(0)
    root.mkdir(parents=True)
    for split, n in (("train", n_train), ("valid", 40), ("test", 40)):
        src, tgt = [], []
        for _ in range(n):
            words = [generator.choice(WORDS) for _ in range(generator.randint(2, 5))]
            src.append(" ".join(words))
            tgt.append(" ".join(w.replace("w", "v") for w in reversed(words)))
        (root / f"{split}.xx").write_text("".join(f"{s}\n" for s in src))
        (root / f"{split}.yy").write_text("".join(f"{t}\n" for t in tgt))
    return root


def reversal_data(corpus: Path) -> list[str]:
    """The overrides that train on :func:`reversal_corpus`'s files with their own vocabularies."""
    return [
        "data=iwslt14_de_en",
        f"data.root={corpus}",
        "data.source_lang=xx",
        "data.target_lang=yy",
        "data.src_vocab_size=null",
        "data.tgt_vocab_size=null",
    ]


@pytest.mark.slow
def test_translation_run_reaches_bleu_and_translate_py_uses_it(make_cfg, tmp_path) -> None:
    corpus = tmp_path / "corpus"
    reversal_corpus(corpus)
    cfg = make_cfg(
        *reversal_data(corpus),
        "data.max_tokens=256",
        "model.d_model=64",
        "model.n_min=2",
        "model.n_max=3",
        "model.dropout=0.0",
        "model.ffn_dropout=0.0",
        "model.attention_dropout=0.0",
        "model.dextra_dropout=0.0",
        "task.optimizer.lr=5e-3",
        "task.scheduler.warmup_steps=30",
        "task.max_len_a=1.0",
        "task.max_len_b=2",
        "trainer=cpu",
        "trainer.max_steps=-1",
        "trainer.max_epochs=12",
        "trainer.check_val_every_n_epoch=10",
        "callbacks.progress_bar=null",
    )
    summary = train(cfg)
    metrics = json.loads((Path(summary["output_dir"]) / "metrics.json").read_text())["metrics"]
    assert metrics["test/bleu"] > 60.0, metrics  # a 2-layer net learns to reverse 2-5 words
    assert summary["params"] > 0 and metrics["test/ppl"] < 3.0
    command = [
        sys.executable,
        str(ROOT / "translate.py"),
        f"ckpt_path={summary['best_checkpoint']}",
        "w1 w2 w3",
        "task.beam_size=2",
        f"hydra.run.dir={tmp_path / 'translate'}",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "v3 v2 v1"


def test_a_run_leaves_its_test_translations_in_the_split_order(make_cfg, tmp_path) -> None:
    """``test_outputs.json`` holds one translation per test pair, in the test files' order (the
    batches group pairs by length), and its sacreBLEU is the logged test/sacrebleu."""
    corpus = reversal_corpus(tmp_path / "corpus", n_train=64)
    cfg = make_cfg(
        *reversal_data(corpus),
        "data.max_tokens=128",
        "data.eval_max_tokens=64",  # several test batches
        "model.d_model=64",
        "model.n_min=2",
        "model.n_max=3",
        "task.optimizer.lr=5e-3",
        "task.scheduler.warmup_steps=4",
        "task.val_decoding=none",
        "task.beam_size=2",
        "task.max_len_a=1.0",
        "task.max_len_b=2",
        "trainer.max_steps=-1",
        "trainer.max_epochs=12",
        "trainer.num_sanity_val_steps=0",
        "callbacks.progress_bar=null",
    )
    summary = train(cfg)
    run_dir = Path(summary["output_dir"])
    outputs = json.loads((run_dir / "test_outputs.json").read_text())
    references = (corpus / "test.yy").read_text().splitlines()
    assert outputs["kind"] == "translation" and len(references) == 40
    assert outputs["ids"] == list(range(40))
    assert outputs["references"] == references
    assert len(outputs["hypotheses"]) == 40 and any(outputs["hypotheses"])
    logged = summary["metrics"]["test/sacrebleu"]
    assert logged > 0.0
    # logged as a float32 tensor
    assert sacre_bleu(outputs["hypotheses"], outputs["references"]) == pytest.approx(logged, 1e-6)
