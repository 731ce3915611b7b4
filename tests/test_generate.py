"""Text generation: the algorithms on a hand-made Markov "network" (exact outputs), and the
``generate.py`` entry point on small untrained checkpoints: once as a subprocess (the command line
a user types), otherwise its ``generate`` function in this process (the same code, without the
seconds of start-up a subprocess costs)."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from src.build import build_task
from src.commands.generate import generate, last_word
from src.datamodules.awd_lm import ptb_style
from src.datamodules.dictionary import EOS_ID
from src.datamodules.word_corpus import EOS, UNK
from src.datamodules.word_lm import decode_words
from src.decoding.generation import (
    complete_words,
    complete_words_batch,
    decode,
    draw,
    encode,
    read_context,
    sample,
    sample_recurrent,
    sample_windowed,
    symbol_mask,
    vocabulary_masks,
)
from src.decoding.word_completion import spread, word_completion, word_spans
from src.utils.errors import InputFileError, UsageError
from tests.conftest import ROOT, compose_config

# symbols of the toy vocabulary: id 0 is a space (the only word boundary), then a, b, c
TOY_SYMBOLS = [ord(" "), ord("a"), ord("b"), ord("c")]
# P(next | last) of the toy Markov chain, rows by the last id (" ", a, b, c)
TOY_TRANSITIONS = torch.tensor(
    [
        [0.0, 0.5, 0.3, 0.2],
        [0.6, 0.0, 0.4, 0.0],
        [0.9, 0.1, 0.0, 0.0],
        [1.0, 0.0, 0.0, 0.0],
    ]
)


class MarkovNet(nn.Module):
    """Logits ``log table[last token]``; the memory holds the past token ids; records each call's
    segment length and memory length."""

    def __init__(self, table: Tensor, mem_len: int = 4) -> None:
        super().__init__()
        self.log_table = nn.Parameter(table.log(), requires_grad=False)  # (V, V)
        self.mem_len = mem_len
        self.calls: list[tuple[int, int]] = []

    def forward(
        self, tokens: Tensor, memories: list[Tensor] | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        self.calls.append((tokens.shape[1], 0 if memories is None else memories[0].shape[1]))
        h = tokens.float().unsqueeze(-1)  # (B, T, 1)
        new = h if memories is None else torch.cat([memories[0], h], 1)
        return self.log_table[tokens], [new[:, -self.mem_len :]]  # (B, T, V)


def constant_table(preferred: int, vocab: int = 4) -> Tensor:
    """Every row prefers ``preferred`` (probability 0.7), the rest share 0.3."""
    table = torch.full((vocab, vocab), 0.3 / (vocab - 1))
    table[:, preferred] = 0.7
    return table


# -- the algorithms ---------------------------------------------------------------------------
def test_read_context_feeds_segments_and_carries_memories() -> None:
    net = MarkovNet(TOY_TRANSITIONS, mem_len=4)
    logits, memories = read_context(
        net, torch.tensor([[1, 2, 0, 1, 2, 0, 3, 0, 1, 2]]), segment_len=4
    )
    assert net.calls == [(4, 0), (4, 4), (2, 4)]
    assert torch.equal(logits, TOY_TRANSITIONS[2].log()[None])  # after the last id, 2
    assert memories[0].flatten().tolist() == [3.0, 0.0, 1.0, 2.0]  # the last mem_len ids


def test_sample_top1_follows_the_preferred_symbol_one_position_per_call() -> None:
    net = MarkovNet(constant_table(preferred=3))
    out = sample(net, torch.tensor([[0, 1, 2]]), 5, segment_len=2, top_k=1)
    assert out.tolist() == [[3, 3, 3, 3, 3]]
    # the prompt in segments of 2, then one call per new symbol except the last (linear in length)
    assert [length for length, _ in net.calls] == [2, 1, 1, 1, 1, 1]


def test_sample_respects_allowed_and_top_k() -> None:
    net = MarkovNet(torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(4, 4))
    allowed = torch.tensor([True, True, True, False])
    out = sample(
        net,
        torch.tensor([[0]]),
        50,
        segment_len=4,
        top_k=2,
        allowed=allowed,
        generator=torch.Generator().manual_seed(0),
    )
    # 3 is not allowed; of the rest, top-2 keeps 2 and 1
    assert set(out.flatten().tolist()) == {1, 2}


def test_sample_is_reproducible_and_zero_length() -> None:
    prompt = torch.tensor([[1, 2]])
    draws = [
        sample(
            MarkovNet(TOY_TRANSITIONS),
            prompt,
            30,
            segment_len=4,
            generator=torch.Generator().manual_seed(7),
        )
        for _ in range(2)
    ]
    assert torch.equal(draws[0], draws[1])
    # every draw is a transition the chain allows
    ids = [2, *draws[0][0].tolist()]
    assert all(TOY_TRANSITIONS[a, b] > 0 for a, b in zip(ids, ids[1:]))
    assert sample(MarkovNet(TOY_TRANSITIONS), prompt, 0, segment_len=4).shape == (1, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"num_symbols": -1}, "num_symbols"),
    ],
)
def test_sample_rejects_bad_settings(kwargs: dict, message: str) -> None:
    args = {"num_symbols": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        sample(
            MarkovNet(TOY_TRANSITIONS),
            torch.tensor([[0]]),
            args.pop("num_symbols"),
            segment_len=4,
            **args,
        )


def test_generation_needs_memories() -> None:
    with pytest.raises(ValueError, match="mem_len"):
        read_context(MarkovNet(TOY_TRANSITIONS, mem_len=0), torch.tensor([[0]]), segment_len=4)


def test_complete_words_ranks_exact_word_probabilities() -> None:
    boundary = torch.tensor([True, False, False, False])
    words = complete_words(
        MarkovNet(TOY_TRANSITIONS),
        torch.tensor([[1, 0]]),
        boundary,
        segment_len=4,
        num_words=4,
        max_word_len=3,
        beam_size=8,
    )
    # P(word, then a space | a space): a .5*.6, b .3*.9, c .2*1, ab .5*.4*.9
    assert [decode(path, TOY_SYMBOLS) for path, _ in words] == ["a", "b", "c", "ab"]
    assert [score for _, score in words] == pytest.approx(
        [math.log(p) for p in (0.30, 0.27, 0.20, 0.18)], abs=1e-6
    )


def test_complete_words_empty_continuation_and_length_limit() -> None:
    boundary = torch.tensor([True, False, False, False])
    # after "a": the word may already end (.6), or continue with b (.4 * .9)
    words = complete_words(
        MarkovNet(TOY_TRANSITIONS),
        torch.tensor([[0, 1]]),
        boundary,
        segment_len=4,
        num_words=2,
        max_word_len=1,
        allow_empty=True,
    )
    assert [(decode(path, TOY_SYMBOLS), round(math.exp(score), 6)) for path, score in words] == [
        ("", 0.6),
        ("b", 0.36),
    ]
    # a chain that never ends a word within max_word_len finds nothing
    no_space = torch.tensor([0.0, 0.5, 0.5, 0.0]).expand(4, 4)
    never = complete_words(
        MarkovNet(no_space),
        torch.tensor([[0]]),
        boundary,
        segment_len=4,
        num_words=3,
        max_word_len=2,
    )
    assert never == []
    with pytest.raises(ValueError, match="boundary"):
        complete_words(
            MarkovNet(no_space),
            torch.tensor([[0]]),
            boundary,
            segment_len=4,
            allowed=torch.tensor([False, True, True, True]),
        )


def test_top_p_keeps_the_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    generator = torch.Generator().manual_seed(0)
    drawn = {int(draw(probs.log(), top_p=0.75, generator=generator)) for _ in range(300)}
    assert drawn == {0, 1}  # 0.5 alone is short of 0.75; 0.5 + 0.3 reaches it
    drawn = {int(draw(probs.log(), top_p=0.8, generator=generator)) for _ in range(300)}
    assert drawn == {0, 1}  # the mass before id 2 (0.8) already reaches top_p
    assert {int(draw(probs.log(), top_p=0.81, generator=generator)) for _ in range(300)} == {
        0,
        1,
        2,
    }
    assert int(draw(probs.log(), top_p=0.01)) == 0  # the most probable id is always kept
    with pytest.raises(ValueError, match="top_p"):
        draw(probs.log(), top_p=0.0)


def test_sample_stops_each_row_at_its_sentence_end() -> None:
    # from a: b (.4) then a space (.9) or a (.1); the space is the sentence end here
    stop = torch.tensor([True, False, False, False])
    out = sample(
        MarkovNet(TOY_TRANSITIONS),
        torch.tensor([[1]]).expand(6, 1),
        40,
        segment_len=4,
        stop=stop,
        generator=torch.Generator().manual_seed(1),
    )
    assert out.shape[0] == 6 and out.shape[1] < 40  # every row ended well before the cap
    for row in out.tolist():
        end = row.index(0)  # the first stop symbol, then repeats of it
        assert all(s == 0 for s in row[end:]) and 0 not in row[:end]
    # greedy with stops: the most probable symbol after a is the space, at once
    assert sample(
        MarkovNet(TOY_TRANSITIONS), torch.tensor([[1]]), 5, segment_len=4, top_k=1, stop=stop
    ).tolist() == [[0]]
    assert symbol_mask(TOY_SYMBOLS, 6, lambda ch: ch in " b").tolist() == [
        True,
        False,
        True,
        False,
        False,
        False,
    ]


def test_word_completion_counts_ranks_against_exact_probabilities() -> None:
    # the toy chain's best words after a space: a (.30), b (.27), c (.20), ab (.18)
    boundary = torch.tensor([True, False, False, False])
    assert word_spans([True, False, False, True, False, True, False, False], 2) == [
        (1, 3)
    ]  # the run at the end is open
    assert word_spans([False, True, False, False, False, True], 1) == [(0, 1), (2, 5)]
    assert spread(list(range(10)), 4) == [0, 2, 5, 7] and spread([1, 2], None) == [1, 2]
    # prefix_len 1: " ab " (after " a": the empty continuation .6 beats "b" .36), " b ", " c "
    text = torch.tensor([0, 1, 2, 0, 2, 0, 3, 0, 1, 0])
    result = word_completion(
        MarkovNet(TOY_TRANSITIONS),
        text,
        boundary,
        segment_len=4,
        context_len=4,
        prefix_len=1,
        top=(1, 2),
        beam_size=4,
        max_word_len=3,
    )
    # words: ab (rank 2 after "a"), b (rank 1: "" .9), c (rank 1: "" 1.0), a (rank 1: "" .6)
    assert result.count == 4 and result.hits == {1: 3, 2: 4}
    metrics = result.as_metrics("test")
    assert metrics == {"test/word_top1": 0.75, "test/word_top2": 1.0, "test/word_count": 4.0}
    with pytest.raises(ValueError, match="beam_size"):
        word_completion(
            MarkovNet(TOY_TRANSITIONS),
            text,
            boundary,
            segment_len=4,
            context_len=4,
            top=(1, 20),
            beam_size=8,
        )


def test_complete_words_batch_equals_one_prefix_at_a_time() -> None:
    boundary = torch.tensor([True, False, False, False])
    prefixes = torch.tensor([[1, 0], [0, 1], [2, 2], [0, 3]])
    args = dict(segment_len=4, num_words=3, max_word_len=3, beam_size=3, allow_empty=True)
    batched = complete_words_batch(MarkovNet(TOY_TRANSITIONS), prefixes, boundary, **args)
    alone = [
        complete_words(MarkovNet(TOY_TRANSITIONS), p[None], boundary, **args) for p in prefixes
    ]
    assert [[path for path, _ in words] for words in batched] == [
        [path for path, _ in words] for words in alone
    ]
    for got, want in zip(batched, alone):
        assert [score for _, score in got] == pytest.approx([score for _, score in want], abs=1e-6)


def test_encode_decode_and_masks() -> None:
    assert encode("ab c", TOY_SYMBOLS) == [1, 2, 0, 3]
    assert decode([1, 2, 0, 3], TOY_SYMBOLS) == "ab c"
    with pytest.raises(ValueError, match=r"'d' \(U\+0064\), 'z' \(U\+007A\)"):
        encode("zad", TOY_SYMBOLS)
    allowed, boundary = vocabulary_masks([ord(c) for c in " a.\n"], 6)
    assert allowed.tolist() == [True, True, True, True, False, False]
    assert boundary.tolist() == [True, False, True, True, False, False]
    assert last_word("the quick bro") == "bro" and last_word("the end.") == ""


# -- the entry point --------------------------------------------------------------------------
MODEL_OVERRIDES = [
    "experiment=char_lm/demo", "model.n_layer=1", "model.d_model=32", "model.n_head=2",
    "model.d_inner=64", "model.mem_len=16", "data.tgt_len=16",
]  # fmt: skip
PROMPT = "The default value of the argument"  # 33 characters: three segments of at most 16


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[str], nn.Module, list[int]]:
    """An untrained small Group-Transformer checkpoint, the overrides to rebuild it, its network
    and the corpus's symbols (the vocabulary cached under a temporary data.root)."""
    tmp = tmp_path_factory.mktemp("generate")
    overrides = [*MODEL_OVERRIDES, f"data.root={tmp / 'data'}"]
    cfg = compose_config("train", overrides, tmp / "run")
    datamodule, task = build_task(cfg)
    path = tmp / "model.ckpt"
    torch.save({"state_dict": task.state_dict()}, path)
    datamodule.setup("fit")
    return (
        path,
        [*overrides, f"paths.log_dir={tmp / 'logs'}", f"ckpt_path={path}"],
        task.net.eval(),
        datamodule.symbols,
    )


