"""Train a network: ``python train.py [model=...] [data=...] [key=value ...]``.

Hydra composes ``conf/train.yaml``; this script only instantiates and wires: seed, datamodule,
network, task, callbacks, loggers and Trainer; fit (or resume with ``ckpt_path=...``); test the
best checkpoint when the data has a test split; write ``metrics.json`` into the run directory
(status ``finished``, ``interrupted`` or ``failed``), and beside it ``test_outputs.json`` when the
task keeps its per-example test results (``task.test_outputs``: translation, text
classification), which paired comparisons of two models resample.
The building functions it shares with the other entry points are in :mod:`src.build`.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from src.build import (
    build_task,
    build_trainer,
    check_config,
    compile_network,
    complexity_of,
    declared_batch_shapes,
    hydra_choices,
    hydra_overrides,
    scalars,
)
from src.callbacks.interrupt import InterruptCheckpoint
from src.callbacks.validation_schedule import ValidationSchedule
from src.utils.files import write_json
from src.utils.run_record import (
    CheckpointError,
    RunRecord,
    check_resume,
    make_record,
    read_checkpoint,
    record_of,
    write_failed,
)

log = logging.getLogger("train")  # the command's name in its log lines


def unfinished_run_dir(ckpt_path: Path) -> Path | None:
    """The run directory ``ckpt_path`` belongs to (``<run>/checkpoints/*.ckpt``), when that run did
    not finish: its ``metrics.json`` is absent or says ``interrupted`` or ``failed``. A finished
    run is never written into again."""
    run_dir = ckpt_path.resolve().parent.parent
    if ckpt_path.resolve().parent.name != "checkpoints" or not (run_dir / ".hydra").is_dir():
        return None
    metrics = run_dir / "metrics.json"
    if metrics.is_file() and json.loads(metrics.read_text()).get("status") == "finished":
        return None
    return run_dir


def link_resume(run_dir: Path) -> None:
    """Link this invocation's Hydra directory (its config and log) from the run it continues, as
    ``<run>/resumes/<name>``."""
    if not HydraConfig.initialized():
        return
    here = Path(HydraConfig.get().runtime.output_dir)
    if here.resolve() == run_dir.resolve():
        return
    link = run_dir / "resumes" / here.name
    try:
        link.parent.mkdir(exist_ok=True)
        if not link.exists():
            link.symlink_to(here.resolve(), target_is_directory=True)
    except OSError as error:  # a file system without links: the log says where the rest is
        log.warning("could not link %s from %s: %s", here, link, error)


def resume_command(checkpoint: Path) -> str:
    """The command line that resumes this run from ``checkpoint``."""
    overrides = [o for o in hydra_overrides() if not o.startswith("ckpt_path=")]
    return shlex.join(
        [sys.executable.rsplit("/", 1)[-1], "train.py", *overrides, f"ckpt_path={checkpoint}"]
    )


def stop_interrupted(
    trainer: L.Trainer, interrupt: InterruptCheckpoint, output_dir: Path, wall_time_s: float
) -> None:
    """After SIGINT/SIGTERM: ``metrics.json`` with status ``interrupted`` and the checkpoint, the
    resume command on stdout, and exit with the conventional 128 + the signal number."""
    if trainer.is_global_zero:
        summary = {
            "status": "interrupted",
            "signal": interrupt.signum,
            "interrupted_checkpoint": str(interrupt.path) if interrupt.path else None,
            "global_step": trainer.global_step,
            "wall_time_s": wall_time_s,
            "output_dir": str(output_dir),
        }
        write_json(output_dir / "metrics.json", summary)
        if interrupt.path is not None:
            print(
                f"interrupted at step {trainer.global_step}; resume with:\n"
                f"  {resume_command(interrupt.path)}"
            )
    raise SystemExit(128 + interrupt.signum) from None


def train(cfg: DictConfig) -> dict[str, Any]:
    """Check the config, then fit, test and summarise one run (:func:`fit_and_test`); returns what
    is written to ``metrics.json``.

    A run that stops on an exception (a :class:`~src.utils.errors.UserError` the command prints
    in one line, or a bug) leaves ``metrics.json`` with status ``failed`` and the error in the
    directory Hydra made for this invocation, then the exception goes on to the caller.
    """
    run_dir = Path(cfg.paths.output_dir)  # before a resume moves output_dir to the run it continues
    start = time.perf_counter()
    try:
        check_config(cfg, "train")
        return fit_and_test(cfg)
    except Exception as error:
        write_failed(run_dir, error, round(time.perf_counter() - start, 2))
        raise


def fit_and_test(cfg: DictConfig) -> dict[str, Any]:
    """Fit, test and summarise one run; returns what is written to ``metrics.json``.

    With ``ckpt_path`` the run resumes: the checkpoint must carry the same network and task
    (``check_resume``), and a run that did not finish is continued in its own run directory
    (checkpoints, loggers and ``metrics.json``; its wall time adds up). On SIGINT or SIGTERM the
    run stops with ``checkpoints/interrupted.ckpt`` and ``metrics.json`` status ``interrupted``,
    prints the resume command and exits with 128 + the signal number.
    """
    start = time.perf_counter()
    previous_time = 0.0
    resumed = None
    if cfg.ckpt_path is not None:
        resumed = read_checkpoint(cfg.ckpt_path)
        if "optimizer_states" not in resumed:  # averaged, exported, or saved with weights only
            raise CheckpointError(
                f"ckpt_path={cfg.ckpt_path} holds network weights only (no optimiser state: an "
                f"averaged, exported or weights-only checkpoint), so it cannot resume a run; to "
                f"start a new run from these weights pass task.init_checkpoint={cfg.ckpt_path} "
                f"instead"
            )
        previous_time = float((record_of(resumed) or {}).get("wall_time_s", 0.0))
        run_dir = unfinished_run_dir(Path(cfg.ckpt_path))
        if run_dir is not None:
            with open_dict(cfg):
                cfg.paths.output_dir = str(run_dir)
            log.info("continuing run %s from %s", run_dir, cfg.ckpt_path)
            link_resume(run_dir)
    L.seed_everything(cfg.seed, workers=True)
    datamodule, task = build_task(cfg)
    if resumed is not None:
        check_resume(cfg, resumed, cfg.ckpt_path)
    complexity = complexity_of(task, datamodule)  # of the eager network
    compile_network(task, cfg.get("compile"), cfg.trainer, declared_batch_shapes(datamodule))
    output_dir = Path(cfg.paths.output_dir)
    record = RunRecord(make_record(cfg, hydra_choices()), start=start, previous_time=previous_time)
    interrupt = InterruptCheckpoint(output_dir / "checkpoints")
    trainer = build_trainer(cfg, (record, interrupt, ValidationSchedule()))
    for logger in trainer.loggers:
        logger.log_hyperparams(
            {
                "config": OmegaConf.to_container(cfg, resolve=True),
                "params": complexity.params,
                "macs": complexity.macs,
            }
        )

    def elapsed() -> float:
        return round(previous_time + time.perf_counter() - start, 2)

    fit_start, fit_cpu_start = time.perf_counter(), time.process_time()
    try:
        trainer.fit(task, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=True)
    except (SystemExit, KeyboardInterrupt):
        if interrupt.signum is None:
            raise
        stop_interrupted(trainer, interrupt, output_dir, elapsed())
    # training and validation, the final test excluded: what comparisons at equal time use (a
    # resumed run adds the wall time its checkpoint recorded, setup included)
    fit_time = round(previous_time + time.perf_counter() - fit_start, 2)
    # this process's CPU seconds over the same span (all its threads): against the wall time it
    # tells a run slowed by other work on the machine from a slow model
    fit_cpu = round(time.process_time() - fit_cpu_start, 2)
    metrics = scalars({k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")})

    checkpoint = trainer.checkpoint_callback
    best_path = checkpoint.best_model_path if checkpoint is not None else ""
    if checkpoint is not None and checkpoint.best_model_score is not None:
        metrics[f"best_{checkpoint.monitor}"] = float(checkpoint.best_model_score)
    if cfg.test and datamodule.has_test:
        # the best checkpoint when one was written (not under fast_dev_run), else the final weights
        results = trainer.test(
            task, datamodule=datamodule, ckpt_path=best_path or None, weights_only=True
        )
        metrics.update(scalars(results[0]))

    summary = {
        "status": "finished",
        "metrics": metrics,
        **complexity.as_dict(),
        "wall_time_s": elapsed(),
        "fit_time_s": fit_time,
        "threads": torch.get_num_threads(),
        "updates": trainer.global_step,
        "best_checkpoint": best_path or None,
        "output_dir": str(output_dir),
    }
    if resumed is None:  # a resumed run's earlier CPU seconds are not on record
        summary["fit_cpu_s"] = fit_cpu
    else:
        summary["resumed_from"] = str(cfg.ckpt_path)
    if trainer.is_global_zero:
        test_outputs = getattr(task, "test_outputs", None)
        if test_outputs is not None:
            # before metrics.json: a run that reads as finished has its outputs already
            write_json(output_dir / "test_outputs.json", test_outputs)
        write_json(output_dir / "metrics.json", summary)
        log.info("metrics: %s", metrics)
        log.info("run directory: %s", output_dir)
    return summary
