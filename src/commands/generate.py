"""Generate text with a language model: ``python generate.py ckpt_path=... prompt='...'``.

Character models (Transformer-XL, Group-Transformer; data pydoc_chars, enwik8, text8), word models
(DeLighT LM, Transformer LM; wikitext103, pydoc_words), word-level Transformer-XL and
Group-Transformer (wikitext103_segments, pydoc_words_segments) and AWD word models (PRU, LSTM; ptb,
wikitext2, pydoc_ptb) are served; word models support ``mode=sample`` only. A word model reads the
prompt's whitespace-separated words after an end of sentence (as every corpus line starts; the
pydoc_ptb demo's words in its PTB style: lower case, numbers as N, punctuation dropped), adds up to
``max_new_words`` words joined by spaces, carrying the AWD models' recurrent state or the
segment models' memories, and stops at
the end-of-sentence token unless ``stop_at_eos=false`` (then each end of sentence is a line break).

The datamodule, network and task are rebuilt from the checkpoint's run record (command-line
overrides still win) and its ``state_dict`` is loaded into the task; without ``ckpt_path`` the run
is refused unless ``allow_random=true``. The prompt is encoded with the datamodule's vocabulary
(built or read from its cache under ``data.root``) and read in segments of the training
``tgt_len``, carrying the memories.
Then, by ``mode``:

- ``sample``: ``max_new_chars`` characters drawn one at a time with ``temperature``, ``top_k`` and
  ``top_p``; stdout gets the prompt followed by the continuation;
- ``sentences`` (sentence completion, Group-Transformer Table 5): ``num_samples`` independent
  samples, each ending at the first sentence end (``. ! ?``) or after ``max_new_chars``
  characters; stdout gets one numbered line per sample, the prompt's last sentence followed by its
  ending, line breaks shown as spaces;
- ``words`` (word completion, Group-Transformer Table 4): beam search ranks whole-word
  continuations of the prompt's last (partial) word by log-probability; stdout gets a table of
  the ``num_words`` best words (the partial word plus its continuation) and their log-probabilities.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig, open_dict

from src.build import build_from_checkpoint, check_served
from src.datamodules.awd_lm import EOS, AWDLMDataModule, PydocPTBDataModule, ptb_style
from src.datamodules.char_lm import CharLMDataModule
from src.datamodules.dictionary import EOS_ID, SPECIALS
from src.datamodules.text_files import decode_text, read_text
from src.datamodules.word_lm import WordLMDataModule, decode_words
from src.datamodules.word_segments import WordSegmentsDataModule
from src.decoding.generation import (
    complete_words,
    decode,
    encode,
    is_boundary,
    is_sentence_end,
    missing_symbols,
    sample,
    sample_recurrent,
    sample_windowed,
    symbol_mask,
    vocabulary_masks,
)
from src.utils.errors import InputFileError, UsageError, WrongRunError

log = logging.getLogger("generate")  # the command's name in its log lines

MODES = ("sample", "sentences", "words")


def last_word(text: str) -> str:
    """The trailing run of non-boundary characters of ``text`` (empty if it ends a word)."""
    start = len(text)
    while start > 0 and not is_boundary(text[start - 1]):
        start -= 1
    return text[start:]


def last_sentence(text: str) -> str:
    """The part of ``text`` after its last sentence end (the sentence a completion finishes)."""
    start = len(text)
    while start > 0 and not is_sentence_end(text[start - 1]):
        start -= 1
    return text[start:].lstrip()


def until_sentence_end(text: str) -> str:
    """``text`` up to and including its first sentence end (all of it when it has none)."""
    end = next((i for i, ch in enumerate(text) if is_sentence_end(ch)), len(text) - 1)
    return text[: end + 1]


def read_prompt(cfg: DictConfig) -> str:
    """The text to continue: ``prompt=``, or ``prompt_file=`` read as ``encoding=`` (``-``:
    stdin) without its final line break."""
    prompt, path = cfg.get("prompt"), cfg.get("prompt_file")
    if prompt is not None and path is not None:
        raise UsageError("prompt= and prompt_file= are both given; pass one of them")
    if path is not None:
        if path == "-":
            # the bytes, not sys.stdin's text: that is decoded in the locale's encoding
            raw = sys.stdin.buffer.read()
            prompt = decode_text(raw, cfg.encoding, source="<stdin>", key="encoding")
        elif not Path(path).is_file():
            raise InputFileError(f"prompt_file={path}: no such file")
        else:
            prompt = read_text(path, cfg.encoding, key="encoding")
        prompt = prompt.removesuffix("\n").removesuffix("\r")
        if not prompt:
            raise UsageError(f"prompt_file={path} is empty; it holds the text to continue")
    if prompt is None:
        raise UsageError(
            "no prompt: pass prompt='some text' (quoted for Hydra when it has characters other "
            "than ASCII letters, digits and spaces: 'prompt=\"日本 €\"'), or "
            "prompt_file=<a text file>"
        )
    prompt = str(prompt)  # a prompt like 123 arrives as a number
    if not prompt:
        raise UsageError("prompt is empty; pass prompt='some text'")
    return prompt


def exported_language_model(path: str) -> torch.nn.Module:
    """The language model of an exported file, run by onnxruntime behind the eager network's
    interface (:mod:`src.export.runtime`)."""
    from src.export.metadata import exported_file
    from src.export.runtime import RUNTIMES, kind_of

    kind = kind_of(exported_file(path))
    if kind not in ("segment_lm", "awd_lm", "word_lm"):
        raise WrongRunError(
            f"generate.py runs exported language models; onnx={path} holds a {kind} graph"
        )
    return RUNTIMES[kind](exported_file(path))


def load_vocabulary(cfg: DictConfig, datamodule: L.LightningDataModule) -> None:
    """The datamodule's vocabulary: the one an exported file carries (``onnx=``: no corpus is
    read), else read from its cache under ``data.root`` (built there when missing)."""
    if cfg.get("onnx") is not None:
        from src.export.vocabulary import use_exported_vocabulary

        use_exported_vocabulary(datamodule, cfg.onnx)
    else:
        datamodule.setup("predict")


def generate(cfg: DictConfig) -> dict:
    """Run the configured mode on ``cfg.prompt``; returns what was written to stdout, as data."""
    if cfg.mode not in MODES:
        raise UsageError(f"mode must be one of {MODES}, got {cfg.mode!r}")
    prompt = read_prompt(cfg)
    if cfg.ckpt_path is None and cfg.get("onnx") is None and not cfg.allow_random:
        raise UsageError(
            "no weights: pass ckpt_path=<a language-model run's .ckpt> (its metrics.json names "
            "the best one); allow_random=true generates with the randomly initialised network"
        )
    datamodule, task = build_from_checkpoint(cfg)
    check_served("generate.py", cfg, datamodule, task)
    if cfg.get("onnx") is not None:
        task.net = exported_language_model(cfg.onnx)
        with open_dict(cfg):  # onnxruntime's CPU session reads and writes host memory
            cfg.device = "cpu"
    if isinstance(datamodule, WordSegmentsDataModule):
        return generate_segment_words(cfg, prompt, datamodule, task.net)
    if isinstance(datamodule, WordLMDataModule):
        return generate_words(cfg, prompt, datamodule, task.net)
    if isinstance(datamodule, AWDLMDataModule):
        return generate_stream_words(cfg, prompt, datamodule, task.net)
    if not isinstance(datamodule, CharLMDataModule):
        raise WrongRunError(
            f"generation needs a language model; {cfg.ckpt_path or 'the config'} is a "
            f"{type(datamodule).__name__} run (data: pydoc_chars, enwik8, text8, wikitext103, "
            "pydoc_words, ptb, wikitext2, pydoc_ptb)"
        )
    load_vocabulary(cfg, datamodule)
    symbols = datamodule.symbols
    missing = missing_symbols(prompt, symbols)
    if missing:
        # a character model has no unknown symbol to read them as
        raise UsageError(
            f"the prompt has characters not in the model's vocabulary ({len(symbols)} symbols): "
            f"{', '.join(missing)}; remove or replace them"
        )
    ids = encode(prompt, symbols)
    allowed, boundary = vocabulary_masks(symbols, datamodule.vocab_size)

    device = torch.device(cfg.device)
    net = task.net.to(device).eval()
    tokens = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    # the training segment length bounds one call (the position table holds tgt_len + mem_len)
    segment_len = datamodule.tgt_len
    log.info(
        "prompt: %d characters, segments of %d, mem_len %d", len(ids), segment_len, net.mem_len
    )
    with torch.no_grad():
        if cfg.mode in ("sample", "sentences"):
            generator = torch.Generator(device).manual_seed(cfg.seed)
            sentences = cfg.mode == "sentences"
            if sentences and cfg.num_samples < 1:
                raise UsageError(f"num_samples must be >= 1, got {cfg.num_samples}")
            new = sample(
                net,
                tokens.expand(cfg.num_samples if sentences else 1, -1),
                cfg.max_new_chars,
                segment_len=segment_len,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                allowed=allowed,
                stop=symbol_mask(symbols, datamodule.vocab_size, is_sentence_end)
                if sentences
                else None,
                generator=generator,
            )  # (S, n)
            if not sentences:
                continuation = decode(new[0].tolist(), symbols)
                sys.stdout.write(prompt + continuation + "\n")
                return {"mode": "sample", "prompt": prompt, "continuation": continuation}
            endings = [until_sentence_end(decode(row, symbols)) for row in new.tolist()]
            start = last_sentence(prompt)
            sys.stdout.write(
                "".join(
                    f"{i:>3}  {start}{ending}".replace("\n", " ") + "\n"
                    for i, ending in enumerate(endings, 1)
                )
            )
            return {"mode": "sentences", "prompt": prompt, "endings": endings}
        partial = last_word(prompt)
        found = complete_words(
            net,
            tokens,
            boundary,
            segment_len=segment_len,
            num_words=cfg.num_words,
            max_word_len=cfg.max_word_len,
            beam_size=cfg.beam_size,
            allowed=allowed,
            allow_empty=bool(partial),
        )
    words = [(partial + decode(path, symbols), score) for path, score in found]
    width = max(len("word"), *(len(word) for word, _ in words)) if words else len("word")
    rows = [f"rank  {'word':<{width}}  log_prob"]
    rows += [
        f"{rank:>4}  {word:<{width}}  {score:.4f}" for rank, (word, score) in enumerate(words, 1)
    ]
    sys.stdout.write("\n".join(rows) + "\n")
    if len(words) < cfg.num_words:
        log.warning(
            "found %d of %d words within max_word_len=%d",
            len(words),
            cfg.num_words,
            cfg.max_word_len,
        )
    return {"mode": "words", "prompt": prompt, "words": words}


def until_stop(ids: list[int], stop: int | None) -> list[int]:
    """``ids`` up to, not including, the first ``stop`` (all of them when ``stop`` is None)."""
    return ids[: ids.index(stop)] if stop in ids else ids


def write_continuation(prompt: str, continuation: str) -> dict:
    """Write the prompt and a word model's continuation to stdout, one space between them."""
    sys.stdout.write(f"{prompt} {continuation}\n" if continuation else f"{prompt}\n")
    return {"mode": "sample", "prompt": prompt, "continuation": continuation}