def run_generate(overrides: list[str], *extra: str) -> str:
    """stdout of ``python generate.py *overrides *extra`` from the repository root."""
    command = [sys.executable, str(ROOT / "generate.py"), *overrides, *extra]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"generate.py failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def generate_here(capsys: pytest.CaptureFixture, overrides: list[str], *extra: str) -> str:
    """What ``generate.py *overrides *extra`` writes to stdout, run in this process."""
    capsys.readouterr()  # drop what earlier steps printed
    generate(compose_config("generate", [*overrides, *extra]))
    return capsys.readouterr().out


def test_sample_mode_prints_prompt_and_continuation(checkpoint, capsys) -> None:
    _, overrides, _, symbols = checkpoint
    args = [f"prompt='{PROMPT}'", "max_new_chars=40", "temperature=0.8", "top_k=10", "seed=3"]
    out = run_generate(overrides, *args)
    assert out.startswith(PROMPT) and out.endswith("\n")
    continuation = out[len(PROMPT) : -1]
    assert len(continuation) == 40
    assert set(continuation) <= {chr(code) for code in symbols}
    assert generate_here(capsys, overrides, *args) == out  # same seed, same text


def test_top_k_1_is_greedy_decoding(checkpoint, capsys) -> None:
    _, overrides, net, symbols = checkpoint
    out = generate_here(capsys, overrides, f"prompt='{PROMPT}'", "max_new_chars=25", "top_k=1")
    # greedy decoding by hand: the prompt in segments of tgt_len = 16 with memories, then argmax
    ids = torch.tensor([encode(PROMPT, symbols)])
    memories = None
    with torch.no_grad():
        for begin in range(0, ids.shape[1], 16):
            logits, memories = net(ids[:, begin : begin + 16], memories)
        greedy = []
        for _ in range(25):
            greedy.append(int(logits[0, -1, : len(symbols)].argmax()))
            logits, memories = net(torch.tensor([[greedy[-1]]]), memories)
    assert out == PROMPT + decode(greedy, symbols) + "\n"


