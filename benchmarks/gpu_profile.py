"""Training steps of every system beside its baseline: interleaved timings, a ``torch.profiler``
table per step, and ``torch.compile`` probes.

Each entry is one training step (forward, loss, backward, optimiser step) at the papers' sizes on
CUDA, bf16 autocast:

====================  ==============================================================================
``dicenet``            DiCENet s=1.0, 256 images of 224², channels-last (SGD), beside
``shufflenet``         torchvision ShuffleNetV2 x1.0
``espnetv2``           ESPNetv2 s=1.0, same batch
``gt4`` / ``gt2``      Group-Transformer G=4 / G=2 at enwik8 sizes (9 x 256, 22 x 512, memory 512),
``txl``                beside our Transformer-XL (9, 256, 8) (Adam)
``delight_mt``         DeLighT MT at IWSLT'14 sizes (d_m 320, 14.0 M), 4,096 source and 4,096 target
``transformer_mt``     tokens a batch, beside the fairseq-size IWSLT Transformer (39.5 M)
``awd_pru``            the AWD-PRU of PTB (g=4, M=1400; 20 x 70 tokens), beside
``awd_lstm``           the AWD-LSTM (cuDNN ``nn.LSTM``; M=1150, the thesis's baseline)
``ssd``                ESPNetv2-SSD300 (s=2.0), 32 images, its two heads' outputs as the loss
====================  ==============================================================================

Every optimiser is fused (one multi-tensor kernel a step), as every task builds it
(``conf/task/*.yaml``): DeLighT MT has 883 parameter tensors. (The LMs, MT and SSD use a stand-in
loss where their task's is elaborate: cross-entropy on random
targets for the language and translation models, the mean of SSD's outputs; the network's kernels
are what is profiled.) Three commands:

- ``pairs``: each system and its baseline, interleaved round-robin, median of ``--repeats``; one
  JSON line per entry (ms, units/s, the ratio to the baseline, parameters, peak memory, the first
  step's seconds; for the image networks also inference images/s). ``--graphed`` adds each text
  system and its baseline as a CUDA graph (``torch.compile(backend="cudagraphs", fullgraph=True,
  dynamic=False)``: the forward and backward replayed, the optimiser step eager), with its capture
  seconds, and two ratios: the graphed system against the baseline as users run it (eager) and
  against the baseline graphed the same way. With
  ``--profile MD``, then one profiled step of each entry: its top ``--top`` CUDA kernels by time,
  with input shapes, as JSON and as Markdown tables in MD; ``--trace PATH`` also writes the Chrome
  trace of the slowest profiled step (gzipped when PATH ends in ``.gz``).
- ``compile NAME``: ``torch.compile`` of one entry's training step: the first call's seconds (the
  compile), dynamo's graphs and graph breaks with their reasons, then the compiled step's median
  ms (``--backend eager``: dynamo alone, no code generation).
- ``warm``: two training steps and two inference forwards of each entry (``--only``), with their
  wall seconds: the first ones compile the kernels and make ``impl="auto"``'s choices, which the
  on-disk caches keep for the processes that time these shapes next.

On the CPU (``--dry``) every entry shrinks to a few images or tokens, fp32, so that the script
runs anywhere in seconds and cannot rot between GPU visits.

    python benchmarks/gpu_profile.py pairs [--dry] [--repeats 10] [--only NAME ...] [--graphed]
        [--profile MD] [--top 15] [--trace PATH] [--json PATH]
    python benchmarks/gpu_profile.py compile NAME [--dry] [--backend inductor]
    python benchmarks/gpu_profile.py warm [--dry] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.common import (
    IMAGE_SIZE,
    LM_BATCH,
    LM_LEN,
    VISION_BATCH,
    VOCAB,
    autocast,
    describe,
    enwik8_lm,
    enwik8_loss,
    enwik8_memories,
    from_config,
    parameter_count,
    run_once,
    synchronize,
    training_step,
    vision_network,
)

# entry -> the baseline it is compared with in ``pairs``, in the order they run (what no other
# benchmark measures first: a window on the GPU may end before the last)
BASELINES = {
    "delight_mt": "transformer_mt",
    "awd_pru": "awd_lstm",
    "gt4": "txl",
    "dicenet": "shufflenet",
    "espnetv2": "shufflenet",
    "gt2": "txl",
    "ssd": None,
}
NAMES = (
    "dicenet", "shufflenet", "espnetv2", "gt4", "gt2", "txl", "delight_mt", "transformer_mt",
    "awd_pru", "awd_lstm", "ssd",
)  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    """The sizes of one run: the papers' on CUDA, tiny with ``--dry``."""

    images: int
    image_size: int
    lm_batch: int
    lm_len: int
    mt_tokens: int  # source (and target) tokens a batch, in sentences of 32
    awd_batch: int
    awd_bptt: int
    ssd_images: int
    precision: str  # autocast to "bf16", or "fp32" for none


