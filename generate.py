"""Generate text with a language model: ``python generate.py ckpt_path=... prompt='...'``.

Character models (Transformer-XL, Group-Transformer; data pydoc_chars, enwik8, text8), word models
(DeLighT LM, Transformer LM; wikitext103, pydoc_words) and AWD word models (PRU, LSTM; ptb,
wikitext2, pydoc_ptb) are served; word models support ``mode=sample`` only. A word model reads the
prompt's whitespace-separated words after an end of sentence (as every corpus line starts; the
pydoc_ptb demo's words in its PTB style: lower case, numbers as N, punctuation dropped), adds up to
``max_new_words`` words joined by spaces, carrying the AWD models' recurrent state, and stops at
the end-of-sentence token unless ``stop_at_eos=false`` (then each end of sentence is a line break).

The datamodule, network and task are rebuilt from the checkpoint's run record (command-line
overrides still win) and its ``state_dict`` is loaded into the task; without ``ckpt_path`` the run
is refused unless ``allow_random=true``. The prompt is encoded with the datamodule's vocabulary (built or read from its cache
under ``data.root``) and read in segments of the training ``tgt_len``, carrying the memories.
Then, by ``mode``:

- ``sample`` (sentence completion): ``max_new_chars`` characters drawn one at a time with
  ``temperature`` and ``top_k``; stdout gets the prompt followed by the continuation;
- ``words`` (word completion, Group-Transformer Table 4): beam search ranks whole-word
  continuations of the prompt's last (partial) word by log-probability; stdout gets a table of
  the ``num_words`` best words (the partial word plus its continuation) and their log-probabilities.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from src.build import check_config
from src.commands.generate import generate
from src.utils.errors import reported_in_one_line


@hydra.main(version_base="1.3", config_path="conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "generate")
        generate(cfg)


if __name__ == "__main__":
    main()