def test_words_mode_prints_ranked_words(checkpoint, capsys) -> None:
    _, overrides, _, _ = checkpoint
    out = generate_here(
        capsys, overrides, "prompt='The default val'", "mode=words", "num_words=4", "max_word_len=6"
    )
    header, *rows = out.splitlines()
    assert header.split() == ["rank", "word", "log_prob"]
    assert len(rows) == 4
    ranks, words, scores = zip(*(row.split() for row in rows))
    assert [int(r) for r in ranks] == [1, 2, 3, 4]
    assert all(word.startswith("val") and len(word) <= len("val") + 6 for word in words)
    assert len(set(words)) == 4
    values = [float(s) for s in scores]
    assert all(v <= 0 for v in values) and values == sorted(values, reverse=True)


def test_eval_word_completion_scores_the_split(checkpoint, tmp_path) -> None:
    """eval.py word_completion=true on a character model: the top-k fractions of the words asked."""
    from src.commands.eval import evaluate

    path, overrides, _, _ = checkpoint
    options = ["word_completion=true", "word_completion_options.max_words=6",
               "word_completion_options.max_word_len=6", "word_completion_options.beam_size=20",
               "trainer=cpu", "logger=csv", "data.eval_tgt_len=16"]  # fmt: skip
    eval_overrides = [o for o in overrides if not o.startswith("paths.")]
    metrics = evaluate(compose_config("eval", [*eval_overrides, *options], tmp_path / "eval"))[
        "metrics"
    ]
    assert metrics["test/word_count"] == 6.0
    assert (
        0.0
        <= metrics["test/word_top1"]
        <= metrics["test/word_top5"]
        <= metrics["test/word_top20"]
        <= 1.0
    )
    assert math.isfinite(metrics["test/bpc"])