FULL = Sizes(VISION_BATCH, IMAGE_SIZE, LM_BATCH, LM_LEN, 4096, 20, 70, 32, "bf16")
DRY = Sizes(2, 64, 2, 16, 64, 2, 8, 1, "fp32")


@dataclass
class Entry:
    """A built training step: ``step()`` runs one; ``units`` (images or tokens) it processes;
    for the image networks also their input, for an inference forward."""

    step: Callable[[], None]
    units: int
    unit: str
    params: int
    net: nn.Module
    forward_input: Tensor | None = None

    def inference_seconds(self, calls: int, device: torch.device, precision: str) -> list[float]:
        """Seconds of each of ``calls`` inference forwards of ``forward_input`` (the network in
        eval mode for them)."""
        self.net.eval()
        with torch.inference_mode(), autocast(device, precision):
            seconds = [run_once(lambda: self.net(self.forward_input), device) for _ in range(calls)]
        self.net.train()
        return seconds


# the image entries that are torchvision's networks, by torchvision's names
TORCHVISION_NAMES = {"shufflenet": "shufflenet_v2_x1_0"}
# the graphed path of the text systems (src/build.py compiles them the same way under trainer=gpu)
GRAPHED = "cudagraphs"
TEXT = ("gt4", "gt2", "txl", "delight_mt", "transformer_mt", "awd_pru", "awd_lstm")


def compiled(net: nn.Module, backend: str | None) -> Callable[..., object]:
    """``net`` eager (``backend`` None), compiled by ``backend``, or, for :data:`GRAPHED`, one
    graph per shape replayed as a CUDA graph: fullgraph, static shapes."""
    if backend is None:
        return net
    if backend == GRAPHED:
        return torch.compile(net, backend=GRAPHED, fullgraph=True, dynamic=False)
    return torch.compile(net, backend=backend)


def vision_entry(name: str, sz: Sizes, device: torch.device, backend: str | None) -> Entry:
    net = vision_network(TORCHVISION_NAMES.get(name, name), sz.image_size)
    net = net.to(device, memory_format=torch.channels_last).train()
    forward = compiled(net, backend)
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(sz.images, 3, sz.image_size, sz.image_size, generator=generator)
    x = x.to(device).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(1000, (sz.images,), generator=generator).to(device)
    optimizer = torch.optim.SGD(
        net.parameters(), lr=0.01, momentum=0.9, weight_decay=4e-5, fused=True
    )
    step = training_step(lambda: F.cross_entropy(forward(x), labels), optimizer, device,
                         sz.precision, graphed=backend == GRAPHED)  # fmt: skip
    return Entry(step, sz.images, "images", parameter_count(net), net, x)


def charlm_entry(name: str, sz: Sizes, device: torch.device, backend: str | None) -> Entry:
    net = enwik8_lm(None if name == "txl" else int(name[2:]), sz.lm_len).to(device).train()
    forward = compiled(net, backend)
    generator = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(VOCAB, (sz.lm_batch, sz.lm_len + 1), generator=generator).to(device)
    memories = enwik8_memories(sz.lm_batch, sz.lm_len, device)
    optimizer = torch.optim.Adam(net.parameters(), lr=2.5e-4, fused=True)
    step = training_step(lambda: enwik8_loss(forward, tokens, memories), optimizer, device,
                         sz.precision, graphed=backend == GRAPHED)  # fmt: skip
    return Entry(step, sz.lm_batch * sz.lm_len, "tokens", parameter_count(net), net)


