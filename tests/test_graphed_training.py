"""The graphed path: every text system and its baseline traces a training step as one graph that
CUDA graphs can replay.

Each system is built from its demo's model config (``conf/experiment/<demo>.yaml``) with a small
vocabulary, and its task steps on synthetic batches of a few fixed shapes, compiled as
:func:`src.build.compile_network` compiles it (``fullgraph=True``, ``dynamic=False``) with a backend
that applies the checks of torch's ``cudagraphs`` backend (``torch/_dynamo/backends/cudagraphs.py``)
to the forward and backward graphs AOTAutograd makes, then runs them as ``aot_eager`` does:

- no mutated input besides the parameters and buffers (CUDA-graph trees replay with fixed inputs);
- one device throughout: no tensor made on the host in the middle of the step;
- no op that CUDA graphs cannot hold (``is_cudagraph_unsafe_fx_node``: a host read such as
  ``aten._local_scalar_dense`` from ``.item()``, a data-dependent shape such as ``nonzero``'s).

A second pass over the same shapes compiles nothing (``error_on_recompile``). With dropout 0 the
traced step's loss and gradients equal the eager step's. On the CPU torch's ``cudagraphs`` backend
runs the graphs without capturing (its checks find CPU tensors), so the checks here are what a GPU
run would apply; :func:`src.build.compile_plan` decides where the path is taken. ``train.py`` runs
every demo traced from the command line (about half a minute each on two cores).
"""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, open_dict
from torch import Tensor
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.cudagraphs import (
    check_for_mutation_ignore_cuda_graph_managed_tensor,
    get_device_node_mapping,
)
from torch._dynamo.backends.debugging import boxed_nop
from torch._dynamo.utils import counters
from torch._inductor.utils import (
    count_tangents,
    get_first_incompatible_cudagraph_node,
    num_fw_fixed_arguments,
)

from src.build import CompilePlan, compile_network, compile_plan
from src.datamodules.translation import ParallelSplit, collate_packed
from src.tasks.graphed import own_gradients
from src.utils.config_checks import ConfigError
from tests.conftest import ROOT, compose_config

PAD, EOS = 1, 2


