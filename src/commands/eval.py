"""Evaluate a checkpoint: ``python eval.py ckpt_path=/path/to.ckpt [overrides]``.

The network, data and task are rebuilt from the checkpoint's run record (the config it was trained
with); an override on the command line (``data.root=...``, ``split=val``) still wins and is
reported. Writes ``metrics.json`` (metrics, params, MACs, checkpoint) into the run directory.

With ``+dynamic_eval=true`` (a ``task=awd_lm`` checkpoint) the split is scored again
by dynamic evaluation (``dynamic_eval_options``), written as ``<split>/dynamic_loss`` and
``<split>/dynamic_ppl`` beside the plain metrics.

With ``word_completion=true`` (a character model: ``task=char_lm``) the split is also scored by
word completion (Group-Transformer Table 4 as a metric, :mod:`src.decoding.word_completion`):
``<split>/word_top1``, ``word_top5``, ``word_top20`` (fractions of the words whose true completion
ranks there, from their first ``prefix_len`` characters) and ``<split>/word_count``.

With ``official_eval=true`` (a segmentation checkpoint with ``data=cityscapes``, ``split=val``) the
validation images are predicted again, written at the full label size as label-id PNGs under
``<output_dir>/official_eval/predictions`` and scored by the official ``cityscapesScripts``
(:mod:`src.evaluation.cityscapes_eval`): ``official/mIoU`` (19 classes, the papers' number) and
``official/mIoU_categories`` beside ours, the script's full result in ``official_eval/result.json``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from src.build import build_from_checkpoint, build_trainer, check_served, complexity_of, scalars
from src.datamodules.char_lm import CharLMDataModule
from src.datamodules.cityscapes import CityscapesDataModule
from src.decoding.generation import vocabulary_masks
from src.decoding.word_completion import word_completion
from src.evaluation.cityscapes_eval import evaluate_cityscapes
from src.evaluation.dynamic_eval import dynamic_evaluate, segments
from src.tasks.awd_lm import AWDLMTask
from src.tasks.char_lm import CharLMTask
from src.tasks.segmentation import SegmentationTask
from src.utils.errors import UsageError, WrongRunError
from src.utils.extras import require
from src.utils.files import write_json

log = logging.getLogger("eval")  # the command's name in its log lines


def dynamic_metrics(cfg: DictConfig, task: AWDLMTask, device: torch.device) -> dict[str, float]:
    """Dynamic evaluation of ``cfg.split`` (Krause et al. 2018; :mod:`src.evaluation.dynamic_eval`):
    gradient statistics on the training stream in ``options.batch_size`` rows, then the split in
    one row, both cut into segments of ``options.bptt`` tokens. The streams are the official ones
    (``bptt_step=None``: no window rounded, dropped or padded): this runs eagerly."""
    options = cfg.dynamic_eval_options
    data = instantiate(
        cfg.data,
        batch_size=options.batch_size,
        eval_batch_size=1,
        test_batch_size=1,
        bptt_step=None,
    )
    data.prepare_data()
    data.setup("fit")
    data.setup(cfg.split if cfg.split == "test" else "validate")
    evaluated = data.test_dataloader() if cfg.split == "test" else data.val_dataloader()
    result = dynamic_evaluate(
        task.net.to(device),
        segments(data.train_dataloader(), options.bptt),
        segments(evaluated, options.bptt),
        lr=options.lr,
        lamb=options.lamb,
        epsilon=options.epsilon,
        max_batches=options.max_batches,
        old_hyper=options.old_hyper,
    )
    return {f"{cfg.split}/dynamic_loss": result.loss, f"{cfg.split}/dynamic_ppl": result.ppl}


def check_word_completion(
    cfg: DictConfig, task: L.LightningModule, datamodule: L.LightningDataModule
) -> None:
    """Raise before anything runs unless ``word_completion`` can run: a bool, a character model."""
    if cfg.word_completion not in (True, False):
        raise UsageError(f"word_completion must be true or false, got {cfg.word_completion!r}")
    if cfg.word_completion and not (
        isinstance(task, CharLMTask) and isinstance(datamodule, CharLMDataModule)
    ):
        raise UsageError(
            "word_completion=true needs a character language model checkpoint (task=char_lm: data "
            f"pydoc_chars, enwik8, text8), got {type(task).__name__} on {type(datamodule).__name__}"
        )


def word_completion_metrics(
    cfg: DictConfig, task: CharLMTask, datamodule: CharLMDataModule, device: torch.device
) -> dict[str, float]:
    """Word completion accuracy on ``cfg.split`` (:mod:`src.decoding.word_completion`), each word
    read after ``mem_len + tgt_len`` characters of context, in training-length segments."""
    options = cfg.word_completion_options
    net = task.net.to(device).eval()
    allowed, boundary = vocabulary_masks(datamodule.symbols, datamodule.vocab_size)
    tokens = torch.from_numpy(datamodule.splits[cfg.split].astype("int64"))  # (N,)
    start = time.perf_counter()
    result = word_completion(
        net,
        tokens,
        boundary,
        segment_len=datamodule.tgt_len,
        context_len=net.mem_len + datamodule.tgt_len,
        prefix_len=options.prefix_len,
        top=tuple(options.top),
        max_words=options.max_words,
        max_word_len=options.max_word_len,
        beam_size=options.beam_size,
        allowed=allowed,
        words_per_batch=options.words_per_batch,
    )
    log.info("word completion: %d words in %.1f s", result.count, time.perf_counter() - start)
    return result.as_metrics(cfg.split)


def check_official_eval(
    cfg: DictConfig, task: L.LightningModule, datamodule: L.LightningDataModule
) -> None:
    """Raise before anything runs unless ``official_eval`` can run: a bool, a segmentation task on
    Cityscapes, the val split, cityscapesScripts installed."""
    if cfg.official_eval not in (True, False):
        raise UsageError(f"official_eval must be true or false, got {cfg.official_eval!r}")
    if not cfg.official_eval:
        return
    if not (isinstance(task, SegmentationTask) and isinstance(datamodule, CityscapesDataModule)):
        raise UsageError(
            "official_eval=true needs a segmentation checkpoint with data=cityscapes, got "
            f"{type(task).__name__} on {type(datamodule).__name__}"
        )
    if cfg.split != "val":
        raise UsageError(
            "official_eval=true scores the Cityscapes val labels (the test labels are not public): "
            f"pass split=val, got split={cfg.split}"
        )
    require("cityscapesScripts", "official-eval", "official_eval=true")


def official_metrics(
    cfg: DictConfig, task: SegmentationTask, datamodule: CityscapesDataModule, trainer: L.Trainer
) -> dict[str, float]:
    """The official cityscapesScripts scores of the val split
    (:mod:`src.evaluation.cityscapes_eval`), the network run as in the plain evaluation (device,
    precision, input size)."""
    out_dir = Path(cfg.paths.output_dir) / "official_eval"
    device = trainer.strategy.root_device
    task.to(device).eval()
    with trainer.precision_plugin.forward_context():
        result = evaluate_cityscapes(
            task, datamodule.splits["val"], out_dir / "predictions",
            batch_size=datamodule.batch_size, num_workers=datamodule.num_workers, device=device,
            json_file=out_dir / "result.json",
        )  # fmt: skip
    return {
        "official/mIoU": float(result["averageScoreClasses"]),
        "official/mIoU_categories": float(result["averageScoreCategories"]),
    }


def evaluate(cfg: DictConfig) -> dict:
    """Run the chosen split (``split=test|val``) on the checkpoint; returns the summary."""
    start = time.perf_counter()
    ckpt_path = Path(cfg.ckpt_path)
    if cfg.split not in ("test", "val"):
        raise UsageError(f"split must be 'test' or 'val', got {cfg.split!r}")
    L.seed_everything(cfg.seed, workers=True)
    datamodule, task = build_from_checkpoint(cfg)  # the weights are loaded
    check_served("eval.py", cfg, datamodule, task)
    complexity = complexity_of(task, datamodule)
    trainer = build_trainer(cfg)
    run = trainer.test if cfg.split == "test" else trainer.validate
    if cfg.dynamic_eval not in (None, False, True):
        raise UsageError(f"dynamic_eval must be true or false, got {cfg.dynamic_eval!r}")
    if cfg.dynamic_eval and not isinstance(task, AWDLMTask):
        raise WrongRunError(
            f"dynamic_eval needs a task=awd_lm checkpoint, got {type(task).__name__}"
        )
    check_official_eval(cfg, task, datamodule)
    check_word_completion(cfg, task, datamodule)
    results = run(task, datamodule=datamodule)
    metrics = scalars(results[0])
    if cfg.dynamic_eval:
        metrics.update(dynamic_metrics(cfg, task, trainer.strategy.root_device))
    if cfg.word_completion and trainer.is_global_zero:
        metrics.update(word_completion_metrics(cfg, task, datamodule, trainer.strategy.root_device))
    if cfg.official_eval and trainer.is_global_zero:
        metrics.update(official_metrics(cfg, task, datamodule, trainer))
    output_dir = Path(cfg.paths.output_dir)
    summary = {
        "metrics": metrics,
        **complexity.as_dict(),
        "checkpoint": str(ckpt_path),
        "wall_time_s": round(time.perf_counter() - start, 2),
        "output_dir": str(output_dir),
    }
    if trainer.is_global_zero:
        write_json(output_dir / "metrics.json", summary)
        log.info("metrics: %s", summary["metrics"])
        log.info("run directory: %s", output_dir)
    return summary
