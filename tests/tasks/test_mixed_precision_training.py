"""Every task trains a paper network with Lightning's ``bf16-mixed`` precision and its loss falls.

Each run is ``train.py``'s composition on small data (the embedded digits, character and word
corpora, the embedded tweets and coins, generated VOC and COCO folders, a generated parallel corpus)
fitting one batch over and over, the way ``debug=overfit`` does;
the mean training loss of the last epoch must be below 80% of the first epoch's. On a CUDA machine
the same runs repeat on the GPU in ``bf16-mixed`` and ``16-mixed``.

DiCENet is left to the network tests here: on CPUs without native bf16 instructions PyTorch runs
its grouped bf16 convolutions through a slow per-group fallback (``_slow_conv2d``), about 10x
slower than float32.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from src.commands.train import train
from tests.datamodules.test_coco_multilabel import make_coco
from tests.datamodules.test_voc_seg import make_voc
from tests.tasks.test_translation_task import reversal_corpus

OVERFIT = [
    "trainer.overfit_batches=1",
    "trainer.max_steps=-1",
    "++trainer.val_check_interval=1.0",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.gradient_clip_val=null",
    "logger=csv",
]


def tasks(root: Path) -> dict[str, list[str]]:
    """Overrides of one short run per task, data generated under ``root`` where needed."""
    return {
        "classification": [
            "data=digits",
            "model=espnetv2",
            "model.scale=0.5",
            "data.batch_size=4",
            "data.augment=false",
            "task.optimizer.lr=0.01",
        ],
        "multilabel": [
            "data=coco_multilabel",
            f"data.root={make_coco(root / 'coco')}",
            "data.crop_size=32",
            "data.resize_size=36",
            "data.batch_size=2",
            "model=espnetv2",
            "model.scale=0.5",
            "task.optimizer.lr=0.1",
        ],
        "segmentation": [
            "data=voc_seg",
            f"data.root={make_voc(root / 'voc', ['a', 'b', 'c', 'd'], ['e', 'f'])}",
            "data.crop_size=[32,48]",
            "data.batch_size=2",
            "model=espnetv2_seg",
            "model.scale=0.5",
            "task.optimizer.lr=0.1",
        ],
        "char_lm": [
            "experiment=char_lm/demo",
            "data.tgt_len=16",
            "data.eval_tgt_len=16",
            "data.batch_size=4",
            "model.n_layer=2",
            "model.d_model=64",
            "model.d_inner=128",
            "model.mem_len=16",
            "task.scheduler.warmup_steps=2",
            "task.optimizer.lr=1e-2",
        ],
        "word_lm": [
            "experiment=delight_lm/demo",
            f"data.root={root / 'pydoc_words'}",
            "data.tokens_per_sample=16",
            "data.eval_context_window=8",
            "data.batch_size=4",
            "task.scheduler.warmup_steps=2",
            "task.optimizer.lr=1e-2",
        ],
        "translation": [
            "data=iwslt14_de_en",
            f"data.root={reversal_corpus(root / 'reversal', n_train=64)}",
            "data.source_lang=xx",
            "data.target_lang=yy",
            "data.src_vocab_size=null",
            "data.tgt_vocab_size=null",
            "data.max_tokens=64",
            "model.d_model=64",
            "model.n_min=2",
            "model.n_max=3",
            *(
                f"model.{p}_dropout=0.0"
                for p in ("ffn", "attention", "dextra", "embedding", "position")
            ),
            "model.dropout=0.0",
            "task.max_len_b=4",
            "task.val_decoding=none",
            "task.scheduler.warmup_steps=2",
            "task.optimizer.lr=3e-3",
        ],
        "awd_lm": [
            "experiment=pru_lm/demo",
            f"data.root={root / 'pydoc_ptb'}",
            "data.batch_size=4",
            "data.bptt=16",
            "data.bptt_short_prob=0.0",
            "data.bptt_std=0.0",
            "model.num_layers=1",
            "model.embedding_dim=32",
            "model.hidden_size=64",
            "model.groups=2",
            *(
                f"model.{p}=0.0"
                for p in (
                    "dropout",
                    "dropout_hidden",
                    "dropout_input",
                    "dropout_embedding",
                    "weight_drop",
                )
            ),
            "task.asgd=false",
            "task.optimizer.lr=5",
        ],
        "text_classification": [
            "experiment=delight_sentiment/delight",
            f"data.root={root / 'sentiment_tweets'}",
            "data.batch_size=8",
            "data.max_length=24",
            "data.test_each_epoch=false",
            "model.d_model=32",
            "model.num_blocks=1",
            *(
                f"model.{p}=0.0"
                for p in ("dropout", "attention_dropout", "ffn_dropout", "embedding_dropout")
            ),
            "task.scheduler.warmup_steps=2",
        ],
        "detection": [
            "data=coins_det",
            f"data.root={root / 'coins_det'}",
            "data.num_train=2",
            "data.num_test=2",
            "data.batch_size=2",
            "data.num_workers=0",
            "model.scale=0.5",
        ],
    }


# epochs per task: a step of the character LM costs a fraction of a convolutional one
EPOCHS = {
    "classification": 6, "multilabel": 6, "segmentation": 6, "char_lm": 12, "word_lm": 12,
    "translation": 12, "awd_lm": 12, "text_classification": 12, "detection": 12,
}  # fmt: skip


def runs() -> list[tuple[str, str]]:
    """(accelerator, precision) pairs to train with on this machine."""
    pairs = [("cpu", "bf16-mixed")]
    if torch.cuda.is_available():
        pairs += [("gpu", "bf16-mixed"), ("gpu", "16-mixed")]
    return pairs


def epoch_losses(run_dir: Path) -> list[float]:
    """The mean training loss of every epoch, from the CSV logger's file."""
    (metrics,) = run_dir.glob("csv/version_*/metrics.csv")
    with metrics.open() as f:
        rows = [row for row in csv.DictReader(f) if row.get("train/loss_epoch")]
    return [float(row["train/loss_epoch"]) for row in rows]