def mt_entry(name: str, sz: Sizes, device: torch.device, backend: str | None) -> Entry:
    if name == "delight_mt":
        # 14.0 M: the thesis's IWSLT row, d_m 320 (specs/delight_lm_mt.md)
        net = from_config("experiment=delight_mt/iwslt_d384", "model.d_model=320")
    else:
        net = from_config("data=iwslt14_de_en", "model=transformer_mt")
    net = net.to(device).train()
    forward = compiled(net, backend)
    src_vocab, tgt_vocab, length = 8848, 6632, 32
    sentences = max(1, sz.mt_tokens // length)
    generator = torch.Generator(device="cpu").manual_seed(0)
    # ids from 4 up: 0-3 are the dictionaries' special symbols (padding among them)
    src = torch.randint(4, src_vocab, (sentences, length), generator=generator).to(device)
    tgt = torch.randint(4, tgt_vocab, (sentences, length + 1), generator=generator).to(device)

    def loss() -> Tensor:
        logits = forward(src, None, tgt[:, :-1])  # (B, T, V_tgt); no padding
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt[:, 1:].reshape(-1))

    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)
    step = training_step(loss, optimizer, device, sz.precision, graphed=backend == GRAPHED)
    return Entry(step, sentences * length, "target tokens", parameter_count(net), net)


def awd_entry(name: str, sz: Sizes, device: torch.device, backend: str | None) -> Entry:
    experiment = {
        "awd_pru": "pru_lm/table4_1_awd_pru_g4_m1400",
        "awd_lstm": "pru_lm/table4_1_awd_lstm",
    }
    net = from_config(f"experiment={experiment[name]}").to(device).train()
    forward = compiled(net, backend)
    vocab = 10000  # PTB
    generator = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(vocab, (sz.awd_batch, sz.awd_bptt + 1), generator=generator).to(device)

    def loss() -> Tensor:
        logits = forward(tokens[:, :-1]).logits  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))

    optimizer = torch.optim.SGD(net.parameters(), lr=30.0, fused=True)
    step = training_step(loss, optimizer, device, sz.precision, graphed=backend == GRAPHED)
    return Entry(step, sz.awd_batch * sz.awd_bptt, "tokens", parameter_count(net), net)


def ssd_entry(name: str, sz: Sizes, device: torch.device, backend: str | None) -> Entry:
    net = from_config("experiment=detection/ssd_espnetv2_300").to(
        device, memory_format=torch.channels_last
    )
    net = net.train()
    forward = compiled(net, backend)
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(sz.ssd_images, 3, 300, 300, generator=generator).to(device)
    x = x.contiguous(memory_format=torch.channels_last)

    def loss() -> Tensor:
        boxes, scores = forward(x)
        return boxes.float().square().mean() + scores.float().logsumexp(-1).mean()

    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9, fused=True)
    step = training_step(loss, optimizer, device, sz.precision, graphed=backend == GRAPHED)
    return Entry(step, sz.ssd_images, "images", parameter_count(net), net, x)


BUILDERS: dict[str, Callable[[str, Sizes, torch.device, bool], Entry]] = {
    "dicenet": vision_entry, "shufflenet": vision_entry, "espnetv2": vision_entry,
    "gt4": charlm_entry, "gt2": charlm_entry, "txl": charlm_entry,
    "delight_mt": mt_entry, "transformer_mt": mt_entry,
    "awd_pru": awd_entry, "awd_lstm": awd_entry, "ssd": ssd_entry,
}  # fmt: skip


def build(name: str, sz: Sizes, device: torch.device, backend: str | None = None) -> Entry:
    """``name``'s training step, eager, or under ``torch.compile`` with ``backend`` ("eager":
    dynamo alone, no code generation)."""
    torch.manual_seed(0)
    return BUILDERS[name](name, sz, device, backend)


def emit(row: dict, rows: list[dict]) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


