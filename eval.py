"""Evaluate a checkpoint: ``python eval.py ckpt_path=/path/to.ckpt [overrides]``.

The network, data and task are rebuilt from the checkpoint's run record (the config it was trained
with); an override on the command line (``data.root=...``, ``split=val``) still wins and is
reported. Writes ``metrics.json`` (metrics, params, MACs, checkpoint) into the run directory.

With ``+dynamic_eval=true`` (a ``task=awd_lm`` checkpoint) the split is scored again
by dynamic evaluation (``dynamic_eval_options``), written as ``<split>/dynamic_loss`` and
``<split>/dynamic_ppl`` beside the plain metrics.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from src.build import check_config
from src.commands.eval import evaluate
from src.utils.errors import reported_in_one_line


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "eval")
        evaluate(cfg)


if __name__ == "__main__":
    main()