def test_sentences_mode_prints_endings_of_the_last_sentence(checkpoint, capsys) -> None:
    _, overrides, _, symbols = checkpoint
    prompt = "First one. The default val"
    out = generate_here(
        capsys,
        overrides,
        f"prompt='{prompt}'",
        "mode=sentences",
        "num_samples=3",
        "max_new_chars=30",
        "top_p=0.9",
        "temperature=1.5",
        "seed=5",
    )
    lines = out.splitlines()
    assert len(lines) == 3
    for number, line in enumerate(lines, 1):
        head, ending = line[:3], line[5 + len("The default val") :]
        assert int(head) == number and line[5:].startswith("The default val")
        assert len(ending) <= 30 and set(ending) <= {chr(code) for code in symbols}
        stops = [i for i, ch in enumerate(ending) if ch in ".!?"]
        assert stops in ([], [len(ending) - 1])  # at most one sentence end, the last character


# -- word language models ---------------------------------------------------------------------
WORD_PROMPT = "The default value of the"


@pytest.fixture(scope="module")
def word_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], nn.Module, Any]:
    """An untrained small DeLighT word LM on pydoc_words, the overrides to rebuild it, its network
    and the corpus's dictionary."""
    tmp = tmp_path_factory.mktemp("generate_words")
    overrides = [
        "experiment=delight_lm/demo",
        "data.tokens_per_sample=16",
        "data.eval_context_window=8",
        f"data.root={tmp / 'data'}",
    ]
    cfg = compose_config("train", overrides, tmp / "run")
    datamodule, task = build_task(cfg)
    path = tmp / "model.ckpt"
    torch.save({"state_dict": task.state_dict()}, path)
    datamodule.setup("fit")
    return (
        [*overrides, f"paths.log_dir={tmp / 'logs'}", f"ckpt_path={path}"],
        task.net.eval(),
        datamodule.dictionary,
    )