def generate_words(
    cfg: DictConfig, prompt: str, datamodule: WordLMDataModule, net: torch.nn.Module
) -> dict:
    """``mode=sample`` for a word language model: the prompt's whitespace words (after ``</s>``,
    as every corpus line starts) continued by up to ``max_new_words`` sampled words."""
    if cfg.mode != "sample":
        raise UsageError(
            f"word language models support mode=sample only (stop_at_eos=true ends the sentence), "
            f"got mode={cfg.mode}"
        )
    load_vocabulary(cfg, datamodule)
    dictionary = datamodule.dictionary
    words = prompt.split()
    unknown = [w for w in words if dictionary.index(w) == dictionary.index(SPECIALS[-1])]
    if unknown:
        log.warning("words outside the vocabulary read as <unk>: %s", ", ".join(unknown[:10]))
    device = torch.device(cfg.device)
    net = net.to(device).eval()
    tokens = torch.tensor(
        [[EOS_ID, *(dictionary.index(w) for w in words)]], device=device
    )  # (1, T)
    # never produce the specials but </s> (a line break), nor the dictionary's padding entries
    banned = torch.tensor(
        [s in SPECIALS[:2] + SPECIALS[3:] or s.startswith("madeupword") for s in dictionary.symbols]
    )
    stop = EOS_ID if cfg.stop_at_eos else None
    generator = torch.Generator(device).manual_seed(cfg.seed)
    new = sample_windowed(
        net,
        tokens,
        cfg.max_new_words,
        context=datamodule.tokens_per_sample,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        banned=banned,
        stop=stop,
        generator=generator,
    )  # (1, n), n <= max_new_words
    return write_continuation(prompt, decode_words(dictionary, until_stop(new[0].tolist(), stop)))


