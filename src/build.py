"""Building a run's objects from a composed config: what every entry point shares.

``train.py``, ``eval.py``, ``complexity.py``, ``predict.py``, ``generate.py``, ``translate.py`` and
``export.py`` run as a Hydra app (:func:`hydra_main`), check a composed config
(:func:`check_config`), build the datamodule, network and task (:func:`build_task`, or
:func:`build_from_checkpoint` for a run's checkpoint, then :func:`check_served`) and the Trainer
(:func:`build_trainer`) with these functions, and do only their own work besides.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MethodType
from typing import Any

import hydra
import hydra._internal.utils as hydra_internal
import lightning as L
import torch
import torch._dynamo.config as dynamo_config
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, InstantiationException, MissingConfigException
from hydra.utils import instantiate
from lightning.pytorch.accelerators import MPSAccelerator
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError
from torch import nn

from src.models.transformer_mt import TransformerEncoderDecoder
from src.tasks.awd_lm import AWDLMTask
from src.tasks.char_lm import CharLMTask
from src.tasks.classification import ClassificationTask
from src.tasks.detection import DetectionTask
from src.tasks.graphed import own_gradients
from src.tasks.multilabel import MultiLabelTask
from src.tasks.segmentation import SegmentationTask
from src.tasks.text_classification import TextClassificationTask
from src.tasks.translation import TranslationTask
from src.tasks.word_lm import WordLMTask
from src.utils.complexity import Complexity, measure
from src.utils.config_checks import (
    ConfigError,
    check_accelerator,
    check_config_values,
    check_pairing,
    known_top_level_keys,
    nested_options,
    reject_unknown_keys,
    unknown_key,
    unknown_option,
)
from src.utils.errors import DEBUG_ENV, EXIT_STATUS, UsageError, WrongRunError, reported_in_one_line
from src.utils.extras import require
from src.utils.model_sizes import size_error
from src.utils.run_record import (
    config_from_checkpoint,
    describe_data,
    describe_model,
    load_task_weights,
    override_key,
    read_checkpoint,
    record_of,
    renamed,
    write_failed,
)

log = logging.getLogger(__name__)

# data keys a datamodule can count itself when the config leaves them null
VOCABULARY_KEYS = ("vocab_size", "src_vocab_size", "tgt_vocab_size")


def build_task(cfg: DictConfig) -> tuple[L.LightningDataModule, L.LightningModule]:
    """Instantiate the datamodule, the network and the task that wraps it (no dataset is read).

    A vocabulary the config leaves to the data (``data.vocab_size: null``, and a translation
    corpus's ``src_vocab_size``/``tgt_vocab_size``) is the datamodule's count, written into ``cfg``
    so that ``${data.vocab_size}`` (the model's ``n_token``) is it.
    """
    datamodule = instantiate(cfg.data)
    for key in VOCABULARY_KEYS:
        if key in cfg.data and cfg.data[key] is None:
            cfg.data[key] = getattr(datamodule, key)
    try:
        net = instantiate(cfg.model)
    except InstantiationException as error:
        model = OmegaConf.to_container(cfg.model, resolve=True)
        explained = size_error(model, error.__cause__, hydra_choices().get("model"), instantiate)
        if explained is None:
            raise
        raise explained from error
    task = instantiate(cfg.task, net=net)
    return datamodule, task


# torch.compile backends and inductor modes that replay the compiled graphs as CUDA graphs
CUDA_GRAPH_BACKENDS = ("cudagraphs",)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
COMPILE_ENABLED = (True, False, "auto")
# batch shapes a text datamodule gives at most, its splits together: translation's length buckets
# (data.shape_buckets, 8), a language model's one or two segment shapes, AWD's rounded windows
BATCH_SHAPES_BOUND = 16


@dataclass(frozen=True)
class CompilePlan:
    """How a run's network runs, as :func:`compile_plan` resolves ``compile.*``.

    ``path``: ``"eager"``; ``"compiled"`` (torch.compile); or ``"graphed"`` (torch.compile whose
    graphs replay as CUDA graphs on the run's GPU). ``options``: torch.compile's arguments (empty
    when eager).
    """

    path: str
    options: dict[str, Any]

    @property
    def replays_cuda_graphs(self) -> bool:
        """Whether the backend or mode replays the compiled graphs as CUDA graphs (on a CUDA
        device; on the CPU torch's ``cudagraphs`` backend runs the graphs as they are)."""
        return (
            self.options.get("backend") in CUDA_GRAPH_BACKENDS
            or self.options.get("mode") in CUDA_GRAPH_MODES
        )


def runs_on_cuda(trainer: Mapping[str, Any]) -> bool:
    """Whether the Trainer config trains on CUDA GPUs: ``accelerator`` ``cuda``, ``gpu``
    (Lightning's CUDA or Apple's MPS: CUDA unless MPS is this machine's only GPU) or ``auto``
    where CUDA is."""
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator == "gpu":
        return torch.cuda.is_available() or not MPSAccelerator.is_available()
    return accelerator == "cuda" or (accelerator == "auto" and torch.cuda.is_available())


def one_process(trainer: Mapping[str, Any]) -> bool:
    """Whether the Trainer config runs one process on one device (no DDP or FSDP)."""
    devices, strategy = str(trainer.get("devices", 1)), trainer.get("strategy", "auto")
    return devices == "1" and strategy in ("auto", None)


def compile_plan(
    options: Mapping[str, Any] | None, task: L.LightningModule, trainer: Mapping[str, Any]
) -> CompilePlan:
    """The path a run takes (:class:`CompilePlan`) from ``compile.*`` and the Trainer config.

    ``compile.enabled``: ``false`` (eager), ``true`` (torch.compile with the other keys), or
    ``auto``: the graphed path for a task that declares its step traceable (``traced_step``: the
    text systems and their baselines, :class:`src.tasks.graphed.GraphedStep`) in one process on
    one CUDA GPU (``trainer=gpu``), eager otherwise (the CPU, DDP, FSDP, the vision tasks). Keys
    left null take the path's defaults: the graphed path ``backend=cudagraphs``,
    ``fullgraph=true``, ``dynamic=false``; ``compile.enabled=true`` ``backend=inductor`` and
    torch.compile's own for the others.
    """
    if isinstance(options, DictConfig):
        options = OmegaConf.to_container(options, resolve=True)  # type: ignore[assignment]
    options = dict(options or {})
    enabled = options.pop("enabled", False)
    if enabled not in COMPILE_ENABLED:
        raise ConfigError(f"compile.enabled must be true, false or auto, got {enabled!r}")
    if enabled == "auto":
        traced = bool(getattr(task, "traced_step", False))
        if not (traced and runs_on_cuda(trainer) and one_process(trainer)):
            return CompilePlan("eager", {})
        defaults = {"backend": "cudagraphs", "fullgraph": True, "dynamic": False}
    elif enabled:
        defaults = {"backend": "inductor"}
    else:
        return CompilePlan("eager", {})
    for key, value in defaults.items():
        if options.get(key) is None:
            options[key] = value
    options = {key: value for key, value in options.items() if value is not None}
    plan = CompilePlan("compiled", options)
    if plan.replays_cuda_graphs and runs_on_cuda(trainer):
        return CompilePlan("graphed", options)
    return plan


def declared_batch_shapes(datamodule: L.LightningDataModule) -> int:
    """How many batch shapes the datamodule's loaders may give in all, known before it reads its
    data: a translation corpus's ``shape_buckets`` (its length buckets, shared by every split)
    where it asks for more than :data:`BATCH_SHAPES_BOUND`, else that bound."""
    return max(BATCH_SHAPES_BOUND, int(getattr(datamodule, "shape_buckets", 0) or 0))


def compile_network(
    task: L.LightningModule,
    options: Mapping[str, Any] | None,
    trainer: Mapping[str, Any],
    batch_shapes: int | None = None,
) -> CompilePlan:
    """Compile ``task.net`` in place as :func:`compile_plan` says, and return the plan.

    ``net.compile(...)``: forward and backward then run compiled, while ``net.state_dict()`` keeps
    its keys, so checkpoints, resume and ``eval.py`` work as with the eager network. A network
    that scores its own outputs (``net.loss``, which the language-model tasks call instead of
    ``forward``) has that compiled too. Networks with an ``nn.LSTM`` turn on Dynamo's RNN tracing
    (the time loop unrolled). The task learns whether graphs replay
    (``task.replays_cuda_graphs``: it then copies carried state out of the graphs' outputs).
    Accumulating gradients over micro-batches under replayed graphs, the parameters copy their
    gradients out of the graphs' buffers (:func:`src.tasks.graphed.own_gradients`).

    With ``fullgraph``, Dynamo's recompile limit is raised to ``batch_shapes`` (the batch shapes
    the data may give, :func:`declared_batch_shapes`) times the graphs a shape may take
    (``task.graphs_per_shape``), so that every expected graph is compiled; past the limit a
    ``fullgraph`` compile raises (Dynamo's ``FailOnRecompileLimitHit``) rather than running on
    eagerly.
    """
    plan = compile_plan(options, task, trainer)
    if plan.path == "eager":
        return plan
    net = task.net
    if plan.options.get("fullgraph"):
        graphs = (batch_shapes or 1) * int(getattr(task, "graphs_per_shape", 2))
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, graphs)
        dynamo_config.accumulated_recompile_limit = max(
            dynamo_config.accumulated_recompile_limit, 2 * graphs
        )
    if any(isinstance(m, nn.RNNBase) for m in net.modules()):
        dynamo_config.allow_rnn = True
    net.compile(**plan.options)
    if callable(getattr(type(net), "loss", None)):
        # bound to the network, so a deep copy of it calls its own copy
        net.loss = MethodType(torch.compile(type(net).loss, **plan.options), net)
    task.replays_cuda_graphs = plan.replays_cuda_graphs
    log.info("%s path: torch.compile(%s)", plan.path, plan.options)
    accumulated = int(trainer.get("accumulate_grad_batches", 1) or 1)
    if plan.path == "graphed" and accumulated > 1:
        hooked = own_gradients(net)
        log.info(
            "gradients of %d micro-batches summed under replayed graphs: %d parameters copy their "
            "gradient out of the graph's buffers", accumulated, hooked,
        )  # fmt: skip
    return plan


def build_trainer(cfg: DictConfig, extra_callbacks: tuple = ()) -> L.Trainer:
    """Instantiate callbacks and loggers (each a dict of named configs) and the Trainer.

    A ``callbacks.<name>`` entry without ``_target_`` is a setting of a callback the entry point
    does not build (a recipe's ``callbacks.model_checkpoint.monitor`` under ``eval.py``, which
    composes no callbacks) and is skipped."""
    callbacks = [
        instantiate(c)
        for c in (cfg.get("callbacks") or {}).values()
        if c is not None and "_target_" in c
    ]
    chosen = [c for c in (cfg.get("logger") or {}).values() if c is not None]
    if any(str(c.get("_target_", "")).endswith("WandbLogger") for c in chosen):
        require("wandb", "wandb", "logger=wandb")
    loggers = [instantiate(c) for c in chosen]
    return instantiate(
        cfg.trainer, callbacks=[*callbacks, *extra_callbacks], logger=loggers or False
    )


def hydra_choices() -> dict[str, Any]:
    """The config-group choices of the running Hydra job (empty outside one)."""
    if not HydraConfig.initialized():
        return {}
    return dict(HydraConfig.get().runtime.choices)


def hydra_overrides() -> list[str]:
    """The command-line overrides of the running Hydra job (empty outside one)."""
    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def check_config(cfg: DictConfig, config_name: str) -> None:
    """Before anything is built: no top-level key nobody reads, a model that fits the data,
    ``model.*`` / ``data.*`` / ``task.*`` keys and values their constructors take, and a GPU on the
    machine when the Trainer asks for one."""
    reject_unknown_keys(cfg, known_top_level_keys(config_name))
    choices = hydra_choices()
    check_pairing(choices)
    check_config_values(cfg)
    if isinstance(cfg.get("trainer"), DictConfig):
        check_accelerator(cfg.trainer, choices.get("trainer"))


def hydra_main(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[..., Any]]:
    """``@hydra.main`` of a root script over ``conf/<config_name>.yaml``, whose command-line
    mistakes that Hydra finds are reported in one line too.

    Hydra composes the config before the task function runs and reports what it refuses itself:
    ``run_and_report`` (``hydra/_internal/utils.py``, Hydra 1.3) prints the message (for an unknown
    option, the config search path too) and exits with status 1. While the app runs, each call of
    that reporter first turns an unknown config-group option (``model=dicnet``) or key
    (``data.batchsize=64``) into a :class:`ConfigError` naming the closest ones
    (:func:`composition_error`), which :func:`reported_in_one_line` prints with exit status 2.
    Any other error reaches Hydra's reporter as before; with ``HYDRA_FULL_ERROR=1`` Hydra's own
    error is raised with its traceback.
    ``-m`` (multirun), ``--cfg`` and ``--help`` run through Hydra unchanged.
    """

    def decorate(task_function: Callable[[DictConfig], Any]) -> Callable[..., Any]:
        # config_path is relative to the root script that defines task_function
        app = hydra.main(version_base="1.3", config_path="conf", config_name=config_name)(
            marked_when_failed(task_function)
        )

        @functools.wraps(task_function)
        def main(*args: Any) -> Any:
            # paths.root_dir: the directory the command starts in, absolute, so that paths stay
            # right under hydra.job.chdir=true and in the run record; PROJECT_ROOT set by hand wins
            os.environ.setdefault("PROJECT_ROOT", os.getcwd())
            with _composition_errors_in_one_line():
                return app(*args)

        return main

    return decorate


def marked_when_failed(task_function: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
    """``task_function`` that, when it fails, leaves its run directory marked: ``metrics.json``
    with status ``failed`` and the error (:func:`~src.utils.run_record.write_failed`), unless the
    command wrote its own ``metrics.json`` (``train.py``'s failed or interrupted runs). A failure
    is an exception, Ctrl-C, or the exit status of a user's mistake reported in one line; the other
    exits (a signal a command handled, status 0) leave the directory as the command did."""

    @functools.wraps(task_function)
    def run(cfg: DictConfig) -> Any:
        start = time.perf_counter()
        try:
            return task_function(cfg)
        except BaseException as error:
            if isinstance(error, SystemExit) and error.code != EXIT_STATUS:
                raise
            run_dir = Path(HydraConfig.get().runtime.output_dir)
            if not (run_dir / "metrics.json").exists():
                write_failed(run_dir, error, round(time.perf_counter() - start, 2))
            raise

    return run


@contextlib.contextmanager
def _composition_errors_in_one_line() -> Iterator[None]:
    """Within the block, Hydra's reporter reports the command line's mistakes in one line
    (:func:`hydra_main`); Hydra has no public hook for it."""
    report = hydra_internal.run_and_report

    def run_and_report(func: Callable[[], Any]) -> Any:
        def run() -> Any:
            with reported_in_one_line():
                try:
                    return func()
                except ConfigCompositionException as error:
                    explained = composition_error(error)
                    if explained is None or os.environ.get(DEBUG_ENV) == "1":
                        raise
                    raise explained from error

        return report(run)

    hydra_internal.run_and_report = run_and_report
    try:
        yield
    finally:
        hydra_internal.run_and_report = report


def composition_error(error: ConfigCompositionException) -> ConfigError | None:
    """The one-line error for what Hydra's composition refused, where it is the command line's: an
    option that its config group lacks, a key that its parent lacks; None for anything else."""
    if isinstance(error, MissingConfigException):
        group, _, option = str(error.missing_cfg_file).rpartition("/")
        if group and error.options:
            return unknown_option(group, option, error.options)
        nested = nested_options(str(error.missing_cfg_file))  # experiment=char_lm/demoo
        return unknown_option(*nested) if nested is not None and nested[2] else None
    cause = error.__cause__
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and isinstance(
        cause.parent_node, DictConfig
    ):
        return unknown_key(str(cause.full_key), cause.parent_node.keys())
    return None


# the kinds of run, their tasks, and the tools that serve them (the first one to name)
RUN_KINDS: tuple[tuple[str, tuple[type, ...], tuple[str, ...]], ...] = (
    ("image", (ClassificationTask, MultiLabelTask, SegmentationTask, DetectionTask),
     ("predict.py", "eval.py", "export.py")),
    ("language-model", (CharLMTask, WordLMTask, AWDLMTask),
     ("generate.py", "eval.py", "export.py")),
    ("translation", (TranslationTask,), ("translate.py", "eval.py", "export.py")),
    ("text-classification", (TextClassificationTask,), ("eval.py", "export.py")),
)  # fmt: skip
# networks export.py writes no graph for (its translation graphs are DeLighT's)
NOT_EXPORTED = (TransformerEncoderDecoder,)


def serving_tools(task: L.LightningModule) -> tuple[str, tuple[str, ...]] | None:
    """The kind of run ``task`` is and the tools that serve it; None for a task of no known kind."""
    for kind, tasks, tools in RUN_KINDS:
        if isinstance(task, tasks):
            if isinstance(getattr(task, "net", None), NOT_EXPORTED):
                tools = tuple(tool for tool in tools if tool != "export.py")
            return kind, tools
    return None


def check_served(
    tool: str, cfg: DictConfig, datamodule: L.LightningDataModule, task: L.LightningModule
) -> None:
    """Raise :class:`WrongRunError` when ``tool`` (``"predict.py"``, ...) does not serve the run
    :func:`build_from_checkpoint` built (a translation checkpoint given to ``predict.py``), naming
    the tools that do."""
    served = serving_tools(task)
    if served is None or tool in served[1]:
        return
    kind, tools = served
    if cfg.get("onnx") is not None:  # only the commands of the runtime read an exported file
        tools = tuple(tool for tool in tools if tool not in ("eval.py", "export.py"))
    if cfg.get("ckpt_path") is not None:
        source, use = f"ckpt_path={cfg.ckpt_path}", f"python {tools[0]} ckpt_path={cfg.ckpt_path}"
    elif cfg.get("onnx") is not None:
        source, use = f"onnx={cfg.onnx}", f"python {tools[0]} onnx={cfg.onnx}"
    else:
        source, use = "the config", f"python {tools[0]}"
    also = tools[1:]
    if also:
        use += f" ({' and '.join(also)} {'serves' if len(also) == 1 else 'serve'} it too)"
    raise WrongRunError(
        f"{tool} does not serve {type(task.net).__name__} networks: {source} is a "
        f"{type(datamodule).__name__} run ({kind}, {type(task).__name__}); use {use}"
    )


def complexity_of(task: L.LightningModule, datamodule: L.LightningDataModule) -> Complexity:
    """Parameters and MACs of the task's network for one example of the datamodule's input."""
    return measure(task.net, datamodule.example_input())


def build_from_checkpoint(cfg: DictConfig) -> tuple[L.LightningDataModule, L.LightningModule]:
    """``build_task`` for a run's checkpoint (``eval.py``, ``predict.py``, ``generate.py``) or an
    exported file (``onnx=``).

    With ``cfg.ckpt_path`` the ``model``, ``data`` and ``task`` sections come from the checkpoint's
    run record, except those the command line chose (``model=...``, ``data.batch_size=...``:
    reported in the log), and the weights are loaded, with a short message when they do not fit.
    With ``cfg.onnx`` they come from the run record ``export.py`` wrote into the file; the network
    keeps its random weights, for the caller to replace by the file's runtime.
    """
    onnx = cfg.get("onnx")
    if cfg.get("ckpt_path") is None and onnx is None:
        return build_task(cfg)
    if cfg.get("ckpt_path") is not None and onnx is not None:
        raise UsageError("pass ckpt_path=<a run's .ckpt> or onnx=<an exported file>, not both")
    if onnx is not None:
        from src.export.metadata import exported_record

        checkpoint, record, source = None, renamed(exported_record(onnx)), f"onnx={onnx}"
    else:
        checkpoint = read_checkpoint(cfg.ckpt_path)
        record, source = record_of(checkpoint), str(cfg.ckpt_path)
    overrides = hydra_overrides()
    chosen = {override_key(o) for o in overrides}
    choices = {k: v for k, v in hydra_choices().items() if k in chosen}
    if record is not None:
        for line in config_from_checkpoint(cfg, record, overrides):
            log.info("%s", line)
        choices = {**record.get("choices", {}), **choices}
    else:
        log.warning(
            "%s carries no run record: the network is the one the command line composes", source
        )
    datamodule, task = build_task(cfg)
    if checkpoint is None:
        return datamodule, task
    model = OmegaConf.to_container(cfg.model, resolve=True)
    data = OmegaConf.to_container(cfg.data, resolve=True)
    asked = (
        f"{describe_model(model, choices.get('model'))}, {describe_data(data, choices.get('data'))}"
    )
    load_task_weights(task, checkpoint, cfg.ckpt_path, asked)
    return datamodule, task


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """Plain floats of logged metrics (tensors, numbers), sorted by name."""
    return {name: float(value) for name, value in sorted(metrics.items())}