def test_word_model_top_1_is_greedy_over_the_training_context(word_checkpoint, capsys) -> None:
    overrides, net, dictionary = word_checkpoint
    out = generate_here(
        capsys,
        overrides,
        f"prompt='{WORD_PROMPT}'",
        "max_new_words=12",
        "top_k=1",
        "stop_at_eos=false",
    )
    assert out.startswith(WORD_PROMPT + " ")
    # by hand: </s> + the prompt's words, each step the argmax over the last 16 tokens, specials
    # (but </s>) and padding entries never chosen
    tokens = [EOS_ID, *(dictionary.index(w) for w in WORD_PROMPT.split())]
    banned = torch.tensor(
        [s in ("<s>", "<pad>", "<unk>") or s.startswith("madeupword") for s in dictionary.symbols]
    )
    with torch.no_grad():
        for _ in range(12):
            scores = net.log_prob(torch.tensor([tokens[-16:]]))[0, -1].masked_fill(
                banned, -math.inf
            )
            tokens.append(int(scores.argmax()))
    assert out == f"{WORD_PROMPT} {decode_words(dictionary, tokens[-12:])}\n"
    with pytest.raises(ValueError, match="mode=sample only"):
        generate_here(capsys, overrides, f"prompt='{WORD_PROMPT}'", "mode=words")