class Profiler:
    """One profiled step per entry: the top kernels as rows and Markdown tables; the Chrome trace
    of the slowest step kept for ``trace``."""

    def __init__(self, device: torch.device, top: int, trace: Path | None, md: Path) -> None:
        self.device, self.top, self.trace, self.md = device, top, trace, md
        md.write_text("")
        self.slowest: tuple[float, str] | None = None
        self.scratch = Path(tempfile.mkdtemp(prefix="profile_"))

    def __call__(self, name: str, entry: Entry, rows: list[dict]) -> None:
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        synchronize(self.device)
        with profile(activities=activities, record_shapes=True) as prof:
            seconds = run_once(entry.step, self.device)
        # the ops (with their input shapes) by the time of the kernels they launched themselves on
        # CUDA, by their own CPU time on the CPU; on CUDA also the kernels by name
        if cuda:

            def time_of(e) -> float:
                return e.self_device_time_total
        else:

            def time_of(e) -> float:
                return e.self_cpu_time_total

        ops = [e for e in prof.key_averages(group_by_input_shape=True)
               if e.device_type.name == "CPU" and time_of(e) > 0]  # fmt: skip
        total = sum(time_of(e) for e in ops) or 1.0
        ops.sort(key=time_of, reverse=True)
        top_ops = [
            {"op": e.key[:120], "shapes": str(e.input_shapes)[:200], "calls": e.count,
             "us": round(time_of(e), 1), "share": round(time_of(e) / total, 4)}
            for e in ops[: self.top]
        ]  # fmt: skip
        kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        kernel_total = sum(e.device_time_total for e in kernels)
        kernels.sort(key=lambda e: e.device_time_total, reverse=True)
        top_kernels = [
            {"kernel": e.key[:160], "calls": e.count, "us": round(e.device_time_total, 1),
             "share": round(e.device_time_total / max(kernel_total, 1e-9), 4)}
            for e in kernels[: self.top]
        ]  # fmt: skip
        # a step bound by its kernels takes little more than their sum (graphed: target 1.15x)
        over = seconds * 1e6 / kernel_total if kernel_total else None
        emit({"part": "profile", "name": name, "step_ms": round(seconds * 1e3, 3),
              "op_us_total": round(total, 1), "kernel_us_total": round(kernel_total, 1),
              "wall_over_kernels": None if over is None else round(over, 3),
              "kernel_launches": sum(e.count for e in kernels), "top": top_ops,
              "top_kernels": top_kernels}, rows)  # fmt: skip
        where = "the CUDA time of its own kernels" if cuda else "its own CPU time"
        table = [
            f"#### {name}: step {seconds * 1e3:.1f} ms under the profiler, "
            f"{sum(e.count for e in kernels)} kernel launches"
            + (f", {over:.2f}x its kernels' {kernel_total / 1e3:.1f} ms" if over else ""),
            "",
            f"Top ops by {where} ({total / 1e3:.1f} ms in all):",
            "",
            "| op | input shapes | calls | ms | share |",
            "|---|---|---|---|---|",
        ]
        table += [
            f"| `{r['op'][:60]}` | {r['shapes'][:90]} | {r['calls']} | "
            f"{r['us'] / 1e3:.2f} | {r['share']:.1%} |"
            for r in top_ops
        ]
        if top_kernels:
            table += [
                "",
                f"Top CUDA kernels ({kernel_total / 1e3:.1f} ms in all):",
                "",
                "| kernel | calls | ms | share |",
                "|---|---|---|---|",
            ]
            table += [
                f"| `{r['kernel'][:100]}` | {r['calls']} | {r['us'] / 1e3:.2f} | {r['share']:.1%} |"
                for r in top_kernels
            ]
        # appended as it comes: a run stopped at a deadline keeps the tables it made
        with open(self.md, "a") as file:
            file.write("\n".join(table) + "\n\n")
        if self.trace is not None and (self.slowest is None or seconds > self.slowest[0]):
            prof.export_chrome_trace(str(self.scratch / "slowest.json"))
            self.slowest = (seconds, name)

    def finish(self, rows: list[dict]) -> None:
        """Write the slowest step's trace (gzipped when its name ends in .gz)."""
        if self.trace is not None and self.slowest is not None:
            self.trace.parent.mkdir(parents=True, exist_ok=True)
            opener = gzip.open if self.trace.suffix == ".gz" else open
            with (
                open(self.scratch / "slowest.json", "rb") as source,
                opener(self.trace, "wb") as out,
            ):
                shutil.copyfileobj(source, out)
            emit({"part": "profile", "trace": str(self.trace), "trace_of": self.slowest[1]}, rows)
        shutil.rmtree(self.scratch, ignore_errors=True)