def generate_segment_words(
    cfg: DictConfig, prompt: str, datamodule: WordSegmentsDataModule, net: torch.nn.Module
) -> dict:
    """``mode=sample`` for a word-level Transformer-XL or Group-Transformer: the prompt's
    whitespace words (after ``</s>``) read in segments of the training ``tgt_len`` with the
    memories carried, then up to ``max_new_words`` sampled words, each fed alone with the memories
    of everything before it."""
    if cfg.mode != "sample":
        raise UsageError(
            f"word language models support mode=sample only (stop_at_eos=true ends the sentence), "
            f"got mode={cfg.mode}"
        )
    load_vocabulary(cfg, datamodule)
    dictionary = datamodule.dictionary
    words = prompt.split()
    unknown = [w for w in words if dictionary.index(w) == dictionary.index(SPECIALS[-1])]
    if unknown:
        log.warning("words outside the vocabulary read as <unk>: %s", ", ".join(unknown[:10]))
    device = torch.device(cfg.device)
    net = net.to(device).eval()
    tokens = torch.tensor(
        [[EOS_ID, *(dictionary.index(w) for w in words)]], device=device
    )  # (1, T)
    # never produce the specials but </s> (a line break), nor the dictionary's padding entries
    allowed = torch.tensor(
        [
            not (s in SPECIALS[:2] + SPECIALS[3:] or s.startswith("madeupword"))
            for s in dictionary.symbols
        ]
    )
    stop = None
    if cfg.stop_at_eos:
        stop = torch.zeros(len(allowed), dtype=torch.bool)
        stop[EOS_ID] = True
    generator = torch.Generator(device).manual_seed(cfg.seed)
    with torch.no_grad():
        new = sample(
            net,
            tokens,
            cfg.max_new_words,
            segment_len=datamodule.tgt_len,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            allowed=allowed,
            stop=stop,
            generator=generator,
        )  # (1, n), n <= max_new_words
    ids = until_stop(new[0].tolist(), EOS_ID if cfg.stop_at_eos else None)
    return write_continuation(prompt, decode_words(dictionary, ids))