# -- stopping at the end of a sentence ---------------------------------------------------------
class SumNet(nn.Module):
    """Prefers id (sum of every id read so far) % V; its state is that sum, so a sampler that feeds
    one new id a call follows the chain only when it carries the state (AWD interface: ``.logits``,
    ``.hidden``; word-model interface: ``log_prob`` over a window that holds the whole text)."""

    def __init__(self, vocab: int = 4) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens: Tensor, hidden: Tensor | None = None) -> Any:
        start = tokens.new_zeros(tokens.shape[0]) if hidden is None else hidden  # (B,)
        sums = start[:, None] + tokens.cumsum(1)  # (B, T)
        logits = 5.0 * nn.functional.one_hot(sums % self.vocab, self.vocab).float()  # (B, T, V)
        return SimpleNamespace(logits=logits, hidden=sums[:, -1])

    def log_prob(self, tokens: Tensor) -> Tensor:
        return self(tokens).logits.log_softmax(-1)


# id 0 ends a sentence; from [1, 1] (sum 2) the chain is 2, 0; from [1, 2] (sum 3) it is 3, 2, 0
SUM_PROMPT = torch.tensor([[1, 1], [1, 2]])


def test_awd_sample_carries_the_state_and_stops_each_row_at_the_end_of_sentence() -> None:
    out = sample_recurrent(SumNet(), SUM_PROMPT, 10, top_k=1, stop=0)
    assert out.tolist() == [
        [2, 0, 0],
        [3, 2, 0],
    ]  # rows that stopped repeat the stop id; then it ends
    assert sample_recurrent(SumNet(), SUM_PROMPT, 5, top_k=1).tolist() == [
        [2, 0, 0, 0, 0],
        [3, 2, 0, 0, 0],
    ]
    assert sample_recurrent(SumNet(), SUM_PROMPT, 0).shape == (2, 0)


def test_word_sample_stops_each_row_at_the_end_of_sentence() -> None:
    out = sample_windowed(SumNet(), SUM_PROMPT, 10, context=64, top_k=1, stop=0)
    assert out.tolist() == [[2, 0, 0], [3, 2, 0]]


# -- AWD language models (PRU, LSTM) ------------------------------------------------------------
@pytest.fixture(scope="module", params=["pru", "lstm"])
def awd_checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[str], nn.Module, Any]:
    """An untrained small AWD language model (``experiment=pru_lm/demo`` shrunk; PRU or LSTM layers)
    on pydoc_ptb, the overrides to rebuild it, its network and the corpus's vocabulary."""
    tmp = tmp_path_factory.mktemp(f"generate_{request.param}")
    overrides = [
        "experiment=pru_lm/demo", f"model.rnn={request.param}", "model.embedding_dim=16",
        "model.hidden_size=32", f"data.root={tmp / 'data'}",
    ]  # fmt: skip
    cfg = compose_config("train", overrides, tmp / "run")
    datamodule, task = build_task(cfg)
    path = tmp / "model.ckpt"
    torch.save({"state_dict": task.state_dict()}, path)
    datamodule.setup("fit")
    return (
        [*overrides, f"paths.log_dir={tmp / 'logs'}", f"ckpt_path={path}"],
        task.net.eval(),
        datamodule.dictionary,
    )


