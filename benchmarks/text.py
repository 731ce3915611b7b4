"""Throughput of the text systems against their plain baselines, side by side, in one process.

Each group below builds its models from the project's Hydra configs (``conf/``) with
``src.build.build_task``, so the sizes are the configs' and the losses are the tasks' own
(``training_step``: label-smoothed cross-entropy, AR/TAR, adaptive softmax). Within a group the
candidates run interleaved round-robin (A, B, A, B, ...; every metric of a round before the
next), after one warm-up call of each (the CPU kernels' ``impl="auto"`` choices are timed
there); the median of ``--repeats`` samples is reported, with CUDA synchronised around each call.
A training step is the task's ``training_step`` (forward and loss), backward, gradient clipping
where the config's ``trainer.gradient_clip_val`` asks for it, and the task's optimiser step
(``task.optimizer``, fused; no schedule). Everything runs in float32 on random weights. Ratio =
A's throughput / B's (> 1: A, the efficient model, is faster), except the demo pair, whose ratio is
A's step time / B's (< 1: A is faster).

==============  ==============================================================================
``pru_ptb``     the first layer of AWD-PRU (``experiment=pru_lm/table4_1_awd_pru_g4_m1400``: 400 ->
                1400, g = 4, K = 2) against ``nn.LSTM`` 400 -> M' of equal parameters
                (``benchmarks/pru_lm.py``'s rule) on a (B, T) = (20, 70) window of random
                vectors (``conf/recipe/ptb_awd_lm.yaml``); training (forward and backward of
                ``mean(out ** 2)``) and inference (no grad) tokens/s.
``pru_wt2``     the same at WikiText-2's sizes (``data=wikitext2``: the same layer, which the thesis
                trains on both corpora; (B, T) = (80, 70), ``conf/recipe/wikitext2_awd_lm.yaml``).
``awd_ptb``     AWD-PRU (18.9 M) against AWD-LSTM (``experiment=pru_lm/table4_1_awd_lstm``, 3 x
                1150, 24.2 M: the thesis's baseline, not of equal size), whole models at PTB's:
                training tokens/s at the recipe's (20, 70) batch of random words, and
                dynamic-evaluation tokens/s: ``src.evaluation.dynamic_eval.dynamic_evaluate``
                as ``eval.py`` runs it (``conf/eval.yaml``'s options: one row, segments of 5
                words; per segment forward, backward and the RMS update), over ``--dyn-segments``
                segments, with the gradient statistics taken on one 1 x 5 training segment
                instead of the training stream (a fixed cost, included, as is the weights' copy
                and restore around the call); tokens are the evaluated ones.
``mt_iwslt``    DeLighT MT (``data=iwslt14_de_en model=delight_mt``: d_m 320, N 3 -> 9,
                14,022,600 params) against the IWSLT Transformer (``model=transformer_mt``,
                39,469,056): training target tokens/s on 163 sentence pairs of 25 source and 25
                target tokens (4,075 target tokens: the data config's ``max_tokens`` 4,096), and
                beam-4 translation sentences/s (``src.decoding.beam_search.beam_search`` with the
                task's beam size and length penalty) of ``--beam-sentences`` sources of 25 tokens
                up to 1.0 x 25 + 10 tokens. Both decode exactly 36 steps: eos is held at a logit
                of -1e4 until the last step, where it is the only choice (random weights would
                otherwise end each model's hypotheses at different steps). Both decoders cache
                their keys and values: a step runs the layers on the new position only.
``mt_demo``     the demos (``experiment=delight_mt/demo`` vs
                ``delight_mt/transformer_mt_demo``, about 1.17 M params each): one epoch's
                training batches of the gettext corpus (the demo's ``max_tokens`` 1,024; the
                data module's own batches), ms per step, the mean over the epoch; ratio =
                DeLighT's / the Transformer's.
``lm_pydoc``    the study's equal-parameter pair (``conf/study/delight_lm.yaml``:
                ``experiment=delight_lm/demo`` vs ``delight_lm/transformer_lm_demo``), training
                tokens/s on the first batch of the pydoc_words corpus (16 x 128 words: the real
                words matter to the adaptive softmax's cost).
``charlm``      the Group-Transformers G = 2 and G = 4 (``experiment=charlm_table2_gt_g2/g4``)
                against Transformer-XL (``experiment=char_lm/table2_txl_l9_d256_h8``; 9 x 256, 8
                heads) with ``benchmarks/charlm.py``'s segment and memory of 512 characters
                (and the configs' dropout 0.1, where that script has none): training tokens/s
                on 2 streams (memory carried, full after the warm-up) and inference tokens/s of
                one 512-character segment with a full memory (batch 1). Pairs ``charlm_g2`` and
                ``charlm_g4``.
==============  ==============================================================================

``--quick`` shrinks every model and batch (and uses 2 repeats) for a smoke test. Prints each
model's parameters and, as each group is measured, one JSON line per (pair, metric) with the
machine, the thread count, the torch version and the date; then the table of all.

    python benchmarks/text.py [--device cpu|cuda] [--threads 2] [--repeats 7] [--only SUBSTRING]
        [--beam-sentences 8] [--dyn-segments 40] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from benchmarks.common import (
    ROOT,
    compose,
    cpu_name,
    lstm_hidden_for,
    parameter_count,
    run_once,
)
from src.build import build_task
from src.decoding.beam_search import beam_search
from src.evaluation.dynamic_eval import dynamic_evaluate
from src.kernels.cpu import cpu_kernels
from src.kernels.environment import cpu_path_mode

# eos held this far below every other logit: no hypothesis ends before its max length
SUPPRESSED_EOS = -1e4
FIRST_WORD = 4  # ids 0-3 are the translation dictionaries' special symbols


@dataclass(frozen=True)
class Metric:
    """One timed quantity of a group: ``per_call`` units (tokens, sentences or steps) a call."""

    name: str
    unit: str  # "tok/s", "sent/s" or "ms/step"
    per_call: int
    setting: str


@dataclass
class Candidate:
    """A model of a group and its timed calls, one per metric name."""

    name: str
    params: int
    calls: dict[str, Callable[[], None]]
    tag: str = ""  # names the pair in a group of more than one comparison: "<group>_<tag>"


@dataclass
class Group:
    """Candidates timed together; each but the last is compared with the last, the baseline.
    ``targets[(candidate, metric)]`` is the ratio that candidate should reach."""

    name: str
    metrics: list[Metric]
    candidates: list[Candidate]
    targets: dict[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    """What the command line sets for the groups."""

    device: torch.device
    quick: bool
    beam_sentences: int
    dyn_segments: int


def build(*overrides: str) -> tuple[DictConfig, Any, Any]:
    """The config, datamodule and task of ``overrides`` as ``train.py`` builds them (no data is
    read unless the datamodule must count a vocabulary)."""
    root = os.environ.get("PROJECT_ROOT", str(ROOT))
    cfg = compose([*overrides, f"paths.root_dir={root}"])
    datamodule, task = build_task(cfg)
    return cfg, datamodule, task


def training_step(cfg: DictConfig, task: Any, batches: list[Any]) -> Callable[[], None]:
    """One call: a training step of ``task`` on each of ``batches`` (module docstring)."""
    optimizer = instantiate(cfg.task.optimizer)(task.parameters())
    clip = cfg.trainer.get("gradient_clip_val")
    params = [p for p in task.parameters() if p.requires_grad]

    def call() -> None:
        task.train()
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            task.training_step(batch, 0).backward()
            if clip:
                nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()

    return call


def random_ids(shape: tuple[int, ...], low: int, high: int, device: torch.device) -> Tensor:
    return torch.randint(low, high, shape, device=device)


# -- the groups ---------------------------------------------------------------------------------


def pru_layer(s: Settings, data: str) -> Group:
    overrides = ["experiment=pru_lm/table4_1_awd_pru_g4_m1400", f"data={data}"]
    if s.quick:
        overrides += ["model.embedding_dim=16", "model.hidden_size=32", "data.batch_size=2",
                      "data.bptt=8"]  # fmt: skip
    cfg, _, task = build(*overrides)
    pru = task.net.rnns[0].to(s.device)  # E -> M, batch-first
    n_in = cfg.model.embedding_dim
    lstm = nn.LSTM(n_in, lstm_hidden_for(parameter_count(pru), n_in), batch_first=True).to(s.device)
    batch, bptt = cfg.data.batch_size, cfg.data.bptt
    x = torch.randn(batch, bptt, n_in, device=s.device)  # (B, T, E)

    def calls(layer: nn.Module) -> dict[str, Callable[[], None]]:
        def train() -> None:
            layer.zero_grad(set_to_none=True)
            out, _ = layer(x)  # (B, T, M)
            out.pow(2).mean().backward()

        def infer() -> None:
            with torch.no_grad():
                layer(x)

        return {"train": train, "infer": infer}

    g, k, m = cfg.model.groups, cfg.model.levels, cfg.model.hidden_size
    setting = f"(B, T) = ({batch}, {bptt})"
    metrics = [Metric("train", "tok/s", batch * bptt, setting),
               Metric("infer", "tok/s", batch * bptt, setting)]  # fmt: skip
    a = Candidate(f"PRU {n_in}->{m} (g={g}, K={k})", parameter_count(pru), calls(pru))
    b = Candidate(
        f"nn.LSTM {n_in}->{lstm.hidden_size} (equal params)", parameter_count(lstm), calls(lstm)
    )
    group = Group(f"pru_{'ptb' if data == 'ptb' else 'wt2'}", metrics, [a, b])
    if data == "ptb":
        group.targets = {(a.name, "train"): ">= 1.0", (a.name, "infer"): ">= 1.2"}
    return group


def awd(s: Settings) -> Group:
    quick = ["model.embedding_dim=16", "model.hidden_size=32", "data.batch_size=2",
             "data.bptt=8"] if s.quick else []  # fmt: skip
    options = OmegaConf.load(ROOT / "conf" / "eval.yaml").dynamic_eval_options
    segments = 2 if s.quick else s.dyn_segments
    metrics: list[Metric] = []
    candidates = []
    for name, experiment in (("AWD-PRU", "pru_lm/table4_1_awd_pru_g4_m1400"),
                             ("AWD-LSTM", "pru_lm/table4_1_awd_lstm")):  # fmt: skip
        cfg, _, task = build(f"experiment={experiment}", *quick)
        task.to(s.device)
        batch, bptt, vocab = cfg.data.batch_size, cfg.data.bptt, cfg.data.vocab_size
        torch.manual_seed(0)  # the same words for both models
        words = random_ids((batch, bptt + 1), 0, vocab, s.device)
        stream = random_ids((1, options.bptt * (segments + 1) + 1), 0, vocab, s.device)
        # (1, bptt) windows of one row: the first for the statistics, the others evaluated
        windows = [(stream[:, i : i + options.bptt], stream[:, i + 1 : i + 1 + options.bptt])
                   for i in range(0, options.bptt * (segments + 1), options.bptt)]  # fmt: skip

        def dynamic(net: nn.Module = task.net, windows: list = windows) -> None:
            dynamic_evaluate(net, windows[:1], windows[1:], lr=options.lr, lamb=options.lamb,
                             epsilon=options.epsilon, max_batches=1)  # fmt: skip

        calls = {"train": training_step(cfg, task, [(words[:, :-1], words[:, 1:])]),
                 "dynamic_eval": dynamic}  # fmt: skip
        m = cfg.model.hidden_size
        label = f"{name} ({cfg.model.num_layers} x {m})"
        candidates.append(Candidate(label, parameter_count(task.net), calls))
        metrics = [Metric("train", "tok/s", batch * bptt, f"(B, T) = ({batch}, {bptt})"),
                   Metric("dynamic_eval", "tok/s", segments * options.bptt,
                          f"{segments} segments of 1 x {options.bptt}")]  # fmt: skip
    return Group("awd_ptb", metrics, candidates)


class EosAtMaxLength(nn.Module):
    """``net`` for the searches with eos at :data:`SUPPRESSED_EOS`: every hypothesis runs to its
    max length, where eos is the only token allowed, so all models decode the same steps."""

    def __init__(self, net: nn.Module, eos: int) -> None:
        super().__init__()
        self.net = net
        self.eos = eos

    def encode(self, src_tokens: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        return self.net.encode(src_tokens, src_padding_mask)

    def decode_step(
        self, prev_output_tokens: Tensor, encoder_out: Tensor, src_padding_mask: Tensor | None,
        state: Any,
    ) -> tuple[Tensor, Any]:  # fmt: skip
        logits, state = self.net.decode_step(prev_output_tokens, encoder_out, src_padding_mask,
                                             state)  # fmt: skip
        logits = logits.clone()  # (B, 1, V)
        logits[..., self.eos] = SUPPRESSED_EOS
        return logits, state


def mt_iwslt(s: Settings) -> Group:
    length, extra = (6, 2) if s.quick else (25, 10)  # sentence length, max_len_b
    sentences = 2 if s.quick else 4096 // length
    beam_sentences = 2 if s.quick else s.beam_sentences
    systems = (
        ("DeLighT MT", ["model=delight_mt"],
         ["model.d_model=32", "model.n_min=2", "model.n_max=3"]),
        ("Transformer MT", ["model=transformer_mt"],
         ["model.d_model=16", "model.ffn_dim=32", "model.num_layers=1", "model.num_heads=2"]),
    )  # fmt: skip
    candidates = []
    for name, model, quick in systems:
        cfg, _, task = build("data=iwslt14_de_en", *model, *(quick if s.quick else []))
        task.to(s.device)
        src_vocab, tgt_vocab = cfg.data.src_vocab_size, cfg.data.tgt_vocab_size
        torch.manual_seed(0)  # the same sentences for both models
        src = random_ids((sentences, length), FIRST_WORD, src_vocab, s.device)
        tgt = random_ids((sentences, length), FIRST_WORD, tgt_vocab, s.device)
        prev = torch.cat((torch.full_like(tgt[:, :1], task.eos), tgt[:, :-1]), dim=1)  # (B, T)
        batch = {"src_tokens": src, "prev_output_tokens": prev, "target": tgt}
        sources = src[:beam_sentences]
        search = EosAtMaxLength(task.net, task.eos)

        def beam(task: Any = task, search: nn.Module = search, sources: Tensor = sources) -> None:
            task.eval()
            beam_search(search, sources, beam_size=task.search["beam_size"], max_len_a=1.0,
                        max_len_b=extra, length_penalty=task.search["length_penalty"],
                        eos=task.eos, pad=task.padding_idx)  # fmt: skip

        beam_name = f"beam{task.search['beam_size']}"
        calls = {"train": training_step(cfg, task, [batch]), beam_name: beam}
        candidates.append(
            Candidate(f"{name} (d {cfg.model.d_model})", parameter_count(task.net), calls)
        )
        metrics = [
            Metric("train", "tok/s", sentences * length,
                   f"{sentences} pairs of {length} + {length} tokens"),
            Metric(beam_name, "sent/s", beam_sentences,
                   f"{beam_sentences} sources of {length}, {length + extra + 1} steps"),
        ]  # fmt: skip
    a = candidates[0].name
    return Group("mt_iwslt", metrics, candidates,
                 {(a, "train"): ">= 1.0", (a, beam_name): ">= 1.2"})  # fmt: skip


def mt_demo(s: Settings) -> Group:
    candidates = []
    batches: list[dict[str, Tensor]] = []
    for name, experiment in (
        ("DeLighT MT demo", "delight_mt/demo"),
        ("Transformer MT demo", "delight_mt/transformer_mt_demo"),
    ):
        cfg, datamodule, task = build(f"experiment={experiment}")
        task.to(s.device)
        if not batches:  # both demos read the same corpus and batches
            torch.manual_seed(cfg.seed)
            datamodule.prepare_data()
            datamodule.setup("fit")
            keys = ("src_tokens", "prev_output_tokens", "target")
            batches = [{k: b[k].to(s.device) for k in keys} for b in datamodule.train_dataloader()]
            batches = batches[:2] if s.quick else batches
        calls = {"train": training_step(cfg, task, batches)}
        candidates.append(
            Candidate(f"{name} (d {cfg.model.d_model})", parameter_count(task.net), calls)
        )
        tokens = cfg.data.max_tokens
    metric = Metric("train", "ms/step", len(batches),
                    f"{len(batches)} batches of <= {tokens} tokens")  # fmt: skip
    return Group("mt_demo", [metric], candidates, {(candidates[0].name, "train"): "<= 1.1"})


def lm_pydoc(s: Settings) -> Group:
    candidates = []
    for name, experiment in (
        ("DeLighT LM demo", "delight_lm/demo"),
        ("Transformer LM demo", "delight_lm/transformer_lm_demo"),
    ):
        cfg, datamodule, task = build(f"experiment={experiment}")
        task.to(s.device)
        datamodule.prepare_data()
        datamodule.setup("fit")
        tokens, targets = next(iter(datamodule.train_dataloader()))  # (B, T) each
        if s.quick:
            tokens, targets = tokens[:2, :16], targets[:2, :16]
        batch = (tokens.to(s.device), targets.to(s.device))
        calls = {"train": training_step(cfg, task, [batch])}
        candidates.append(
            Candidate(f"{name} (d {cfg.model.d_model})", parameter_count(task.net), calls)
        )
    b, t = tokens.shape
    return Group("lm_pydoc", [Metric("train", "tok/s", b * t, f"(B, T) = ({b}, {t})")],
                 candidates)  # fmt: skip


def charlm(s: Settings) -> Group:
    segment, streams = (16, 2) if s.quick else (512, 2)
    sizes = [f"data.tgt_len={segment}", f"model.mem_len={segment}"]
    if s.quick:
        sizes += ["model.n_layer=1", "model.d_model=32", "model.n_head=4", "model.d_inner=64"]
    candidates = []
    for tag, name, experiment in (
        ("g2", "Group-Transformer G=2", "char_lm/table2_gt_g2"),
        ("g4", "Group-Transformer G=4", "char_lm/table2_gt_g4"),
        ("", "Transformer-XL", "char_lm/table2_txl_l9_d256_h8"),
    ):
        cfg, _, task = build(f"experiment={experiment}", *sizes)
        task.to(s.device)
        net = task.net
        vocab = cfg.data.vocab_size
        torch.manual_seed(0)  # the same characters for every model
        text = random_ids((streams, segment + 1), 0, vocab, s.device)
        one = random_ids((1, segment), 0, vocab, s.device)
        memories = [torch.zeros(1, segment, net.d_model, device=s.device)
                    for _ in range(net.n_layer + 1)]  # fmt: skip

        def infer(net: nn.Module = net, one: Tensor = one, memories: list = memories) -> None:
            net.eval()
            with torch.no_grad():
                net(one, memories)

        calls = {"train": training_step(cfg, task, [(text[:, :-1], text[:, 1:])]), "infer": infer}
        m = cfg.model
        candidates.append(
            Candidate(f"{name} ({m.n_layer} x {m.d_model})", parameter_count(net), calls, tag)
        )
    g2, g4 = candidates[0].name, candidates[1].name
    targets = {(g2, "train"): ">= 1.0", (g4, "train"): ">= 1.2"}
    metrics = [Metric("train", "tok/s", streams * segment,
                      f"{streams} x {segment}, memory {segment}"),
               Metric("infer", "tok/s", segment, f"1 x {segment}, memory {segment}")]  # fmt: skip
    return Group("charlm", metrics, candidates, targets)


GROUPS: dict[str, Callable[[Settings], Group]] = {
    "pru_ptb": lambda s: pru_layer(s, "ptb"),
    "pru_wt2": lambda s: pru_layer(s, "wikitext2"),
    "awd_ptb": awd,
    "mt_iwslt": mt_iwslt,
    "mt_demo": mt_demo,
    "lm_pydoc": lm_pydoc,
    "charlm": charlm,
}


# -- timing and reporting -----------------------------------------------------------------------


def measure(group: Group, repeats: int, device: torch.device) -> dict[tuple[str, str], float]:
    """Median seconds of each (candidate, metric) call, interleaved round-robin after a warm-up."""
    for metric in group.metrics:
        for candidate in group.candidates:
            candidate.calls[metric.name]()
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for metric in group.metrics:
            for candidate in group.candidates:
                seconds = run_once(candidate.calls[metric.name], device)
                samples.setdefault((candidate.name, metric.name), []).append(seconds)
    return {key: statistics.median(values) for key, values in samples.items()}


def meets(ratio: float, target: str | None) -> bool | None:
    if target is None:
        return None
    op, value = target.split()
    return ratio >= float(value) if op == ">=" else ratio <= float(value)


def rows_of(group: Group, seconds: dict[tuple[str, str], float]) -> Iterator[dict]:
    baseline = group.candidates[-1]
    for candidate in group.candidates[:-1]:
        for metric in group.metrics:
            a, b = seconds[(candidate.name, metric.name)], seconds[(baseline.name, metric.name)]
            if metric.unit == "ms/step":
                values = (1e3 * a / metric.per_call, 1e3 * b / metric.per_call)
                ratio = a / b  # step time: < 1 is faster
            else:
                values = (metric.per_call / a, metric.per_call / b)
                ratio = b / a  # throughput: > 1 is faster
            target = group.targets.get((candidate.name, metric.name))
            yield {
                "pair": f"{group.name}_{candidate.tag}" if candidate.tag else group.name,
                "metric": metric.name,
                "a": candidate.name,
                "b": baseline.name,
                "a_params": candidate.params,
                "b_params": baseline.params,
                "unit": metric.unit,
                "a_value": round(values[0], 2),
                "b_value": round(values[1], 2),
                "ratio": round(ratio, 3),
                "ratio_of": "step time" if metric.unit == "ms/step" else "throughput",
                "target": target,
                "meets_target": meets(ratio, target),
                "setting": metric.setting,
            }


def machine(args: argparse.Namespace) -> dict:
    """The facts every JSON line carries. On the CPU, whether the project's C++ kernels are built
    (the build is tried here, before any timing) and ``LIGHTNETS_CPU_KERNELS``'s mode."""
    cuda = args.device == "cuda"
    return {
        "device": torch.cuda.get_device_name() if cuda else args.device,
        "cpu": cpu_name(),
        "processor": platform.processor(),
        "cpu_paths": None if cuda else cpu_path_mode(),
        "cpu_kernels": None if cuda else cpu_path_mode() != "0" and cpu_kernels(),
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def table(rows: list[dict]) -> str:
    header = ["pair", "metric", "A", "B", "A params", "B params", "A", "B", "unit", "ratio",
              "target", "met"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        met = {None: "", True: "yes", False: "no"}[r["meets_target"]]
        ratio = f"{r['ratio']:.2f}" + (" (A/B time)" if r["ratio_of"] == "step time" else "")
        cells = [r["pair"], r["metric"], r["a"], r["b"], f"{r['a_params']:,}",
                 f"{r['b_params']:,}", f"{r['a_value']:,.1f}", f"{r['b_value']:,.1f}", r["unit"],
                 ratio, r["target"] or "", met]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None, help="samples (default 7, quick 2)")
    parser.add_argument("--only", default="", help="run the groups whose name has this substring")
    parser.add_argument("--beam-sentences", type=int, default=8)
    parser.add_argument("--dyn-segments", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON lines here")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 7
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    names = [name for name in GROUPS if args.only in name]
    if not names:
        parser.error(f"--only {args.only!r} matches none of {list(GROUPS)}")
    torch.set_num_threads(args.threads)
    # the tasks log through a Trainer; here there is none, and their steps run without it
    warnings.filterwarnings("ignore", message=r"You are trying to `self.log\(\)`")
    settings = Settings(torch.device(args.device), args.quick, args.beam_sentences,
                        args.dyn_segments)  # fmt: skip

    facts = machine(args)
    print(f"{facts['device']} ({facts['cpu']}), {facts['threads']} threads, torch "
          f"{facts['torch']}, CPU kernels {facts['cpu_kernels']} (mode {facts['cpu_paths']}), "
          f"median of {args.repeats}, {facts['date']}", flush=True)  # fmt: skip
    if args.json is not None:
        args.json.write_text("")
    rows: list[dict] = []
    for name in names:
        torch.manual_seed(0)
        group = GROUPS[name](settings)
        for candidate in group.candidates:
            print(f"{name}: {candidate.name}: {candidate.params:,} params", flush=True)
        measured = list(rows_of(group, measure(group, args.repeats, settings.device)))
        del group  # the next group's models in its place
        # each group's lines as soon as it is measured: a run cut short keeps them
        lines = [json.dumps({**row, **facts}) for row in measured]
        print("\n".join(lines), flush=True)
        if args.json is not None:
            with args.json.open("a") as out:
                out.write("\n".join(lines) + "\n")
        rows += measured
    print()
    print(table(rows))
    bad = [r["pair"] for r in rows if not math.isfinite(r["ratio"]) or r["ratio"] <= 0]
    if bad:
        raise SystemExit(f"no finite positive ratio for {bad}")


if __name__ == "__main__":
    main()