class CudaGraphChecks:
    """A torch.compile backend: AOTAutograd's forward and backward graphs, each checked as the
    ``cudagraphs`` backend checks them before capturing, then run by the FX interpreter.
    ``problems`` lists what a capture would refuse; ``graphs`` counts the graphs checked."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.graphs = 0

    def check(self, gm: torch.fx.GraphModule, fixed: int) -> None:
        self.graphs += 1
        if mutated := check_for_mutation_ignore_cuda_graph_managed_tensor(gm, fixed):
            self.problems.append(f"input mutation: {mutated}")
        devices = {d for d in get_device_node_mapping(gm) if d.type != "meta"}
        if len(devices) > 1:
            self.problems.append(f"several devices: {sorted(map(str, devices))}")
        if node := get_first_incompatible_cudagraph_node(gm):
            self.problems.append(f"incompatible op {node.target} ({node.stack_trace})")
        for node in gm.graph.find_nodes(op="get_attr"):
            if isinstance(getattr(gm, node.target), Tensor):  # made at trace time, on the host
                self.problems.append(f"tensor constant {node.target}")

    def __call__(self, gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        def forward(aot: torch.fx.GraphModule, aot_inputs: list[Any], **_: Any) -> Any:
            self.check(aot, num_fw_fixed_arguments(len(inputs), len(aot_inputs)))
            return boxed_nop(aot, aot_inputs)

        def backward(aot: torch.fx.GraphModule, aot_inputs: list[Any]) -> Any:
            self.check(aot, count_tangents(aot))
            return boxed_nop(aot, aot_inputs)

        compiler = aot_autograd(
            fw_compiler=forward, bw_compiler=backward, inference_compiler=forward
        )
        return compiler(gm, inputs)


@dataclass(frozen=True)
class System:
    """A demo and how its task steps: ``batch(shape, generator, vocab)`` makes a batch of one of
    ``shapes`` (two where the data gives several: translation buckets, AWD windows; one for a
    network that takes minutes to trace); ``eval_step(task, batch)`` is the validation step
    without a Trainer. ``blocks`` shortens a DeLighT network to that many blocks (the demo's
    depths and widths scaled over them), which traces in a fraction of the time."""

    demo: str
    vocab: int
    shapes: tuple[tuple[int, ...], ...]
    batch: Callable[[tuple[int, ...], torch.Generator, int], Any]
    eval_step: Callable[[Any, Any], None]
    blocks: int | None = None


def stream_batch(shape: tuple[int, ...], g: torch.Generator, vocab: int) -> tuple[Tensor, Tensor]:
    """Inputs and next-token targets (B, T) of a language model; no pads."""
    tokens = torch.randint(4, vocab, (shape[0], shape[1] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def translation_batch(shape: tuple[int, ...], g: torch.Generator, vocab: int) -> dict:
    """A teacher-forcing batch of packed rows (B, S) sources and (B, T) targets, as training
    batches come (``data.pack_pairs``): the first row holds two pairs, the last row one pair and
    pads, the others one pair each."""
    b, s, t = shape
    rows = (
        [[(s // 2, t // 2), (s - s // 2, t - t // 2)]]
        + [[(s, t)] for _ in range(b - 2)]
        + [[(s // 2, t // 2)]]
    )
    pairs = [
        (torch.randint(4, vocab, (n,), generator=g), torch.randint(4, vocab, (m,), generator=g))
        for row in rows for n, m in row
    ]  # fmt: skip
    for source, target in pairs:
        source[-1] = target[-1] = EOS
    split = ParallelSplit([p[0] for p in pairs], [p[1] for p in pairs], [""] * len(pairs),
                          list(range(len(pairs))))  # fmt: skip
    members, k = [], 0
    for row in rows:
        members.append(list(range(k, k + len(row))))
        k += len(row)
    return collate_packed(split, members, shape)


def lm_eval(task: Any, batch: Any) -> None:
    task._eval_step(batch, "val")


def segment_eval(task: Any, batch: Any) -> None:
    task._eval_step(batch, "val", task.val_nll)


def translation_eval(task: Any, batch: Any) -> None:
    task._eval_step(batch, "val", "none")


SYSTEMS = {
    s.demo: s
    for s in (
        System("delight_mt/demo", 60, ((2, 7, 6),), translation_batch, translation_eval, blocks=1),
        System("delight_mt/transformer_mt_demo", 60, ((2, 7, 6), (3, 5, 9)), translation_batch,
               translation_eval),
        System("char_lm/demo", 40, ((2, 64),), stream_batch, segment_eval),
        System("char_lm/demo_txl", 40, ((2, 64),), stream_batch, segment_eval),
        System("pru_lm/demo", 50, ((2, 6), (2, 8)), stream_batch, lm_eval),
        System("pru_lm/lstm_demo", 50, ((2, 6), (2, 8)), stream_batch, lm_eval),
        System("delight_lm/demo", 1600, ((2, 16),), stream_batch, lm_eval, blocks=1),
        System("delight_lm/transformer_lm_demo", 1600, ((2, 16), (2, 24)), stream_batch, lm_eval),
    )
}  # fmt: skip


@functools.cache
def demo_config(demo: str, vocab: int) -> DictConfig:
    cfg = compose_config("train", [f"experiment={demo}", "trainer=cpu"])
    with open_dict(cfg):
        for key in ("vocab_size", "src_vocab_size", "tgt_vocab_size"):
            if key in cfg.data:
                cfg.data[key] = vocab
    return cfg


def no_dropout(model: DictConfig) -> DictConfig:
    model = copy.deepcopy(model)
    for key in model:
        if "drop" in str(key):
            model[key] = 0.0
    return model


def build(system: System, *, dropout: bool = True) -> Any:
    """The demo's task and network (its dropouts, or none)."""
    torch.manual_seed(0)
    cfg = demo_config(system.demo, system.vocab)
    model = cfg.model if dropout else no_dropout(cfg.model)
    if system.blocks is not None:
        model = copy.deepcopy(model)
        with open_dict(model):
            model.num_blocks = system.blocks
    return instantiate(cfg.task, net=instantiate(model))


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """A fresh Dynamo, its settings (which compile_network raises) restored afterwards."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(recompile_limit=8, accumulated_recompile_limit=256,
                                    allow_rnn=False):  # fmt: skip
        yield
    torch._dynamo.reset()


def passes(system: System, task: Any) -> Iterator[None]:
    """Epochs as the Trainer runs them: two training steps (forward and backward) of every shape,
    then two evaluation steps of every shape, the carried state reset before each."""
    g = torch.Generator().manual_seed(1)
    while True:
        task.train()
        task.on_train_epoch_start()
        for shape in system.shapes:
            for _ in range(2):
                task.training_step(system.batch(shape, g, system.vocab), 0).backward()
        task.eval()
        task.on_validation_epoch_start()
        with torch.no_grad():
            for shape in system.shapes:
                for _ in range(2):
                    system.eval_step(task, system.batch(shape, g, system.vocab))
        yield


@pytest.mark.parametrize("demo", list(SYSTEMS))
def test_training_step_traces_as_one_graph_cuda_graphs_can_replay(demo: str) -> None:
    system = SYSTEMS[demo]
    task = build(system)
    backend = CudaGraphChecks()
    options = {"enabled": True, "backend": backend, "fullgraph": True, "dynamic": False}
    compile_network(task, options, {"accelerator": "cpu"}, len(system.shapes))
    task.replays_cuda_graphs = True  # the task's side as on a GPU: steps marked, state copied
    run = passes(system, task)
    next(run)
    assert sum(counters["graph_break"].values()) == 0
    assert backend.problems == []
    compiled = counters["stats"]["unique_graphs"]
    assert backend.graphs > compiled  # training graphs have a backward
    assert 2 <= compiled <= len(system.shapes) * task.graphs_per_shape
    with torch._dynamo.config.patch(error_on_recompile=True):
        next(run)
    assert counters["stats"]["unique_graphs"] == compiled


class HostReads(torch.nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        k = x.argmax().item()  # a host read
        return x * k + torch.tensor([1.0, 2.0])  # a constant made on the host


def test_the_checks_find_what_a_capture_refuses() -> None:
    """The checks are not vacuous: a host read and a tensor made on the host are found."""
    backend = CudaGraphChecks()
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        traced = torch.compile(HostReads(), backend=backend, fullgraph=True)
        traced(torch.randn(3, 2, requires_grad=True)).sum().backward()
    assert any("_local_scalar_dense" in p for p in backend.problems), backend.problems
    assert any("tensor constant" in p for p in backend.problems), backend.problems


@pytest.mark.parametrize("demo", list(SYSTEMS))
def test_traced_step_equals_the_eager_step_without_dropout(demo: str) -> None:
    """Two training steps, the second reading the state the first carried: the traced task's loss
    and gradients are the eager task's (same weights, no dropout), carried state copied as on a
    GPU."""
    system = SYSTEMS[demo]
    eager, traced = build(system, dropout=False), build(system, dropout=False)
    options = {"enabled": True, "backend": "aot_eager", "fullgraph": True, "dynamic": False}
    compile_network(traced, options, {"accelerator": "cpu"})
    traced.replays_cuda_graphs = True
    for task in (eager, traced):
        task.train()
        task.on_train_epoch_start()
    for step in range(2):
        batch = system.batch(system.shapes[0], torch.Generator().manual_seed(step), system.vocab)
        results = []
        for task in (eager, traced):
            task.zero_grad()
            loss = task.training_step(batch, 0)
            loss.backward()
            results.append([loss, *(p.grad for p in task.parameters() if p.grad is not None)])
        assert len(results[0]) == len(results[1]) > 1
        for want, got in zip(*results, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def storages(state: Any) -> set[int]:
    if isinstance(state, Tensor):
        return {state.untyped_storage().data_ptr()}
    return set().union(*(storages(s) for s in state)) if state else set()


@pytest.mark.parametrize("demo, attribute", [("char_lm/demo_txl", "memories"),
                                             ("pru_lm/lstm_demo", "_train_hidden")])  # fmt: skip
@pytest.mark.parametrize("graphed", [False, True])
def test_carried_state_is_copied_out_of_the_step_outputs_while_graphs_replay(
    demo: str, attribute: str, graphed: bool
) -> None:
    """The state a step hands to the next (Transformer-XL memories, the AWD model's recurrent
    state) is the network's output itself when eager, and a copy in other memory while CUDA graphs
    replay (a replay overwrites its outputs); the next step reads that copy."""
    system = SYSTEMS[demo]
    task = build(system)
    task.replays_cuda_graphs = graphed
    outputs: list[Any] = []
    inputs: list[Any] = []
    net = task.net
    if hasattr(net, "loss"):
        loss = net.loss

        def spy(tokens: Tensor, targets: Tensor, memories: Any = None) -> Any:
            inputs.append(memories)
            nll, new = loss(tokens, targets, memories)
            outputs.append(new)
            return nll, new

        net.loss = spy
    else:

        def hook(_: Any, args: tuple, out: Any) -> None:
            inputs.append(args[1])
            outputs.append(out.hidden)

        net.register_forward_hook(hook)
    g = torch.Generator().manual_seed(0)
    task.train()
    task.on_train_epoch_start()
    carried = []
    for _ in range(2):
        task.training_step(system.batch(system.shapes[0], g, system.vocab), 0).backward()
        state = getattr(task, attribute)
        carried.append(state["train"] if isinstance(state, dict) else state)
    assert inputs[1] is carried[0]  # the next step reads the state handed over
    for output, state in zip(outputs, carried, strict=True):
        assert storages(output) and storages(state)
        assert (storages(state).isdisjoint(storages(output))) == graphed


def plan_of(*overrides: str) -> CompilePlan:
    cfg = compose_config("train", overrides)
    return compile_plan(cfg.compile, get_class(cfg.task._target_), cfg.trainer)


GRAPHED = {"backend": "cudagraphs", "fullgraph": True, "dynamic": False}


@pytest.mark.parametrize("demo", list(SYSTEMS))
def test_a_text_demo_takes_the_graphed_path_on_a_gpu_and_runs_eagerly_on_the_cpu(demo: str) -> None:
    assert plan_of(f"experiment={demo}", "trainer=gpu") == CompilePlan("graphed", GRAPHED)
    assert plan_of(f"experiment={demo}", "trainer=cpu") == CompilePlan("eager", {})
    assert plan_of(f"experiment={demo}") == CompilePlan("eager", {})  # the demos' trainer=cpu


def test_where_the_graphed_path_is_not_taken() -> None:
    demo = "experiment=char_lm/demo"
    assert plan_of(demo, "trainer=gpu", "compile.enabled=false").path == "eager"
    assert plan_of(demo, "trainer=ddp").path == "eager"  # one process on one GPU only
    assert plan_of("data=digits", "trainer=gpu").path == "eager"  # a vision task
    # asked for explicitly: compiled, with the keys given and the path's defaults for the others
    assert plan_of(demo, "trainer=gpu", "compile.backend=inductor") == CompilePlan(
        "compiled", {**GRAPHED, "backend": "inductor"})  # fmt: skip
    assert plan_of(demo, "compile.enabled=true") == CompilePlan("compiled", {"backend": "inductor"})
    assert plan_of(demo, "compile.enabled=true", "compile.backend=cudagraphs").path == "compiled"
    assert plan_of(demo, "compile.enabled=true", "compile.backend=cudagraphs",
                   "trainer=gpu").path == "graphed"  # fmt: skip
    with pytest.raises(ConfigError, match="compile.enabled must be true, false or auto"):
        plan_of(demo, "compile.enabled=yes")


# the shortest real run: two training batches, one validation batch (the sanity check's)
SHORT_RUN = [
    "trainer.max_epochs=1",
    "trainer.max_steps=2",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=1",
    "trainer.log_every_n_steps=1",
    "test=false",
    "callbacks.progress_bar=null",
]
TRACED = ["compile.enabled=true", "compile.fullgraph=true", "compile.dynamic=false"]


def train_command(demo: str, backend: str, run_dir: Path) -> subprocess.CompletedProcess:
    """``python train.py experiment=<demo>`` compiled with ``backend``, graph breaks and
    recompilations logged (``TORCH_LOGS``); DeLighT with fewer blocks, which traces faster."""
    shorter = [f"++model.num_blocks={SYSTEMS[demo].blocks}"] if SYSTEMS[demo].blocks else []
    command = [sys.executable, "train.py", f"experiment={demo}", *TRACED, *SHORT_RUN, *shorter,
               f"compile.backend={backend}", f"hydra.run.dir={run_dir}"]  # fmt: skip
    env = {**os.environ, "TORCH_LOGS": "graph_breaks,recompiles"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def check_traced_run(done: subprocess.CompletedProcess) -> None:
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "Graph break" not in log
    assert "recompile limit" not in log.lower()
    assert "compiled path: torch.compile(" in log


@pytest.mark.slow
@pytest.mark.parametrize("demo", list(SYSTEMS))
def test_a_demo_trains_traced_from_the_command_line(demo: str, tmp_path: Path) -> None:
    check_traced_run(train_command(demo, "aot_eager", tmp_path / "run"))


@pytest.mark.slow
def test_the_cudagraphs_backend_runs_on_the_cpu(tmp_path: Path) -> None:
    """torch's ``cudagraphs`` backend on the CPU runs the traced graphs without capturing them."""
    done = train_command("delight_mt/transformer_mt_demo", "cudagraphs", tmp_path / "run")
    check_traced_run(done)
    assert "skipping cudagraphs due to cpu device" in done.stdout + done.stderr