def awd_greedy(net: nn.Module, vocabulary: Any, num_words: int) -> list[int]:
    """Greedy decoding by hand: ``<eos>`` and the prompt's words (in pydoc_ptb's PTB style) read
    from zero state, then each step the argmax but ``<unk>``, fed alone with the state carried."""
    tokens = torch.tensor([[vocabulary.index(EOS), *map(vocabulary.index, ptb_style(WORD_PROMPT))]])
    greedy: list[int] = []
    with torch.no_grad():
        out = net(tokens)
        for _ in range(num_words):
            logits = out.logits[0, -1].clone()
            logits[vocabulary.index(UNK)] = -math.inf
            greedy.append(int(logits.argmax()))
            out = net(torch.tensor([[greedy[-1]]]), out.hidden)
    return greedy


def test_awd_model_top_1_is_greedy_with_the_state_carried(awd_checkpoint, capsys) -> None:
    overrides, net, vocabulary = awd_checkpoint
    args = [f"prompt='{WORD_PROMPT}'", "max_new_words=12", "top_k=1", "stop_at_eos=false"]
    out = generate_here(capsys, overrides, *args)
    greedy = awd_greedy(net, vocabulary, 12)
    assert out == f"{WORD_PROMPT} {vocabulary.decode(greedy)}\n"
    assert generate_here(capsys, overrides, *args) == out  # deterministic
    # stopping at the end of sentence (the default) keeps the words before the first <eos>
    stop = greedy.index(vocabulary.index(EOS)) if vocabulary.index(EOS) in greedy else len(greedy)
    stopped = generate_here(
        capsys, overrides, f"prompt='{WORD_PROMPT}'", "max_new_words=12", "top_k=1"
    )
    assert (
        stopped == " ".join([WORD_PROMPT, *(vocabulary.symbols[i] for i in greedy[:stop])]) + "\n"
    )


def test_awd_model_samples_the_requested_number_of_vocabulary_words(awd_checkpoint, capsys) -> None:
    overrides, _, vocabulary = awd_checkpoint
    args = [
        f"prompt='{WORD_PROMPT}'",
        "max_new_words=30",
        "temperature=1.5",
        "seed=3",
        "stop_at_eos=false",
    ]
    out = generate_here(capsys, overrides, *args)
    assert out.startswith(WORD_PROMPT + " ") and out.endswith("\n")
    continuation = out[len(WORD_PROMPT) + 1 : -1]
    words = continuation.split()
    # every <eos> is a line break, every other word printed: 30 in all, none of them <unk>
    assert len(words) + continuation.count("\n") == 30
    assert set(words) <= set(vocabulary.symbols) - {UNK, EOS}
    assert generate_here(capsys, overrides, *args) == out  # same seed, same words


def test_awd_model_stops_at_a_forced_end_of_sentence(awd_checkpoint, capsys, tmp_path) -> None:
    overrides, net, vocabulary = awd_checkpoint
    state = {f"net.{k}": v.clone() for k, v in net.state_dict().items()}
    state["net.decoder.bias"][vocabulary.index(EOS)] = 1e4  # <eos> is every step's argmax
    path = tmp_path / "eos.ckpt"
    torch.save({"state_dict": state}, path)
    forced = [*overrides[:-1], f"ckpt_path={path}", f"prompt='{WORD_PROMPT}'", "max_new_words=12"]
    assert generate_here(capsys, forced) == f"{WORD_PROMPT}\n"
    assert generate_here(capsys, forced, "stop_at_eos=false").count("\n") == 12 + 1