@pytest.mark.slow
@pytest.mark.parametrize(("accelerator", "precision"), runs())
@pytest.mark.parametrize("task", list(EPOCHS))
def test_task_trains_in_mixed_precision(
    make_cfg, tmp_path: Path, task: str, accelerator: str, precision: str
) -> None:
    cfg = make_cfg(
        *tasks(tmp_path)[task],
        *OVERFIT,
        f"trainer.max_epochs={EPOCHS[task]}",
        f"trainer.check_val_every_n_epoch={EPOCHS[task]}",
        f"trainer.accelerator={accelerator}",
        "trainer.devices=1",
        f"trainer.precision={precision}",
    )
    summary = train(cfg)
    losses = epoch_losses(Path(cfg.paths.output_dir))
    assert len(losses) == EPOCHS[task] and all(map(torch.isfinite, torch.tensor(losses)))
    assert losses[-1] < 0.8 * losses[0], f"{task} {precision}: epoch losses {losses}"
    assert summary["metrics"], "the run reported no metrics"


@pytest.mark.slow
@pytest.mark.parametrize(("accelerator", "precision"), runs())
@pytest.mark.parametrize("task", ["char_lm", "awd_lm"])
def test_clipping_recipes_train_in_mixed_precision(
    make_cfg, tmp_path: Path, task: str, accelerator: str, precision: str
) -> None:
    """The recipes that clip gradients (char_lm/demo, pru_lm/demo: 0.25) with their fused
    optimisers: Lightning's mixed-precision plugin alone refuses to clip for those at the first
    step."""
    epochs = 6
    cfg = make_cfg(
        *tasks(tmp_path)[task],
        *OVERFIT,
        "trainer.gradient_clip_val=0.25",
        f"trainer.max_epochs={epochs}",
        f"trainer.check_val_every_n_epoch={epochs}",
        f"trainer.accelerator={accelerator}",
        "trainer.devices=1",
        f"trainer.precision={precision}",
    )
    assert cfg.task.optimizer.fused and cfg.trainer.gradient_clip_val == 0.25
    train(cfg)
    losses = epoch_losses(Path(cfg.paths.output_dir))
    assert len(losses) == epochs and all(map(torch.isfinite, torch.tensor(losses)))
    assert losses[-1] < 0.9 * losses[0], f"{task} {precision}: epoch losses {losses}"