class Square(torch.nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * x


def test_the_recompile_limit_covers_the_shapes_and_beyond_it_a_fullgraph_compile_fails() -> None:
    task = Square()
    task.net = Square()
    task.graphs_per_shape = 4
    options = {"enabled": True, "backend": "eager", "fullgraph": True, "dynamic": False}
    compile_network(task, options, {"accelerator": "cpu"}, batch_shapes=5)
    assert torch._dynamo.config.recompile_limit == 20
    for n in range(1, 21):
        task.net(torch.ones(n))
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        task.net(torch.ones(21))


class GraphBuffer(torch.autograd.Function):
    """Identity whose backward writes the gradient into one fixed buffer and returns it, as a
    replayed CUDA graph's backward returns its own output buffers."""

    buffer = torch.zeros(3)

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        GraphBuffer.buffer.copy_(grad)
        # a new tensor on the buffer's memory, held by no one else (autograd may then keep it)
        return grad.new_empty(0).set_(GraphBuffer.buffer.untyped_storage(), 0, grad.shape)


@pytest.mark.parametrize("hooked", [False, True])
def test_accumulated_gradients_survive_the_next_replay_when_copied_out(hooked: bool) -> None:
    weight = torch.nn.Parameter(torch.zeros(3))
    net = torch.nn.Module()
    net.weight = weight
    if hooked:
        assert own_gradients(net) == 1
    for scale in (1.0, 2.0):  # two micro-batches, the second's backward rewrites the buffer
        (GraphBuffer.apply(weight) * torch.tensor([1.0, 2.0, 3.0]) * scale).sum().backward()
    if hooked:
        assert weight.grad.tolist() == [3.0, 6.0, 9.0]
        assert weight.grad.data_ptr() != GraphBuffer.buffer.data_ptr()
    else:  # what autograd does by itself: the first gradient is the buffer, summed into itself
        assert weight.grad.data_ptr() == GraphBuffer.buffer.data_ptr()
        assert weight.grad.tolist() != [3.0, 6.0, 9.0]


@pytest.mark.parametrize("accumulate", [1, 4])
def test_the_graphed_path_copies_gradients_out_only_when_accumulating(
    accumulate: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("src.build.runs_on_cuda", lambda trainer: True)
    task = torch.nn.Module()
    task.net = torch.nn.Linear(2, 2)
    # not compiled here: the cudagraphs backend's reset edits Dynamo's backend cache while the
    # next test's reset walks it
    monkeypatch.setattr(task.net, "compile", lambda **options: None)
    trainer = {"accelerator": "gpu", "devices": 1, "accumulate_grad_batches": accumulate}
    options = {"enabled": True, "backend": "cudagraphs", "fullgraph": True, "dynamic": False}
    plan = compile_network(task, options, trainer)
    assert plan.path == "graphed"
    hooks = [len(p._backward_hooks or {}) for p in task.net.parameters()]
    assert hooks == ([1, 1] if accumulate > 1 else [0, 0])