def test_word_level_group_transformer_samples_dictionary_words(tmp_path, capsys) -> None:
    """A word-level Group-Transformer (adaptive softmax, memories carried) continues the prompt by
    dictionary words; greedy decoding is the argmax of its log-probabilities."""
    overrides = ["experiment=group_transformer_lm/demo", "model.n_layer=1", "model.d_model=32",
                 "model.d_inner=64", "model.mem_len=8", "data.tgt_len=8",
                 f"data.root={tmp_path / 'data'}"]  # fmt: skip
    cfg = compose_config("train", overrides, tmp_path / "run")
    datamodule, task = build_task(cfg)
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": task.state_dict()}, path)
    args = [
        *overrides,
        f"ckpt_path={path}",
        f"prompt='{WORD_PROMPT}'",
        "max_new_words=12",
        "stop_at_eos=false",
    ]
    out = generate_here(capsys, args, "top_k=1")
    assert out.startswith(WORD_PROMPT + " ")
    new = out[len(WORD_PROMPT) + 1 :].split()
    assert 1 <= len(new) <= 12
    datamodule.setup("fit")
    words = set(datamodule.dictionary.symbols)
    assert all(word in words for word in new)
    # greedy by hand: the first new word is the argmax after </s> + the prompt
    ids = torch.tensor([[EOS_ID, *(datamodule.dictionary.index(w) for w in WORD_PROMPT.split())]])
    with torch.no_grad():
        log_probs, _ = task.net.eval()(ids, None)
    allowed = [
        not (s in ("<s>", "<pad>", "<unk>") or s.startswith("madeupword"))
        for s in datamodule.dictionary.symbols
    ]
    scores = log_probs[0, -1].masked_fill(~torch.tensor(allowed), float("-inf"))
    assert (
        new[0] == datamodule.dictionary.symbols[int(scores.argmax())]
        or int(scores.argmax()) == EOS_ID
    )


# -- where the prompt comes from, and characters outside the vocabulary --------------------------
def test_prompt_file_and_stdin_give_the_prompt(checkpoint, capsys, tmp_path, monkeypatch) -> None:
    _, overrides, _, _ = checkpoint
    args = ["max_new_chars=20", "top_k=1"]
    expected = generate_here(capsys, overrides, f"prompt='{PROMPT}'", *args)
    path = tmp_path / "prompt.txt"
    path.write_text(PROMPT + "\n", encoding="utf-8")  # the final line break is not part of it
    assert generate_here(capsys, overrides, f"prompt_file={path}", *args) == expected
    path.write_bytes(PROMPT.encode("latin-1") + b"\r\n")
    assert (
        generate_here(capsys, overrides, f"prompt_file={path}", "encoding=latin-1", *args)
        == expected
    )
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{PROMPT}\n".encode()), encoding="ascii")
    )
    assert generate_here(capsys, overrides, "prompt_file=-", *args) == expected


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (["prompt=x", "prompt_file=p.txt"], UsageError,
         r"^prompt= and prompt_file= are both given; pass one of them$"),
        (["prompt_file=/no/such/prompt.txt"], InputFileError,
         r"^prompt_file=/no/such/prompt.txt: no such file$"),
        ([], UsageError,
         r"^no prompt: pass prompt='some text' \(quoted for Hydra .*'prompt=\"日本 €\"'\), "
         r"or prompt_file="),
        (["prompt='ab 日本 €'"], UsageError,
         r"^the prompt has characters not in the model's vocabulary \(\d+ symbols\): "
         r"'€' \(U\+20AC\), '日' \(U\+65E5\), '本' \(U\+672C\); remove or replace them$"),
    ],
)  # fmt: skip
def test_prompt_mistakes_are_refused_with_the_fix(checkpoint, capsys, args, error, message) -> None:
    _, overrides, _, _ = checkpoint
    with pytest.raises(error, match=message):
        generate_here(capsys, overrides, *args)


def test_a_non_ascii_prompt_quoted_for_hydra_reaches_the_vocabulary_check(checkpoint) -> None:
    """The command line a user types: Hydra's quotes carry spaces and non-ASCII characters through;
    the characters the model lacks end the run with one error line and exit status 2."""
    _, overrides, _, symbols = checkpoint
    command = [sys.executable, str(ROOT / "generate.py"), *overrides, 'prompt="日本 €"']
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "error: the prompt has characters not in the model's vocabulary "
        f"({len(symbols)} symbols): '€' (U+20AC), '日' (U+65E5), '本' (U+672C); "
        "remove or replace them"
    )