def pairs(
    names: list[str],
    sz: Sizes,
    device: torch.device,
    repeats: int,
    rows: list[dict],
    profiler: Profiler | None = None,
    graphed: bool = False,
) -> None:
    """Each system beside its baseline, interleaved, one row per entry; with ``graphed`` the text
    systems and their baselines also as CUDA graphs (rows named ``NAME+graphed``); then, with a
    profiler, one profiled step of each (a baseline shared by two systems once)."""
    groups = [[name] + ([base] if base else []) for name, base in BASELINES.items()
              if name in names]  # fmt: skip
    profiled: set[str] = set()
    for group in groups:
        entries: dict[str, Entry] = {}
        facts: dict[str, dict] = {}
        variants = [(name, None) for name in group]
        if graphed:
            variants += [(name, GRAPHED) for name in group if name in TEXT]
        for name, backend in variants:
            label = name if backend is None else f"{name}+graphed"
            try:
                facts[label] = _built(entries, label, name, sz, device, backend)
            except Exception as error:
                emit({"part": "pairs", "name": label, "error": describe(error)}, rows)
                entries.pop(label, None)
        samples: dict[str, list[float]] = {label: [] for label in entries}
        for _ in range(repeats):
            for label, entry in entries.items():
                samples[label].append(run_once(entry.step, device))
        ms = {label: 1e3 * statistics.median(s) for label, s in samples.items()}
        base = BASELINES[group[0]]
        for label, entry in entries.items():
            name, _, mode = label.partition("+")
            speedup = ms[base] / ms[label] if base in ms and name != base else None
            same_way = f"{base}+{mode}" if mode else None
            row = {
                "part": "pairs", "name": label, "baseline": base if name != base else None,
                "mode": mode or "eager", "ms": round(ms[label], 3),
                "per_s": round(entry.units / ms[label] * 1e3, 1), "unit": entry.unit,
                "params": entry.params, "speedup": None if speedup is None else round(speedup, 3),
                **facts[label],
            }  # fmt: skip
            if same_way in ms and name != base:
                row["speedup_same_way"] = round(ms[same_way] / ms[label], 3)
            emit(row, rows)
        if profiler is not None:
            for label, entry in entries.items():
                if label not in profiled:
                    profiled.add(label)
                    try:
                        profiler(label, entry, rows)
                    except Exception as error:
                        emit({"part": "profile", "name": label, "error": describe(error)}, rows)
        del entries
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _built(
    entries: dict[str, Entry],
    label: str,
    name: str,
    sz: Sizes,
    device: torch.device,
    backend: str | None,
) -> dict:
    """Build ``name``'s step into ``entries[label]`` and warm it up (autotuning, the kernels'
    first-use timing, cuDNN's, the graph's capture): the first step's and the warm-up's seconds,
    the memory it took at its peak, and for the image networks inference images/s."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    from src.kernels import timings

    started = time.perf_counter()
    entry = entries[label] = build(name, sz, device, backend)
    before_timing = timings()
    first = run_once(entry.step, device)
    # how many of impl="auto"'s choices the first step measured: none where the committed table
    # and the machine's store hold them
    timed_choices = timings() - before_timing
    for _ in range(2):
        entry.step()
    synchronize(device)
    facts = {"first_step_s": round(first, 3), "timed_choices": timed_choices,
             "warm_up_s": round(time.perf_counter() - started, 2)}  # fmt: skip
    if backend == GRAPHED:
        facts["capture_s"] = facts["warm_up_s"]  # tracing, compiling nothing, recording
    if device.type == "cuda":
        facts["peak_mib"] = round((torch.cuda.max_memory_allocated(device) - before) / 2**20, 1)
    if entry.forward_input is not None:
        infer = entry.inference_seconds(7, device, sz.precision)
        facts["infer_per_s"] = round(entry.units / statistics.median(infer[2:]), 1)
    return facts


def compile_probe(
    name: str, sz: Sizes, device: torch.device, repeats: int, backend: str, rows: list[dict]
) -> None:
    """Compile one entry's training step: first call (the compile), graphs, breaks, median ms."""
    from torch._dynamo.utils import counters

    counters.clear()
    started = time.perf_counter()
    try:
        entry = build(name, sz, device, backend)
        first = run_once(entry.step, device)
        graphs = int(counters["stats"]["unique_graphs"])
        breaks = {str(reason)[:200]: n for reason, n in counters["graph_break"].items()}
        for _ in range(3):
            entry.step()
        ms = 1e3 * statistics.median(run_once(entry.step, device) for _ in range(repeats))
    except Exception as error:
        emit(
            {
                "part": "compile",
                "name": name,
                "error": describe(error),
                "seconds_before_error": round(time.perf_counter() - started, 1),
            },
            rows,
        )
        return
    emit({"part": "compile", "name": name, "compile_s": round(first, 2), "graphs": graphs,
          "graph_breaks": sum(breaks.values()), "break_reasons": breaks,
          "compiled_ms": round(ms, 3), "per_s": round(entry.units / ms * 1e3, 1),
          "unit": entry.unit}, rows)  # fmt: skip