def generate_stream_words(
    cfg: DictConfig, prompt: str, datamodule: AWDLMDataModule, net: torch.nn.Module
) -> dict:
    """``mode=sample`` for an AWD language model (PRU, LSTM): the prompt's words (after ``<eos>``,
    as every corpus line starts) read from zero state, then up to ``max_new_words`` sampled words,
    each fed alone with the recurrent state carried."""
    if cfg.mode != "sample":
        raise UsageError(
            f"word language models support mode=sample only (stop_at_eos=true ends the sentence), "
            f"got mode={cfg.mode}"
        )
    load_vocabulary(cfg, datamodule)
    vocabulary = datamodule.dictionary
    # the demo corpus is written in PTB style; its prompt is read the same way
    words = ptb_style(prompt) if isinstance(datamodule, PydocPTBDataModule) else prompt.split()
    unknown = [w for w in words if w not in vocabulary.indices]
    if unknown and vocabulary.unk_id is None:
        raise UsageError(
            f"words outside the vocabulary, which has no <unk>: {', '.join(unknown[:10])}"
        )
    if unknown:
        log.warning("words outside the vocabulary read as <unk>: %s", ", ".join(unknown[:10]))
    log.info("prompt read as %d words: %s", len(words), " ".join(words))
    device = torch.device(cfg.device)
    net = net.to(device).eval()
    eos = vocabulary.indices[EOS]
    tokens = torch.tensor([[eos, *map(vocabulary.index, words)]], device=device)  # (1, T)
    allowed = torch.ones(len(vocabulary), dtype=torch.bool)
    if vocabulary.unk_id is not None:
        allowed[vocabulary.unk_id] = False  # <unk> stands for any rare word: never printed
    stop = eos if cfg.stop_at_eos else None
    generator = torch.Generator(device).manual_seed(cfg.seed)
    new = sample_recurrent(
        net,
        tokens,
        cfg.max_new_words,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        allowed=allowed,
        stop=stop,
        generator=generator,
    )  # (1, n), n <= max_new_words
    return write_continuation(prompt, vocabulary.decode(until_stop(new[0].tolist(), stop)))