def warm(names: list[str], sz: Sizes, device: torch.device, rows: list[dict]) -> None:
    """Two training steps and two inference forwards of each entry, untimed but for their wall
    seconds: the first ones compile the kernels and make ``impl="auto"``'s measured choices,
    which Triton's and :mod:`src.kernels.choices`' on-disk caches keep for later processes
    (the vision benchmarks, the yardsticks) at these shapes."""
    for name in names:
        try:
            entry = build(name, sz, device)
            train = [run_once(entry.step, device) for _ in range(2)]
            infer = []
            if entry.forward_input is not None:
                infer = entry.inference_seconds(2, device, sz.precision)
        except Exception as error:
            emit({"part": "warm", "name": name, "error": describe(error)}, rows)
            continue
        emit({"part": "warm", "name": name, "first_train_step_s": round(train[0], 2),
              "second_train_step_s": round(train[1], 3),
              "first_inference_s": round(infer[0], 2) if infer else None,
              "second_inference_s": round(infer[1], 3) if infer else None}, rows)  # fmt: skip
        del entry
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("pairs", "compile", "warm"))
    parser.add_argument("name", nargs="?", choices=NAMES, help="the entry to compile")
    parser.add_argument("--dry", action="store_true", help="CPU, tiny sizes, fp32")
    parser.add_argument("--only", nargs="+", choices=NAMES, help="these entries only")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--graphed",
        action="store_true",
        help="pairs: also the text systems and baselines as CUDA graphs",
    )
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="MD",
        help="pairs: also profile one step of each entry; tables to this file",
    )
    parser.add_argument("--trace", type=Path, help="Chrome trace of the slowest profiled step")
    parser.add_argument("--json", type=Path, help="also write the rows (JSON lines) here")
    parser.add_argument("--backend", default="inductor", help="compile: torch.compile's backend")
    args = parser.parse_args(argv)
    if args.command == "compile" and args.name is None:
        parser.error("compile needs the NAME of an entry")
    if not args.dry and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --dry on the CPU")
    device = torch.device("cpu" if args.dry else "cuda")
    sz = DRY if args.dry else FULL
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    names = list(args.only or NAMES)
    rows: list[dict] = []
    if args.command == "pairs":
        profiler = Profiler(device, args.top, args.trace, args.profile) if args.profile else None
        pairs(names, sz, device, args.repeats, rows, profiler, args.graphed)
        if profiler is not None:
            profiler.finish(rows)
    elif args.command == "warm":
        warm(names, sz, device, rows)
    else:
        compile_probe(args.name, sz, device, args.repeats, args.backend, rows)
    if args.json:
        with open(args.json, "a") as file:
            for row in rows:
                file.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
